"""Incidents and verdicts (read-only), list prices per GPU model, the real price.

Customers see only their own jobs' incidents and verdicts and their own jobs' real price
(the models' customer_path); fleet-health incidents and list prices are operator-only.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import QueryDict
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from ingest import selectors as ingest_selectors
from investigations import selectors, services
from investigations.api.serializers import (
    GpuListPriceSerializer,
    GpuListPriceWriteSerializer,
    IncidentSerializer,
    RealPriceQuerySerializer,
    VerdictRevisionSerializer,
)
from investigations.models import GpuListPrice, Incident, JobGpuUsage
from tenants.access import get_object_for_tenant
from tenants.api.base import TenantScopedReadOnlyViewSet, TenantScopedViewSet
from tenants.api.permissions import HasPrincipal, IsOperatorAdminPrincipal, IsOperatorPrincipal
from tenants.models import Customer

_FILTERS = ("state", "family", "category")


def _filter_incidents(queryset: QuerySet[Any], params: QueryDict) -> QuerySet[Any]:
    """The incident list filters, shared by the incident and the verdict views."""
    for name in _FILTERS:
        if params.get(name):
            queryset = queryset.filter(**{name: params[name]})
    if params.get("job"):
        queryset = queryset.filter(job__job_id=params["job"])
    return queryset.select_related("job")


class IncidentViewSet(TenantScopedReadOnlyViewSet):
    """Incidents with their current verdict; ?state=open&family=…&category=…&job=<job id>."""

    model = Incident
    route = "incidents"
    serializer_class = IncidentSerializer
    lookup_field = "public_id"

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return _filter_incidents(queryset, self.request.query_params)

    @action(detail=True, methods=["get"])
    def revisions(self, request: Request, public_id: str | None = None) -> Response:
        incident = self.get_object()
        rows = incident.revisions.order_by("number")
        return Response(VerdictRevisionSerializer(rows, many=True).data)


class VerdictViewSet(TenantScopedReadOnlyViewSet):
    """The current verdict of each incident, exactly the docs/design.md §7 object (same filters)."""

    model = Incident
    route = "verdicts"
    lookup_field = "public_id"

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return _filter_incidents(queryset, self.request.query_params)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        rows = page if page is not None else list(self.get_queryset())
        data = [i.verdict for i in rows]
        if page is not None:
            return self.get_paginated_response(data)
        return Response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self.get_object().verdict)


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


class RealPriceViewSet(TenantScopedReadOnlyViewSet):
    """GET /real-price/ — productive share and effective price per productive GPU-hour of the
    fleet (operators) or of the customer's own jobs; ?job=<job id>, ?customer=<id>, ?gpu=<uuid>
    narrow it. GET /real-price/by-customer/ — one row per customer (operators only)."""

    model = JobGpuUsage
    route = "real-price"
    permission_classes = [HasPrincipal]

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
        price = selectors.real_price_for(principal, **scope)
        return Response({**{k: str(v) for k, v in query.items()}, **price.as_dict()})

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(status=status.HTTP_404_NOT_FOUND)

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
