"""GET /api/v1/audit-log/: who changed what in the operator's account (tenants/audit.py),
newest first, cursor-paginated; operator admins only.

Filters: ?action= (exact, e.g. incident.resolve; or a prefix ending in ".": `incident.`),
?actor= (exact: a username or api-token:<prefix>), ?since= and ?until= (ISO 8601 date-times,
UTC when without an offset; since inclusive, until exclusive). A bad value is a 400 naming the
parameter.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import ValidationError

from tenants.api.base import TenantScopedMixin
from tenants.api.permissions import IsOperatorAdminPrincipal
from tenants.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    actor = serializers.CharField(
        read_only=True, help_text="a username, api-token:<prefix>, or system"
    )
    customer = serializers.IntegerField(
        source="customer_id", read_only=True, allow_null=True, help_text="the customer concerned"
    )

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "action", "target_type", "target_id", "customer", "detail"]
        read_only_fields = fields


def _moment(params: Any, name: str) -> datetime | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        moment = parse_datetime(str(raw))
    except ValueError:
        moment = None
    if moment is None:
        raise ValidationError(
            {name: [f"not an ISO 8601 date-time: {raw!r} (e.g. 2026-12-01T08:00:00Z)"]}
        )
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


_EXAMPLE = {
    "id": 981,
    "at": "2026-12-02T09:51:40Z",
    "actor": "api-token:prf_Hk3s9aQe",
    "action": "incident.ticket_linked",
    "target_type": "incident",
    "target_id": "3f2c1d9e-8a47-4b1e-9c55-0d6e2a7b4f10",
    "customer": 4,
    "detail": {"system": "zendesk", "ticket_id": "48812", "url": ""},
}


class AuditLogViewSet(TenantScopedMixin, mixins.ListModelMixin, viewsets.GenericViewSet[Any]):
    model = AuditEvent
    route = "audit-log"
    serializer_class = AuditEventSerializer
    permission_classes = [IsOperatorAdminPrincipal]

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        params = self.request.query_params
        action = params.get("action")
        if action:
            queryset = (
                queryset.filter(action__startswith=action)
                if action.endswith(".")
                else queryset.filter(action=action)
            )
        if params.get("actor"):
            queryset = queryset.filter(actor=params["actor"])
        since, until = _moment(params, "since"), _moment(params, "until")
        if since is not None and until is not None and until <= since:
            raise ValidationError({"until": ["must be after since"]})
        if since is not None:
            queryset = queryset.filter(at__gte=since)
        if until is not None:
            queryset = queryset.filter(at__lt=until)
        return queryset.order_by("-at", "-id")

    @extend_schema(
        summary="The audit log, newest first (operator admins)",
        parameters=[
            OpenApiParameter(
                "action", str, description="an action (incident.resolve) or a prefix (incident.)"
            ),
            OpenApiParameter("actor", str, description="a username or api-token:<prefix>"),
            OpenApiParameter("since", str, description="ISO 8601 date-time, inclusive"),
            OpenApiParameter("until", str, description="ISO 8601 date-time, exclusive"),
        ],
        examples=[OpenApiExample("A ticket linked by a token", _EXAMPLE, response_only=True)],
    )
    def list(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().list(request, *args, **kwargs)
