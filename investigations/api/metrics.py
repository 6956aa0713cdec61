"""Verdicts for Prometheus and Grafana.

- GET /api/v1/verdict-metrics/ — Prometheus text exposition, for alerting on verdicts:
  `proof_open_incidents{family,category}`, `proof_open_incident_gpu_hours_lost{family,category}`
  and one `proof_open_incident_info{incident,family,category,job,node,gpu,url} 1` per open
  incident (the most recently seen 1,000), whose `url` is the verdict page an alert links to.
  Scrape it with the API token as a bearer credential (packaging/grafana/README.md).
- GET /api/v1/grafana-annotations/?from=<ms>&to=<ms>[&family=][&category=] — incidents over
  that range as Grafana annotations (`time`, `timeEnd` in epoch ms, `title`, `text`, `tags`,
  `url`), for a JSON datasource's annotation query (`${__from}`, `${__to}`).

Operator roles only (a customer principal is 403): like /fleet-health/, the fleet's verdicts
span every customer. Another operator's incidents are never counted or listed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from rest_framework import serializers, viewsets
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from investigations import selectors_metrics
from investigations.models import Incident
from tenants.api.base import TenantScopedMixin
from tenants.api.permissions import IsOperatorPrincipal
from tenants.api.schema import ProofAutoSchema

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
MAX_RANGE_MS = 366 * 24 * 3600 * 1000


class PrometheusTextRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Any = None,
    ) -> bytes:
        return data if isinstance(data, bytes) else str(data).encode()


def verdict_url(public_id: str) -> str:
    return f"{settings.PROOF_PUBLIC_URL.rstrip('/')}/incidents/{public_id}/"


class _VerdictCollector:
    """The families of one scrape, from the selectors (a prometheus_client collector)."""

    def __init__(self, counts: list[selectors_metrics.FamilyCount], rows: list[Any]) -> None:
        self.counts = counts
        self.rows = rows

    def collect(self) -> list[Metric]:
        opened = GaugeMetricFamily(
            "proof_open_incidents", "Open incidents", labels=["family", "category"]
        )
        lost = GaugeMetricFamily(
            "proof_open_incident_gpu_hours_lost",
            "GPU-hours lost of the open incidents",
            labels=["family", "category"],
        )
        for c in self.counts:
            opened.add_metric([c.family, c.category], c.open)
            lost.add_metric([c.family, c.category], c.gpu_hours_lost)
        info = GaugeMetricFamily(
            "proof_open_incident_info",
            "One per open incident (the most recently seen 1000), linking to its verdict page",
            labels=["incident", "family", "category", "job", "node", "gpu", "url"],
        )
        for r in self.rows:
            info.add_metric(
                [r.public_id, r.family, r.category, r.job, r.node, r.gpu, verdict_url(r.public_id)],
                1,
            )
        return [opened, lost, info]


class _OneObjectSchema(ProofAutoSchema):
    def _is_list_view(self, serializer: Any = None) -> bool:
        return False


class VerdictMetricsViewSet(TenantScopedMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    schema = _OneObjectSchema()
    model = Incident
    route = "verdict-metrics"
    permission_classes = [IsOperatorPrincipal]
    renderer_classes = [PrometheusTextRenderer]
    pagination_class = None

    @extend_schema(
        summary="Verdicts as Prometheus metrics",
        description=(
            "Prometheus text exposition (version 0.0.4) of the open incidents: counts and "
            "GPU-hours lost by family and category, and one info series per open incident "
            "(the most recently seen 1,000) with the verdict page's URL. Operator roles only."
        ),
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR,
                examples=[
                    OpenApiExample(
                        "One open incident",
                        value=(
                            "# HELP proof_open_incidents Open incidents\n"
                            "# TYPE proof_open_incidents gauge\n"
                            'proof_open_incidents{category="job",family="slow_rank"} 1.0\n'
                        ),
                    )
                ],
            )
        },
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        collector = _VerdictCollector(
            selectors_metrics.open_counts(self.principal),
            selectors_metrics.open_incidents(self.principal),
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        return Response(generate_latest(registry), content_type=PROMETHEUS_TEXT)


class AnnotationQuery(serializers.Serializer[Any]):
    """Grafana's ${__from} / ${__to} (epoch milliseconds) and optional filters. The fields are
    named `from` and `to`, as Grafana's URL variables read, hence get_fields."""

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {
            "from": serializers.IntegerField(min_value=0, max_value=2**53),
            "to": serializers.IntegerField(min_value=0, max_value=2**53),
            "family": serializers.CharField(required=False, max_length=64),
            "category": serializers.CharField(required=False, max_length=32),
            "limit": serializers.IntegerField(
                required=False,
                min_value=1,
                max_value=selectors_metrics.MAX_ANNOTATIONS,
                default=500,
            ),
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["to"] < attrs["from"]:
            raise serializers.ValidationError({"to": ["must not be before from"]})
        if attrs["to"] - attrs["from"] > MAX_RANGE_MS:
            raise serializers.ValidationError({"to": ["the range is at most 366 days"]})
        return attrs


_ANNOTATION_PARAMS = [
    OpenApiParameter(
        "from",
        OpenApiTypes.INT,
        required=True,
        description="epoch ms",
        examples=[OpenApiExample("1 Dec 2026 00:00 UTC", value=1796083200000)],
    ),
    OpenApiParameter(
        "to",
        OpenApiTypes.INT,
        required=True,
        description="epoch ms",
        examples=[OpenApiExample("8 Dec 2026 00:00 UTC", value=1796688000000)],
    ),
    OpenApiParameter("family", OpenApiTypes.STR, description="only this failure family"),
    OpenApiParameter("category", OpenApiTypes.STR, description="only this category"),
    OpenApiParameter("limit", OpenApiTypes.INT, description="at most this many (500; up to 1000)"),
]


class AnnotationSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    time = serializers.IntegerField()
    timeEnd = serializers.IntegerField()  # Grafana's field name
    title = serializers.CharField()
    text = serializers.CharField()
    tags = serializers.ListField(child=serializers.CharField())
    url = serializers.CharField()


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


class GrafanaAnnotationsViewSet(TenantScopedMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    model = Incident
    route = "grafana-annotations"
    permission_classes = [IsOperatorPrincipal]
    renderer_classes = [JSONRenderer]
    serializer_class = AnnotationSerializer
    pagination_class = None

    @extend_schema(
        summary="Incidents as Grafana annotations",
        description=(
            "The incidents whose span (first seen to resolved, or last seen while open) meets "
            "[from, to] (epoch ms, Grafana's ${__from} and ${__to}), most recent first, as "
            "annotations: time and timeEnd in ms, title, text (state, job, node, GPU), tags "
            "(family, category, state) and the verdict page's url. At most `limit` (500, up "
            "to 1,000). Operator roles only."
        ),
        parameters=_ANNOTATION_PARAMS,
        responses=AnnotationSerializer(many=True),
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        params = request.query_params
        raw = {k: params[k] for k in ("from", "to", "family", "category", "limit") if k in params}
        query = self.validated(AnnotationQuery, raw)
        rows = selectors_metrics.incidents_between(
            self.principal,
            datetime.fromtimestamp(query["from"] / 1000, tz=UTC),
            datetime.fromtimestamp(query["to"] / 1000, tz=UTC),
            family=query.get("family"),
            category=query.get("category"),
            limit=query["limit"],
        )
        out = []
        for r in rows:
            end = r.resolved_at or r.last_seen
            where = ", ".join(
                f"{k} {v}" for k, v in (("job", r.job), ("node", r.node), ("GPU", r.gpu)) if v
            )
            out.append(
                {
                    "id": r.public_id,
                    "time": _ms(r.first_seen),
                    "timeEnd": _ms(end),
                    "title": r.title or r.family,
                    "text": f"{r.state}: {r.family} ({r.category})"
                    + (f" — {where}" if where else ""),
                    "tags": [r.family, r.category, r.state],
                    "url": verdict_url(r.public_id),
                }
            )
        return Response(AnnotationSerializer(out, many=True).data)
