"""/api/v1/forecasts/ and /api/v1/drain-plan/: the days-ahead forecast per component and the
drain advice (docs/fleet-health.md). Operator roles only; a customer is refused, another
operator's rows are never listed."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from engine import forecast as fc
from investigations import forecast_services
from investigations.models import ComponentForecast
from tenants.api.base import TenantScopedMixin, TenantScopedReadOnlyViewSet
from tenants.api.permissions import IsOperatorPrincipal
from tenants.api.schema import ProofAutoSchema

_FORECAST_EXAMPLE = {
    "id": 1042,
    "kind": "gpu",
    "key": "GPU-5f3c…",
    "node": "gpu-node-07",
    "gpu": "GPU-5f3c…",
    "level": "drain",
    "risk": {"1d": 0.2, "3d": 0.63, "7d": 0.98},
    "ttf_hours": 58.0,
    "summary": "single-bit ECC errors 1623/day (3 days ago 652, doubling every 1.5 d) heading "
    "for XID 48 (double-bit ECC) / XID 92 (high single-bit rate) at ~5,000 SBE/day",
    "evidence": [
        {
            "signal": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "label": "single-bit ECC errors",
            "now": 1623.0,
            "three_days_ago": 652.0,
            "unit": "/day",
            "growth_per_day": 0.47,
            "doubling_days": 1.47,
            "days_rising": 8,
            "threshold": 5000.0,
            "heading_for": "XID 48 (double-bit ECC) / XID 92 (high single-bit rate)",
            "ttf_days": 2.4,
        }
    ],
    "daily": {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": [2.0, 3.0, 40.0, 90.0, 200.0]},
    "evaluated_at": "2026-12-03T12:00:00Z",
    "level_since": "2026-12-02T06:00:00Z",
    "cleared_at": None,
}


class ForecastQuery(serializers.Serializer[dict[str, Any]]):
    kind = serializers.ChoiceField(choices=list(fc.KINDS), required=False)
    level = serializers.ChoiceField(choices=list(fc.LEVELS), required=False)
    node = serializers.CharField(required=False, max_length=255)
    cleared = serializers.BooleanField(
        required=False, default=False, help_text="include components back at ok"
    )


class ForecastSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.IntegerField(help_text="The forecast's id: GET /api/v1/forecasts/<id>/")
    kind = serializers.CharField()
    key = serializers.CharField()
    node = serializers.CharField()
    gpu = serializers.CharField()
    level = serializers.CharField()
    risk = serializers.DictField(child=serializers.FloatField())
    ttf_hours = serializers.FloatField(allow_null=True)
    summary = serializers.CharField()
    evidence = serializers.ListField(child=serializers.DictField())
    daily = serializers.DictField()
    evaluated_at = serializers.DateTimeField()
    level_since = serializers.DateTimeField()
    cleared_at = serializers.DateTimeField(allow_null=True)


def forecast_fields(row: ComponentForecast) -> dict[str, Any]:
    result = row.result or {}
    return {
        "id": row.pk,
        "kind": row.kind,
        "key": row.key,
        "node": row.node,
        "gpu": row.gpu,
        "level": row.level,
        "risk": {"1d": row.risk_1d, "3d": row.risk_3d, "7d": row.risk_7d},
        "ttf_hours": row.ttf_hours,
        "summary": row.summary,
        "evidence": list(result.get("evidence") or []) if row.level != "ok" else [],
        "daily": dict(result.get("daily") or {}),
        "evaluated_at": row.evaluated_at,
        "level_since": row.level_since,
        "cleared_at": row.cleared_at,
    }


@extend_schema_view(
    list=extend_schema(
        summary="Component forecasts",
        description=(
            "The days-ahead forecast of every flagged GPU, PCIe link, NVLink and InfiniBand "
            "port: risk of failure within 1, 3 and 7 days, estimated time to failure, each "
            "sign's value now and three days ago, its growth and the threshold it heads for, and "
            "the daily series behind it. Cursor-paged, most at risk first; `cleared=true` adds "
            "components that recovered. Operator roles only."
        ),
        parameters=[ForecastQuery],
        examples=[OpenApiExample("A GPU to drain", value=[_FORECAST_EXAMPLE], response_only=True)],
    ),
)
class ForecastViewSet(TenantScopedReadOnlyViewSet):
    model = ComponentForecast
    route = "forecasts"
    serializer_class = ForecastSerializer
    permission_classes = [IsOperatorPrincipal]
    cursor_ordering = ("-risk_7d", "kind", "key")
    http_method_names = ["get", "head", "options"]

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        query = self.validated(ForecastQuery, self.request.query_params.dict())
        if not query.get("cleared"):
            queryset = queryset.exclude(level="ok")
        for name in ("kind", "level", "node"):
            if query.get(name):
                queryset = queryset.filter(**{name: query[name]})
        return queryset

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = list(self.paginate_queryset(self.get_queryset()) or [])
        return self.get_paginated_response(
            ForecastSerializer([forecast_fields(r) for r in page], many=True).data  # type: ignore[arg-type]
        )

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(ForecastSerializer(forecast_fields(self.get_object())).data)


class DrainGroupSerializer(serializers.Serializer[dict[str, Any]]):
    nodes = serializers.ListField(child=serializers.CharField())
    components = serializers.ListField(child=serializers.CharField())
    drain_in_hours = serializers.FloatField()
    jobs = serializers.ListField(child=serializers.CharField())
    reason = serializers.CharField()
    wait_cost_gpu_hours = serializers.FloatField()
    after_jobs_end = serializers.BooleanField()
    node_ttf_hours = serializers.DictField()


class DrainPlanSerializer(serializers.Serializer[dict[str, Any]]):
    groups = DrainGroupSerializer(many=True)


class _OneObjectSchema(ProofAutoSchema):
    def _is_list_view(self, serializer: Any = None) -> bool:
        return False


class DrainPlanViewSet(TenantScopedMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    schema = _OneObjectSchema()
    model = ComponentForecast
    route = "drain-plan"
    permission_classes = [IsOperatorPrincipal]
    serializer_class = DrainPlanSerializer
    pagination_class = None

    @extend_schema(
        summary="Drain plan",
        description=(
            "Which nodes to drain and when: every node with a component at drain or urgent, "
            "grouped with the other flagged nodes of each running multi-node job so that job "
            "is interrupted once, the hours until the group must be out (12 h before its "
            "earliest estimated failure, or when its jobs end if sooner), and the expected "
            "GPU-hours lost by waiting one more day. Operator roles only."
        ),
        responses=DrainPlanSerializer,
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        groups = forecast_services.drain_plan(self.principal.operator_id)
        return Response(DrainPlanSerializer({"groups": [asdict(g) for g in groups]}).data)
