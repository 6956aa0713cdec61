"""The one scoped base for every API view.

`TenantScopedViewSet.get_queryset` is final: it takes the subclass's `model`, applies
`for_tenant(principal)` and only then lets the subclass narrow it with `scope_queryset()`.
A subclass that defines get_queryset is refused at import time, so no endpoint can forget
the tenant filter. The view body runs inside `tenant_context()` for the principal's operator
(row-level security on PostgreSQL). Service errors become 400 (TenancyError) or 403
(NotAllowed) with the service's message.

Every answer leaves through `finalize_response`: an error body, whoever built it, is put in the
one error shape (tenants/api/errors.py); a successful GET gets a weak ETag over its rendered
body, and a 304 with no body when the request's If-None-Match names it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import transaction
from django.db.models import QuerySet
from django.utils.cache import patch_vary_headers
from django.utils.http import parse_etags
from rest_framework import status, viewsets
from rest_framework.exceptions import NotAuthenticated, PermissionDenied, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter
from rest_framework.serializers import Serializer

from tenants.access import Principal
from tenants.api.errors import error_body, is_error_body
from tenants.api.limits import bound_serializer, check_query_params
from tenants.api.permissions import principal_or_none
from tenants.context import activate_tenant_in_transaction
from tenants.models import TenantOwned
from tenants.services import NotAllowed, TenancyError

_ERROR_RENDERER = JSONRenderer()


def weak_etag(content: bytes) -> str:
    """A weak validator of a rendered body: equal bodies, equal tags (JSON rendering is
    deterministic for the same rows)."""
    return f'W/"{hashlib.sha256(content).hexdigest()[:32]}"'


def _etag_matches(if_none_match: str, etag: str) -> bool:
    # Weak comparison (RFC 9110 13.1.2): W/ is ignored on both sides.
    wanted = {tag.removeprefix("W/") for tag in parse_etags(if_none_match)}
    return "*" in wanted or etag.removeprefix("W/") in wanted


def with_conventions(request: Request, response: Response) -> Response:
    """The error shape on any 4xx/5xx body, the ETag (and 304) on a successful GET."""
    if response.status_code >= 400:
        if not is_error_body(response.data):
            response.data = error_body(response.status_code, response.data)
        # An error is JSON whatever the endpoint renders otherwise (a verdict as markdown):
        # the one shape clients parse, and what the schema documents.
        response.accepted_renderer = _ERROR_RENDERER
        response.accepted_media_type = _ERROR_RENDERER.media_type
    if request.method in ("GET", "HEAD") and response.status_code == 200:
        response.render()
        etag = weak_etag(response.content)
        # The body depends on who asks and in which format: caches must key on both.
        patch_vary_headers(response, ("Accept", "Authorization", "Cookie"))
        if _etag_matches(request.headers.get("If-None-Match", ""), etag):
            # No body (RFC 9110 15.4.5): the client's copy is current.
            not_modified = Response(
                status=status.HTTP_304_NOT_MODIFIED,
                headers={"ETag": etag, "Vary": response["Vary"]},
            )
            not_modified.accepted_renderer = response.accepted_renderer
            not_modified.accepted_media_type = response.accepted_media_type
            not_modified.renderer_context = response.renderer_context  # type: ignore[attr-defined]
            return not_modified
        response["ETag"] = etag
    return response


def request_principal(request: Request) -> Principal:
    principal = principal_or_none(request)
    if principal is None:
        raise NotAuthenticated(
            "Authenticate with a session or an API token (Authorization: Bearer <token>)."
        )
    return principal


if TYPE_CHECKING:
    # What the mixin is always combined with (below): mypy checks its methods against it.
    _ViewSetBase = viewsets.GenericViewSet[Any]
else:
    _ViewSetBase = object


class TenantScopedMixin(_ViewSetBase):
    model: ClassVar[type[TenantOwned]]
    # Where register_viewsets() puts the viewset on the API router (plural: "customers").
    route: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__ and cls.__name__ not in _BASES:
            raise TypeError(
                f"{cls.__qualname__} overrides get_queryset; override scope_queryset() instead "
                "so the tenant filter cannot be skipped"
            )

    @property
    def principal(self) -> Principal:
        return request_principal(self.request)

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):
            # drf-spectacular describing the view: no request, no principal, no rows.
            return self.model.objects.none()
        queryset = self.model.objects.for_tenant(self.principal)
        return self.scope_queryset(queryset)

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset

    def validated(
        self, shape_class: type[Serializer[Any]], data: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        """`data` (the request body by default) checked against a shape; 400 if it does not
        fit."""
        if data is None:
            data = self.request.data
        shape = shape_class(data=data, **kwargs)
        bound_serializer(shape, self.model)
        shape.is_valid(raise_exception=True)
        validated: dict[str, Any] = shape.validated_data
        return validated

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        serializer = super().get_serializer(*args, **kwargs)
        if "data" in kwargs:
            bound_serializer(serializer, self.model)
        return serializer

    def created(self, row: Any, **extra: Any) -> Response:
        """201 with the new row in the viewset's read shape (and `extra`: a token's plaintext)."""
        body = {**self.get_serializer_class()(row).data, **extra}
        return Response(body, status=status.HTTP_201_CREATED)

    def create_with(
        self, service: Callable[..., Any], shape_class: type[Serializer[Any]]
    ) -> Response:
        """A thin create: the body checked against `shape_class`, then `service(principal,
        **fields)` makes the row."""
        return self.created(service(self.principal, **self.validated(shape_class)))

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        principal = request_principal(request)
        # Before any view reads a filter: text PostgreSQL cannot hold is refused by name.
        check_query_params(request.query_params)
        if request.method in ("POST", "PUT", "PATCH"):
            # Parse the body now, even where the view never reads it: a bad body (nested too
            # deep, not an object, unstorable text) is refused alike by every write endpoint.
            request.data  # noqa: B018 - the parse is the point
        # Inside dispatch's transaction: the token's operator is the tenant from here on.
        activate_tenant_in_transaction(principal.operator_id)

    def handle_exception(self, exc: Exception) -> Response:
        # Services say what was wrong in their own terms; the API answers 403 for refusals
        # and 400 for bad input, with the service's message.
        if isinstance(exc, NotAllowed):
            exc = PermissionDenied(str(exc))
        elif isinstance(exc, TenancyError):
            exc = ValidationError({"detail": str(exc)})
        return super().handle_exception(exc)

    def finalize_response(
        self, request: Request, response: Any, *args: Any, **kwargs: Any
    ) -> Response:
        finalized = super().finalize_response(request, response, *args, **kwargs)
        if not isinstance(finalized, Response):
            return finalized
        return with_conventions(request, finalized)


_BASES = {"TenantScopedMixin", "TenantScopedViewSet", "TenantScopedReadOnlyViewSet"}


class TenantScopedViewSet(TenantScopedMixin, viewsets.ModelViewSet[Any]):
    pass


class TenantScopedReadOnlyViewSet(TenantScopedMixin, viewsets.ReadOnlyModelViewSet[Any]):
    pass


def register_viewsets(router: BaseRouter, *viewsets: type[TenantScopedMixin]) -> None:
    """Register each viewset under its own `route`, named by the route in the singular
    ("customers" → "customer-list", "customer-detail")."""
    for viewset in viewsets:
        basename = viewset.route.removesuffix("s")
        router.register(viewset.route, viewset, basename=basename)
