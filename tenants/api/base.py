"""The one scoped base for every API view.

`TenantScopedViewSet.get_queryset` is final: it takes the subclass's `model`, applies
`for_tenant(principal)` and only then lets the subclass narrow it with `scope_queryset()`.
A subclass that defines get_queryset is refused at import time, so no endpoint can forget
the tenant filter. The view body runs inside `tenant_context()` for the principal's operator
(row-level security on PostgreSQL). Service errors become 400 (TenancyError) or 403
(NotAllowed) with the service's message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import transaction
from django.db.models import QuerySet
from rest_framework import status, viewsets
from rest_framework.exceptions import NotAuthenticated, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter
from rest_framework.serializers import Serializer

from tenants.access import Principal
from tenants.api.permissions import principal_or_none
from tenants.context import activate_tenant_in_transaction
from tenants.models import TenantOwned
from tenants.services import NotAllowed, TenancyError


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
        shape.is_valid(raise_exception=True)
        validated: dict[str, Any] = shape.validated_data
        return validated

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
