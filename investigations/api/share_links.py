"""Share links: `POST /share-links/` makes one (the token is in the returned `url`, shown
once), `GET /share-links/` lists them (`?incident=<public_id>`: one incident's), `DELETE /share-links/<id>/` revokes one at once (the
id is 404 from then on), `GET /share-links/<id>/opens/` is its open log.

Operator roles see and manage every link of theirs; customer admins the links to their own
jobs' incidents; customer viewers and read-only tokens are refused (403). Another tenant's
link or incident is 404 (docs/notifications.md).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from investigations import services
from investigations.models import ShareLink, ShareLinkOpen
from tenants.access import Principal
from tenants.api.base import TenantScopedViewSet
from tenants.api.permissions import HasPrincipal
from tenants.roles import Role


class CanManageShareLinks(HasPrincipal):
    message = "Only operator roles and customer admins may use share links."

    def allows(self, principal: Principal) -> bool:
        return principal.role != Role.CUSTOMER_VIEWER


class ShareLinkSerializer(serializers.ModelSerializer[ShareLink]):
    incident = serializers.UUIDField(source="incident.public_id", read_only=True)
    revoked = serializers.SerializerMethodField()
    opens = serializers.IntegerField(source="open_count", read_only=True, default=0)

    class Meta:
        model = ShareLink
        fields = ["id", "incident", "created_at", "expires_at", "revoked", "opens"]
        read_only_fields = fields

    def get_revoked(self, link: ShareLink) -> bool:
        return link.revoked_at is not None


class ShareLinkWriteSerializer(serializers.Serializer[dict[str, Any]]):
    incident = serializers.UUIDField(help_text="the incident's public id")
    expires_in_s = serializers.IntegerField(
        min_value=services.SHARE_MIN_EXPIRES_S, max_value=services.SHARE_MAX_EXPIRES_S
    )


class ShareLinkCreatedSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.IntegerField()
    url = serializers.URLField(help_text="the link to send; its token is shown this once")
    expires_at = serializers.DateTimeField()


class ShareLinkFilterSerializer(serializers.Serializer[dict[str, Any]]):
    incident = serializers.UUIDField(help_text="only this incident's links")


class ShareLinkOpenSerializer(serializers.ModelSerializer[ShareLinkOpen]):
    class Meta:
        model = ShareLinkOpen
        fields = ["opened_at", "address", "user_agent"]
        read_only_fields = fields


_AT = "2026-12-02T08:10:00Z"
_INCIDENT = "0b5e1d2a-3c4f-4a6b-9d8e-7f6a5b4c3d2e"
LINK = OpenApiExample(
    "share link",
    value={
        "id": 7,
        "incident": _INCIDENT,
        "created_at": _AT,
        "expires_at": "2026-12-02T09:10:00Z",
        "revoked": False,
        "opens": 2,
    },
    response_only=True,
)
LINK_NEW = OpenApiExample(
    "an hour's link", value={"incident": _INCIDENT, "expires_in_s": 3600}, request_only=True
)
LINK_CREATED = OpenApiExample(
    "created (the URL, once)",
    value={
        "id": 7,
        "url": "https://proof.example.com/share/prfs_Zq3.../",
        "expires_at": "2026-12-02T09:10:00Z",
    },
    response_only=True,
)
OPEN = OpenApiExample(
    "open",
    value={"opened_at": _AT, "address": "203.0.113.7", "user_agent": "Mozilla/5.0"},
    response_only=True,
)


@extend_schema_view(
    list=extend_schema(
        summary="List share links (operator roles, customer admins)",
        parameters=[
            OpenApiParameter(
                "incident", OpenApiTypes.UUID, description="only this incident's links"
            )
        ],
        examples=[LINK],
    ),
    retrieve=extend_schema(summary="One share link", examples=[LINK]),
    create=extend_schema(
        summary="Share an incident's verdict page for a while",
        request=ShareLinkWriteSerializer,
        responses={201: ShareLinkCreatedSerializer},
        examples=[LINK_NEW, LINK_CREATED],
    ),
    destroy=extend_schema(summary="Revoke a share link at once"),
    opens=extend_schema(
        summary="Each open of the link, newest first",
        responses={200: ShareLinkOpenSerializer(many=True)},
        examples=[OPEN],
    ),
)
class ShareLinkViewSet(TenantScopedViewSet):
    model = ShareLink
    route = "share-links"
    serializer_class = ShareLinkSerializer
    permission_classes = [CanManageShareLinks]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # A revoked link is gone for the API too.
        scoped: QuerySet[Any] = (
            queryset.filter(revoked_at__isnull=True)
            .select_related("incident")
            .annotate(open_count=Count("opens"))
        )
        if self.action == "list" and "incident" in self.request.query_params:
            query = self.validated(ShareLinkFilterSerializer, self.request.query_params)
            scoped = scoped.filter(incident__public_id=query["incident"])
        return scoped

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        fields = self.validated(ShareLinkWriteSerializer)
        link, token = services.do_create_share_link(self.principal, **fields)
        url = request.build_absolute_uri(reverse("share", args=[token]))
        return Response(
            {"id": link.pk, "url": url, "expires_at": link.expires_at},
            status=status.HTTP_201_CREATED,
        )

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.do_revoke_share_link(self.principal, int(self.get_object().pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @action(detail=True, methods=["get"])
    def opens(self, request: Request, pk: str | None = None) -> Response:
        link = self.get_object()
        rows = ShareLinkOpen.objects.for_tenant(self.principal).filter(link=link)
        page = self.paginate_queryset(rows)
        if page is not None:
            return self.get_paginated_response(ShareLinkOpenSerializer(page, many=True).data)
        return Response(ShareLinkOpenSerializer(rows, many=True).data)
