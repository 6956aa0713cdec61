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


class ShareLinkFilterSerializer(serializers.Serializer[dict[str, Any]]):
    incident = serializers.UUIDField(help_text="only this incident's links")


class ShareLinkOpenSerializer(serializers.ModelSerializer[ShareLinkOpen]):
    class Meta:
        model = ShareLinkOpen
        fields = ["opened_at", "address", "user_agent"]
        read_only_fields = fields


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
