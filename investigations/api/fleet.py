"""GET /api/v1/nodes/, /nodes/<hostname>/, /gpus/, /gpus/<uuid>/ and /fleet-health/: the
operator's hardware — whether each node reports, each GPU's health and the job holding it now,
and the GPUs to drain ranked by urgency (what the console's /fleet/ and /health/ show).

Operator roles only; a customer principal is refused (403) on every one of them. Decided so:
a node's or GPU's state, its health and the job holding it now are about the operator's
hardware and about whichever customers' jobs run on it, so none of it is a customer's to read.
What a customer may know of the hardware is what its own jobs ran on, and the job resource
says that (/api/v1/jobs/<job_id>/: its ranks' nodes and GPUs, their UUIDs, indexes and
models). Nodes and GPUs are named by hostname and NVML UUID, never a database key; another
operator's are 404 and absent from lists.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from ingest.models import Gpu, Node
from investigations import selectors_fleet, selectors_health
from investigations.api.fleet_serializers import (
    FleetHealthQuery,
    FleetHealthSerializer,
    GpuListQuery,
    GpuSerializer,
    NodeListQuery,
    NodeSerializer,
)
from investigations.models import Incident
from tenants.api.base import TenantScopedMixin, TenantScopedReadOnlyViewSet
from tenants.api.permissions import IsOperatorPrincipal
from tenants.api.schema import ProofAutoSchema

_NODE_EXAMPLE = {
    "hostname": "gpu-node-01",
    "state": "reporting",
    "last_seen": "2026-12-02T11:00:00Z",
    "registered_at": "2026-11-20T08:00:00Z",
    "agent_version": "0.9.0",
    "gpus": [{"uuid": "GPU-5f3c…", "index": 0, "model": "NVIDIA H100 80GB HBM3"}],
}
_GPU_EXAMPLE = {
    "uuid": "GPU-5f3c…",
    "index": 0,
    "model": "NVIDIA H100 80GB HBM3",
    "memory_mib": 81559,
    "driver_version": "570.86.15",
    "cuda_version": "12.8",
    "node": "gpu-node-01",
    "last_seen": "2026-12-02T11:00:00Z",
    "health": "degrading",
    "incidents": ["gpu_degrading"],
    "current_job": {"job_id": "4471023", "customer": "Acme ML"},
}
_HEALTH_EXAMPLE = {
    "summary": {"gpus": 1, "failing": 0, "degrading": 1, "nodes": 1},
    "gpus": [
        {
            "rank": 1,
            "gpu": "GPU-5f3c…",
            "node": "gpu-node-01",
            "index": 0,
            "model": "NVIDIA H100 80GB HBM3",
            "tier": 3,
            "action": "Schedule diagnostics",
            "why": "Two signs of degradation: …",
            "confidence": 0.8,
            "last_seen": "2026-12-02T11:00:00Z",
            "running_job": "4471023",
            "running_customer": "Acme ML",
            "incidents": [
                {
                    "id": "6f1c2d9e-8a47-4f0e-9d55-3f8f0f3b2a10",
                    "family": "gpu_degrading",
                    "title": "GPU-5f3c… is degrading",
                    "confidence": 0.8,
                    "first_seen": "2026-12-01T11:00:00Z",
                    "last_seen": "2026-12-02T11:00:00Z",
                    "recommendation": "Drain the GPU and run dcgmi diag -r 3.",
                    "job": None,
                    "signs": [
                        {
                            "signal": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                            "observed": 412,
                            "baseline": 0,
                            "note": "correctable ECC errors rising",
                        }
                    ],
                }
            ],
            "trends": [
                {
                    "signal": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                    "label": "ECC_SBE_VOL_TOTAL",
                    "unit": "count",
                    "first": 10.0,
                    "last": 412.0,
                    "increase": 402.0,
                    "last_day": 380.0,
                    "t": [1764662400.0, 1764666000.0],
                    "values": [10.0, 412.0],
                }
            ],
        }
    ],
    "page": 1,
    "pages": 1,
    "days": 3,
}


@extend_schema_view(
    list=extend_schema(
        summary="Nodes",
        description=(
            "The operator's nodes by hostname, cursor-paged, each with whether its agent "
            "reports (heard from in the last 10 minutes), when it was last seen, its agent's "
            "version and its GPUs. Operator roles only."
        ),
        parameters=[NodeListQuery],
        examples=[OpenApiExample("A page of nodes", value=[_NODE_EXAMPLE], response_only=True)],
    ),
    retrieve=extend_schema(
        summary="One node",
        description="A node by hostname. Operator roles only; another operator's is a 404.",
        examples=[OpenApiExample("A node", value=_NODE_EXAMPLE, response_only=True)],
    ),
)
class NodeViewSet(TenantScopedReadOnlyViewSet):
    model = Node
    route = "nodes"
    serializer_class = NodeSerializer
    permission_classes = [IsOperatorPrincipal]
    lookup_field = "hostname"
    lookup_value_regex = r"[^/\x00]+"  # no NUL: PostgreSQL refuses it in a query
    cursor_ordering = ("hostname",)

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        self._cutoff = selectors_fleet.reporting_cutoff()
        if self.action == "list":
            query = self.validated(NodeListQuery, self.request.query_params.dict())
            queryset = selectors_fleet.filter_nodes(
                queryset, state=query.get("state"), model=query.get("model"), cutoff=self._cutoff
            )
        return selectors_fleet.nodes_with_gpus(queryset, self.principal)

    def _fields(self, node: Node) -> dict[str, Any]:
        return {
            "hostname": node.hostname,
            "state": selectors_fleet.node_state(node, self._cutoff),
            "last_seen": node.last_seen_at,
            "registered_at": node.registered_at,
            "agent_version": node.agent_version,
            "gpus": [{"uuid": g.uuid, "index": g.index, "model": g.model} for g in node.gpus.all()],
        }

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset()) or []
        rows = [self._fields(node) for node in page]
        return self.get_paginated_response(NodeSerializer(rows, many=True).data)  # type: ignore[arg-type]

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(NodeSerializer(self._fields(self.get_object())).data)


@extend_schema_view(
    list=extend_schema(
        summary="GPUs",
        description=(
            "The operator's GPUs by UUID, cursor-paged: model, index, node, when its node was "
            "last seen, its health (from the open infrastructure incidents naming it or its "
            "node, and whether its node reports) and the job holding it now. Operator roles "
            "only."
        ),
        parameters=[GpuListQuery],
        examples=[OpenApiExample("A page of GPUs", value=[_GPU_EXAMPLE], response_only=True)],
    ),
    retrieve=extend_schema(
        summary="One GPU",
        description="A GPU by NVML UUID. Operator roles only; another operator's is a 404.",
        examples=[OpenApiExample("A GPU", value=_GPU_EXAMPLE, response_only=True)],
    ),
)
class GpuViewSet(TenantScopedReadOnlyViewSet):
    model = Gpu
    route = "gpus"
    serializer_class = GpuSerializer
    permission_classes = [IsOperatorPrincipal]
    lookup_field = "uuid"
    lookup_value_regex = r"[^/\x00]+"  # no NUL: PostgreSQL refuses it in a query
    cursor_ordering = ("uuid",)

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        self._cutoff = selectors_fleet.reporting_cutoff()
        if self.action == "list":
            query = self.validated(GpuListQuery, self.request.query_params.dict())
            queryset = selectors_fleet.filter_gpus(
                queryset,
                self.principal,
                node=query.get("node"),
                model=query.get("model"),
                health=query.get("health"),
                cutoff=self._cutoff,
            )
        return queryset.select_related("node")

    def _rows(self, gpus: list[Gpu]) -> list[dict[str, Any]]:
        states = selectors_fleet.gpu_states(self.principal, gpus, self._cutoff)
        rows = []
        for gpu in gpus:
            state = states[gpu.uuid]
            rows.append(
                {
                    "uuid": gpu.uuid,
                    "index": gpu.index,
                    "model": gpu.model,
                    "memory_mib": gpu.memory_mib,
                    "driver_version": gpu.driver_version,
                    "cuda_version": gpu.cuda_version,
                    "node": gpu.node.hostname,
                    "last_seen": gpu.node.last_seen_at,
                    "health": state.health,
                    "incidents": list(state.incidents),
                    "current_job": (
                        {"job_id": state.current_job, "customer": state.current_customer}
                        if state.current_job
                        else None
                    ),
                }
            )
        return rows

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = list(self.paginate_queryset(self.get_queryset()) or [])
        return self.get_paginated_response(GpuSerializer(self._rows(page), many=True).data)  # type: ignore[arg-type]

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        [row] = self._rows([self.get_object()])
        return Response(GpuSerializer(row).data)


def _trend_fields(trend: selectors_health.Trend) -> dict[str, Any]:
    series = trend.spec["series"][0] if trend.spec.get("series") else {"values": []}
    return {
        "signal": trend.key,
        "label": trend.label,
        "unit": trend.unit,
        "first": trend.first,
        "last": trend.last,
        "increase": trend.increase,
        "last_day": trend.last_day,
        "t": list(trend.spec.get("x") or []),
        "values": list(series["values"]),
    }


def _gpu_fields(gpu: selectors_health.AtRiskGpu) -> dict[str, Any]:
    return {
        "rank": gpu.rank,
        "gpu": gpu.gpu,
        "node": gpu.node,
        "index": gpu.index,
        "model": gpu.model,
        "tier": gpu.tier,
        "action": gpu.action,
        "why": gpu.why,
        "confidence": gpu.confidence,
        "last_seen": gpu.last_seen,
        "running_job": gpu.running_job,
        "running_customer": gpu.running_customer,
        "incidents": [
            {
                "id": i.public_id,
                "family": i.family,
                "title": i.title,
                "confidence": i.confidence,
                "first_seen": i.first_seen,
                "last_seen": i.last_seen,
                "recommendation": i.recommendation,
                "job": i.job,
                "signs": [asdict(s) for s in i.signs],
            }
            for i in gpu.incidents
        ],
        "trends": [_trend_fields(t) for t in gpu.trends],
    }


class _OneObjectSchema(ProofAutoSchema):
    """The fleet-health view answers one object (the ranking and its summary) at its list
    route: described as that object, not as an array of them."""

    def _is_list_view(self, serializer: Any = None) -> bool:
        return False


class FleetHealthViewSet(TenantScopedMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    schema = _OneObjectSchema()
    model = Incident
    route = "fleet-health"
    permission_classes = [IsOperatorPrincipal]
    serializer_class = FleetHealthSerializer
    pagination_class = None

    @extend_schema(
        summary="Fleet health",
        description=(
            "The GPUs degrading or failing, ranked by how urgently to drain them: tier 1 a "
            "hardware fault already failed a job on it (drain now), 2 three or more signs of "
            "degradation (drain at the next job boundary), 3 two signs (schedule diagnostics); "
            "within a tier a GPU a running job holds first. Each with its open incidents, the "
            "signs they cite and the hourly trend of each cited counter over `days`. Paged by "
            "`page` (25 GPUs). Operator roles only."
        ),
        parameters=[FleetHealthQuery],
        responses=FleetHealthSerializer,
        examples=[OpenApiExample("One degrading GPU", value=_HEALTH_EXAMPLE, response_only=True)],
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        query = self.validated(FleetHealthQuery, request.query_params.dict())
        data = selectors_health.health_page(self.principal, days=query["days"], page=query["page"])
        body = {
            "summary": asdict(data.summary),
            "gpus": [_gpu_fields(g) for g in data.gpus],
            "page": data.page,
            "pages": data.pages,
            "days": data.days,
        }
        return Response(FleetHealthSerializer(body).data)
