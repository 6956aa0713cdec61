"""Incidents (with their actions and history, and the series behind their evidence), verdicts
(the contract JSON, or markdown and text for a ticket), list prices per GPU model, the real
price (of everything, or over a period).

Customers see only their own jobs' incidents and verdicts and their own jobs' real price
(the models' customer_path); fleet-health incidents and list prices are operator-only. Who may
act on an incident: investigations/incident_actions.py (operators do everything; a customer's
admin comments and links tickets on its own jobs' incidents).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.http import Http404, QueryDict
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from ingest import selectors as ingest_selectors
from investigations import evidence_charts, incident_actions, selectors, services
from investigations.api.renderers import VerdictMarkdownRenderer, VerdictTextRenderer
from investigations.api.serializers import (
    AssignSerializer,
    CommentSerializer,
    EvidenceSeriesPageSerializer,
    GpuListPriceSerializer,
    GpuListPriceWriteSerializer,
    IncidentEventSerializer,
    IncidentSerializer,
    IncidentTicketSerializer,
    LinkTicketSerializer,
    RealPriceQuerySerializer,
    RealPriceSerializer,
    ResolveSerializer,
    VerdictRevisionSerializer,
)
from investigations.api.verdict_schema import openapi_verdict_schema
from investigations.models import GpuListPrice, Incident, IncidentEvent, IncidentTicket, JobGpuUsage
from tenants.access import get_object_for_tenant
from tenants.api.base import TenantScopedReadOnlyViewSet, TenantScopedViewSet
from tenants.api.errors import ErrorSerializer
from tenants.api.permissions import HasPrincipal, IsOperatorAdminPrincipal, IsOperatorPrincipal
from tenants.models import Customer

_FILTERS = ("state", "family", "category")

_ID = "3f2c1d9e-8a47-4b1e-9c55-0d6e2a7b4f10"
_INCIDENT_EXAMPLE = {
    "id": _ID,
    "state": "open",
    "family": "slow_rank",
    "category": "infrastructure",
    "confidence": 0.86,
    "title": "Rank 3 is 18% slower than the others (GPU 3 on node gpu-07)",
    "job": "slurm-48121",
    "subject_node": "gpu-07",
    "subject_gpu": "GPU-7c1e0a52-3d1f-4b7a-9f0e-2b6c4d8e1a33",
    "subject_rank": 3,
    "subject_mount": "",
    "first_seen": "2026-12-02T09:14:05Z",
    "last_seen": "2026-12-02T09:44:05Z",
    "resolved_at": None,
    "resolve_reason": "",
    "revision": 2,
    "acknowledged_at": "2026-12-02T09:50:12Z",
    "acknowledged_by": "ana",
    "assignee": "ana",
    "tickets": [
        {
            "system": "zendesk",
            "ticket_id": "48812",
            "url": "https://acme.zendesk.com/agent/tickets/48812",
            "linked_by": "api-token:prf_Hk3s9aQe",
            "linked_at": "2026-12-02T09:51:40Z",
        }
    ],
    "verdict": {"id": _ID, "family": "slow_rank", "category": "infrastructure", "...": "..."},
}
_INCIDENT_EXAMPLES = [OpenApiExample("An acknowledged, assigned incident", _INCIDENT_EXAMPLE)]
_EVENT_EXAMPLE = {
    "id": 412,
    "kind": "resolved",
    "actor": "ana",
    "at": "2026-12-02T10:20:00Z",
    "payload": {"reason": "node drained, GPU replaced", "note": "RMA 7781"},
}
_CONFLICT = OpenApiResponse(
    ErrorSerializer,
    description="The incident's state does not allow it (the message names the state).",
)


def _filter_incidents(queryset: QuerySet[Any], params: QueryDict) -> QuerySet[Any]:
    """The incident list filters, shared by the incident and the verdict views."""
    for name in _FILTERS:
        if params.get(name):
            queryset = queryset.filter(**{name: params[name]})
    if params.get("job"):
        queryset = queryset.filter(job__job_id=params["job"])
    return queryset.select_related("job")


_LIST_FILTERS = [
    OpenApiParameter("state", str, enum=["open", "resolved"]),
    OpenApiParameter("family", str, description="a detector family, e.g. slow_rank"),
    OpenApiParameter("category", str, enum=["job", "infrastructure"]),
    OpenApiParameter("job", str, description="a scheduler job id"),
]


class IncidentConflictError(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The incident's state does not allow this action."


@extend_schema_view(
    list=extend_schema(
        summary="Incidents, newest first",
        parameters=[
            *_LIST_FILTERS,
            OpenApiParameter(
                "assignee", str, description="an assignee's username, or none (unassigned)"
            ),
            OpenApiParameter("acknowledged", str, enum=["true", "false"]),
        ],
        examples=_INCIDENT_EXAMPLES,
    ),
    retrieve=extend_schema(summary="One incident", examples=_INCIDENT_EXAMPLES),
)
class IncidentViewSet(TenantScopedReadOnlyViewSet):
    """Incidents with their current verdict; ?state=open&family=…&category=…&job=<job id>
    &assignee=<username|none>&acknowledged=true|false.
    POST actions (write scope): acknowledge, resolve, reopen, assign, comments, link-ticket —
    each recorded in GET …/history/."""

    model = Incident
    route = "incidents"
    serializer_class = IncidentSerializer
    lookup_field = "public_id"

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        params = self.request.query_params
        tickets = Prefetch("tickets", queryset=IncidentTicket.objects.order_by("linked_at", "id"))
        queryset = _filter_incidents(queryset, params)
        assignee = params.get("assignee")
        if assignee:
            queryset = (
                queryset.filter(assignee__isnull=True)
                if assignee == "none"
                else queryset.filter(assignee__username=assignee)
            )
        acknowledged = params.get("acknowledged")
        if acknowledged:
            if acknowledged not in ("true", "false"):
                raise ValidationError({"acknowledged": [f"true or false, not {acknowledged!r}"]})
            queryset = queryset.filter(acknowledged_at__isnull=acknowledged == "false")
        return queryset.select_related("assignee").prefetch_related(tickets)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, incident_actions.IncidentConflict):
            exc = IncidentConflictError(str(exc))
        elif isinstance(exc, incident_actions.ActionInputError):
            exc = ValidationError({exc.field: [exc.problem]})
        return super().handle_exception(exc)

    def _key(self) -> str:
        """The incident's public id, once it is known to be one the principal may see: a
        foreign id is 404 before its body is even read (whatever the body, nothing about
        another tenant's incident is answered)."""
        self.get_object()
        return str(self.kwargs[self.lookup_field])

    def _incident(self, incident: Incident) -> Response:
        # Re-read through the list's queryset: the same shape (tickets included) as GET.
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(
        summary="The incident's verdict revisions",
        responses=VerdictRevisionSerializer(many=True),
        examples=[
            OpenApiExample(
                "Created, then updated",
                [
                    {
                        "number": 1,
                        "kind": "created",
                        "family": "slow_rank",
                        "category": "infrastructure",
                        "confidence": 0.71,
                        "created_at": "2026-12-02T09:15:00Z",
                        "verdict": {"id": _ID, "...": "..."},
                    }
                ],
                response_only=True,
            )
        ],
    )
    # All of them, as an array (an incident has a handful): not paginated.
    @action(detail=True, methods=["get"], pagination_class=None)
    def revisions(self, request: Request, public_id: str | None = None) -> Response:
        incident = self.get_object()
        rows = incident.revisions.order_by("number")
        return Response(VerdictRevisionSerializer(rows, many=True).data)

    @extend_schema(
        summary="Acknowledge (operator roles): someone is on it",
        request=None,
        responses={200: IncidentSerializer, 409: _CONFLICT},
        examples=_INCIDENT_EXAMPLES,
    )
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, public_id: str | None = None) -> Response:
        return self._incident(incident_actions.acknowledge(self.principal, self._key()))

    @extend_schema(
        summary="Resolve by hand (operator roles); announced as the pipeline's resolve is",
        request=ResolveSerializer,
        responses={200: IncidentSerializer, 409: _CONFLICT},
        examples=[
            OpenApiExample(
                "Resolve with a reason",
                {"reason": "node drained, GPU replaced", "note": "RMA 7781"},
                request_only=True,
            ),
            *_INCIDENT_EXAMPLES,
        ],
    )
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, public_id: str | None = None) -> Response:
        key = self._key()
        fields = self.validated(ResolveSerializer)
        return self._incident(incident_actions.resolve(self.principal, key, **fields))

    @extend_schema(
        summary="Reopen a resolved incident (operator roles)",
        request=None,
        responses={200: IncidentSerializer, 409: _CONFLICT},
        examples=_INCIDENT_EXAMPLES,
    )
    @action(detail=True, methods=["post"])
    def reopen(self, request: Request, public_id: str | None = None) -> Response:
        return self._incident(incident_actions.reopen(self.principal, self._key()))

    @extend_schema(
        summary="Assign to an operator member, or unassign with null (operator roles)",
        request=AssignSerializer,
        responses={200: IncidentSerializer},
        examples=[
            OpenApiExample("By username", {"user": "ana"}, request_only=True),
            OpenApiExample("By e-mail", {"user": "ana@gpucloud.example"}, request_only=True),
            OpenApiExample("Unassign", {"user": None}, request_only=True),
            *_INCIDENT_EXAMPLES,
        ],
    )
    @action(detail=True, methods=["post"])
    def assign(self, request: Request, public_id: str | None = None) -> Response:
        key = self._key()
        fields = self.validated(AssignSerializer)
        return self._incident(incident_actions.assign(self.principal, key, **fields))

    @extend_schema(
        summary="Comment (operator roles; a customer's admin on its own jobs' incidents)",
        request=CommentSerializer,
        responses={201: IncidentEventSerializer},
        examples=[
            OpenApiExample(
                "A comment",
                {"body": "Customer confirms the slowdown started after the 09:00 restart."},
                request_only=True,
            ),
            OpenApiExample(
                "The recorded event",
                {
                    "id": 413,
                    "kind": "commented",
                    "actor": "api-token:prf_Hk3s9aQe",
                    "at": "2026-12-02T09:52:10Z",
                    "payload": {"body": "Customer confirms the slowdown started after 09:00."},
                },
                response_only=True,
            ),
        ],
    )
    @action(detail=True, methods=["post"])
    def comments(self, request: Request, public_id: str | None = None) -> Response:
        key = self._key()
        fields = self.validated(CommentSerializer)
        event = incident_actions.comment(self.principal, key, **fields)
        return Response(IncidentEventSerializer(event).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Link an external ticket (operator roles; a customer's admin on its own)",
        description=(
            "Several tickets may be linked; linking the same system and ticket id again "
            "changes nothing and answers 200 with the existing link (201 when new)."
        ),
        request=LinkTicketSerializer,
        responses={201: IncidentTicketSerializer, 200: IncidentTicketSerializer},
        examples=[
            OpenApiExample(
                "A Zendesk ticket",
                {
                    "system": "zendesk",
                    "ticket_id": "48812",
                    "url": "https://acme.zendesk.com/agent/tickets/48812",
                },
                request_only=True,
            ),
            OpenApiExample(
                "The link",
                _INCIDENT_EXAMPLE["tickets"][0],  # type: ignore[index]
                response_only=True,
            ),
        ],
    )
    @action(detail=True, methods=["post"], url_path="link-ticket")
    def link_ticket(self, request: Request, public_id: str | None = None) -> Response:
        key = self._key()
        fields = self.validated(LinkTicketSerializer)
        ticket, created = incident_actions.link_ticket(self.principal, key, **fields)
        return Response(
            IncidentTicketSerializer(ticket).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(
        summary="What people did to the incident, oldest first (cursor-paginated)",
        responses=IncidentEventSerializer(many=True),
        examples=[OpenApiExample("A resolve", _EVENT_EXAMPLE, response_only=True)],
    )
    @action(detail=True, methods=["get"])
    def history(self, request: Request, public_id: str | None = None) -> Response:
        incident = self.get_object()
        events = IncidentEvent.objects.for_tenant(self.principal).filter(incident_id=incident.pk)
        page = self.paginate_queryset(events)
        rows = page if page is not None else list(events)
        data = IncidentEventSerializer(rows, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    @extend_schema(
        summary="The stored series around each evidence entry's interval",
        description=(
            "For each evidence entry of the current verdict, the series it cites over its "
            f"interval ± twice its length (at least {evidence_charts.MIN_PAD_S:.0f} s, at most "
            f"{evidence_charts.MAX_PAD_S:.0f} s), from the stored blocks: the same lines the "
            f"verdict page draws, at most {evidence_charts.MAX_POINTS} buckets each. A "
            "customer's series are its own job's only, clipped to the job's data."
        ),
        responses=EvidenceSeriesPageSerializer,
        examples=[
            OpenApiExample(
                "One GPU's tensor activity against the others' median",
                {
                    "incident": _ID,
                    "margin": {"factor": 2.0, "min_s": 60.0, "max_s": 300.0},
                    "items": [
                        {
                            "evidence": {"id": "e1", "signal": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"},
                            "source": "series",
                            "baseline_source": "others",
                            "lines": 1,
                            "chart": {
                                "x": [1764667000.0, 1764667010.0, 1764667020.0],
                                "series": [
                                    {"label": "GPU 3 · gpu-07", "values": [0.41, 0.12, None]},
                                    {"label": "others' median (7)", "values": [0.6, 0.61, 0.6]},
                                ],
                                "interval": [1764667005.0, 1764667015.0],
                                "baseline": 0.6,
                                "y_label": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                "window": [1764667000.0, 1764667020.0],
                            },
                        }
                    ],
                },
                response_only=True,
            )
        ],
    )
    @action(detail=True, methods=["get"], url_path="evidence-series")
    def evidence_series(self, request: Request, public_id: str | None = None) -> Response:
        incident = self.get_object()
        rows = evidence_charts.evidence_rows(self.principal, incident, incident.verdict)
        return Response(
            {
                "incident": str(incident.public_id),
                "margin": {
                    "factor": 2.0,
                    "min_s": evidence_charts.MIN_PAD_S,
                    "max_s": evidence_charts.MAX_PAD_S,
                },
                "items": [
                    {
                        "evidence": row.evidence,
                        "source": row.source,
                        "baseline_source": row.baseline_source,
                        "lines": row.lines,
                        "chart": row.chart,
                    }
                    for row in rows
                ],
            }
        )


_VERDICT_EXAMPLE = {
    "id": _ID,
    "family": "slow_rank",
    "category": "infrastructure",
    "title": "Rank 3 is 18% slower than the others (GPU 3 on node gpu-07)",
    "summary": "Rank 3's steps take 18% longer; its GPU runs at a lower clock [e1].",
    "recommendation": "Drain gpu-07 and check GPU 3's cooling.",
    "confidence": 0.86,
    "subject": {
        "job": "slurm-48121",
        "node": "gpu-07",
        "gpu": "GPU-7c1e…",
        "rank": 3,
        "mount": None,
    },
    "interval": {"start": 1764666845.0, "end": 1764668645.0},
    "impact": {"slowdown_pct": 18.0, "gpu_hours_lost": 2.4},
    "evidence": [
        {
            "id": "e1",
            "signal": "DCGM_FI_DEV_SM_CLOCK",
            "node": "gpu-07",
            "gpu": "GPU-7c1e…",
            "rank": 3,
            "job": "slurm-48121",
            "interval": {"start": 1764666845.0, "end": 1764668645.0},
            "observed": 1410,
            "baseline": 1980,
            "note": "SM clock below the others'",
        }
    ],
    "cleared": [{"check": "job", "result": "clear", "evidence": ["e1"], "note": "same input"}],
    "explanation": "",
}
_MARKDOWN_EXAMPLE = """### Rank 3 is 18% slower than the others (GPU 3 on node gpu-07)

**INFRASTRUCTURE** · slow_rank · confidence 86%
...
| Signal | GPU | Rank | Node | Interval (UTC) | Value |
|---|---|---|---|---|---|
| DCGM_FI_DEV_SM_CLOCK — SM clock below the others' | GPU-7c1e… | 3 | gpu-07 | 2026-12-02 09:14:05 – 09:44:05 | 1410 (baseline 1980) |
...
Verdict page: https://proof.example/incidents/3f2c1d9e-8a47-4b1e-9c55-0d6e2a7b4f10/
"""


class VerdictFormatNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, except that an unknown `?format=` is a 400 naming it (DRF answers
    404, which reads as "no such verdict")."""

    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)
        try:
            selected: tuple[BaseRenderer, str] = super().select_renderer(
                request, renderers, format_suffix
            )
        except Http404:
            wanted = request.query_params.get(self.settings.URL_FORMAT_OVERRIDE or "format")
            known = ", ".join(str(r.format) for r in renderers)
            raise ValidationError(
                {"format": [f"unknown format {wanted!r}: one of {known}"]}
            ) from None
        return selected


_FORMAT = OpenApiParameter(
    "format",
    str,
    enum=["json", "markdown", "text"],
    description="json (the contract object, default), markdown or text (to paste into a ticket)",
)
_VERDICT_RESPONSES = {
    (200, "application/json"): OpenApiResponse(
        openapi_verdict_schema(), description="the docs/design.md §7 verdict object"
    ),
    (200, "text/markdown"): OpenApiResponse(OpenApiTypes.STR, description="markdown"),
    (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="plain text"),
}


@extend_schema_view(
    list=extend_schema(
        summary="Current verdicts, newest first",
        parameters=[*_LIST_FILTERS, _FORMAT],
        responses=_VERDICT_RESPONSES,
        examples=[OpenApiExample("A verdict", [_VERDICT_EXAMPLE], response_only=True)],
    ),
    retrieve=extend_schema(
        summary="One verdict: the contract JSON, or markdown / text for a ticket",
        parameters=[_FORMAT],
        responses=_VERDICT_RESPONSES,
        examples=[
            OpenApiExample(
                "JSON", _VERDICT_EXAMPLE, response_only=True, media_type="application/json"
            ),
            OpenApiExample(
                "Markdown", _MARKDOWN_EXAMPLE, response_only=True, media_type="text/markdown"
            ),
        ],
    ),
)
class VerdictViewSet(TenantScopedReadOnlyViewSet):
    """The current verdict of each incident, exactly the docs/design.md §7 object (same filters);
    ?format=markdown or ?format=text renders it for a ticket (investigations/api/renderers.py)."""

    model = Incident
    route = "verdicts"
    lookup_field = "public_id"
    renderer_classes = [
        JSONRenderer,
        VerdictMarkdownRenderer,
        VerdictTextRenderer,
    ]
    content_negotiation_class = VerdictFormatNegotiation

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return _filter_incidents(queryset, self.request.query_params)

    def finalize_response(
        self, request: Request, response: Any, *args: Any, **kwargs: Any
    ) -> Response:
        finalized = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(finalized, Response) and finalized.status_code >= 400:
            # Errors keep the API's one JSON shape whatever format was asked for: a ticket
            # tool reads the error the same way from every endpoint.
            finalized.accepted_renderer = JSONRenderer()
            finalized.accepted_media_type = JSONRenderer.media_type
        return finalized

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        rows = page if page is not None else list(self.get_queryset())
        data = [i.verdict for i in rows]
        if page is not None:
            return self.get_paginated_response(data)
        return Response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self.get_object().verdict)


_PRICE_EXAMPLE = {
    "id": 3,
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "price_per_gpu_hour": "2.4900",
    "currency": "USD",
    "updated_at": "2026-12-01T08:00:00Z",
}
_PRICE_WRITE_EXAMPLE = OpenApiExample(
    "A list price",
    {"gpu_model": "NVIDIA H100 80GB HBM3", "price_per_gpu_hour": "2.49", "currency": "USD"},
    request_only=True,
)
_PRICE_EXAMPLES = [OpenApiExample("A list price", _PRICE_EXAMPLE, response_only=True)]


@extend_schema_view(
    list=extend_schema(
        summary="List prices per GPU model (operator roles)", examples=_PRICE_EXAMPLES
    ),
    retrieve=extend_schema(summary="One list price", examples=_PRICE_EXAMPLES),
    create=extend_schema(
        summary="Set a GPU model's list price (operator admins)",
        request=GpuListPriceWriteSerializer,
        responses={201: GpuListPriceSerializer},
        examples=[_PRICE_WRITE_EXAMPLE, *_PRICE_EXAMPLES],
    ),
    update=extend_schema(
        summary="Change a list price (operator admins)",
        request=GpuListPriceWriteSerializer,
        responses={200: GpuListPriceSerializer},
        examples=[_PRICE_WRITE_EXAMPLE, *_PRICE_EXAMPLES],
    ),
    partial_update=extend_schema(
        summary="Change a list price's amount or currency (operator admins)",
        request=GpuListPriceWriteSerializer,
        responses={200: GpuListPriceSerializer},
        examples=[
            OpenApiExample("A new price", {"price_per_gpu_hour": "2.19"}, request_only=True),
            *_PRICE_EXAMPLES,
        ],
    ),
    destroy=extend_schema(summary="Delete a list price (operator admins)"),
)
class GpuListPriceViewSet(TenantScopedViewSet):
    """The operator's list price per GPU-hour per GPU model: operator roles read, operator
    admins write (PUT/PATCH change the price of the row's model)."""

    model = GpuListPrice
    route = "gpu-prices"
    serializer_class = GpuListPriceSerializer

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            return [IsOperatorPrincipal()]
        return [IsOperatorAdminPrincipal()]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.create_with(services.set_list_price, GpuListPriceWriteSerializer)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        current = self.get_object()
        data = {"gpu_model": current.gpu_model, "currency": current.currency}
        incoming = request.data
        data.update(incoming.dict() if hasattr(incoming, "dict") else dict(incoming))
        changes = self.validated(GpuListPriceWriteSerializer, data)
        if changes["gpu_model"] != current.gpu_model:
            return Response(
                {"gpu_model": ["the model of a price cannot change; create a new price"]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        price = services.set_list_price(self.principal, **changes)
        return Response(GpuListPriceSerializer(price).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.delete_list_price(self.principal, int(self.get_object().pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


_REAL_PRICE_EXAMPLE = {
    "start": "2026-11-25T00:00:00+00:00",
    "end": "2026-12-02T00:00:00+00:00",
    "gpu_hours": 1344.0,
    "compute_hours": 913.9,
    "wait_hours": 241.9,
    "idle_hours": 188.2,
    "productive_share": 0.68,
    "list_cost": "3346.5600",
    "effective_price_per_productive_gpu_hour": "3.6618",
    "currency": "USD",
    "unpriced_models": [],
    "methods": ["engine+ebpf"],
}


@extend_schema_view(
    list=extend_schema(
        summary="The real price: productive share and price per productive GPU-hour",
        description=(
            "Of everything the principal may see (the fleet for operators, the customer's own "
            "jobs for customers), or of one job, customer or GPU; over all recorded usage, or "
            "over ?start=&end= (a usage row straddling an edge counts pro rata of its span "
            "inside, as the console's /price/ counts it)."
        ),
        parameters=[RealPriceQuerySerializer],
        responses=RealPriceSerializer,
        examples=[OpenApiExample("The fleet's last week", _REAL_PRICE_EXAMPLE, response_only=True)],
    ),
    retrieve=extend_schema(exclude=True),
)
class RealPriceViewSet(TenantScopedReadOnlyViewSet):
    """GET /real-price/ — productive share and effective price per productive GPU-hour of the
    fleet (operators) or of the customer's own jobs; ?job=<job id>, ?customer=<id>, ?gpu=<uuid>
    narrow it. GET /real-price/by-customer/ — one row per customer (operators only)."""

    model = JobGpuUsage
    route = "real-price"
    permission_classes = [HasPrincipal]
    # One aggregate (and by-customer one row per customer): nothing here pages.
    pagination_class = None

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        query = self.validated(RealPriceQuerySerializer, request.query_params)
        principal = self.principal
        scope: dict[str, Any] = {}
        if "job" in query:
            job = ingest_selectors.job_for(principal, query["job"])
            scope["job_pk"] = job.pk
        if "customer" in query:
            customer = get_object_for_tenant(Customer, principal, pk=query["customer"])
            scope["customer_id"] = customer.pk
        if "gpu" in query:
            scope["gpu"] = query["gpu"]
        if "start" in query:
            price = selectors.price_between(
                principal, query["start"].timestamp(), query["end"].timestamp(), **scope
            )
        else:
            price = selectors.real_price_for(principal, **scope)
        echoed = {k: v.isoformat() if k in ("start", "end") else str(v) for k, v in query.items()}
        return Response({**echoed, **price.as_dict()})

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(status=status.HTTP_404_NOT_FOUND)

    @extend_schema(
        summary="The real price per customer (operator roles)",
        responses=inline_serializer(
            "RealPriceByCustomer",
            {
                "customer": serializers.IntegerField(allow_null=True),
                "gpu_hours": serializers.FloatField(),
            },
            many=True,
        ),
        examples=[
            OpenApiExample(
                "Two customers",
                [{"customer": 4, **_REAL_PRICE_EXAMPLE}, {"customer": None, "gpu_hours": 2.0}],
                response_only=True,
            )
        ],
    )
    @action(detail=False, methods=["get"], url_path="by-customer")
    def by_customer(self, request: Request) -> Response:
        if not self.principal.is_operator:
            return Response(
                {"detail": "Only operator roles may use this endpoint."},
                status=status.HTTP_403_FORBIDDEN,
            )
        rows = selectors.usage_by_customer(self.principal)
        return Response(
            [
                {"customer": c, **p.as_dict()}
                for c, p in sorted(rows.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
            ]
        )
