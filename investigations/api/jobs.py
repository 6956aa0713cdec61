"""GET /api/v1/jobs/, /jobs/<job_id>/ and /jobs/<job_id>/series/: jobs with their ranks, GPUs,
nodes, productive share, list and effective price and open verdicts; any signal of a job,
downsampled server-side.

Operators see every job of theirs; a customer principal its own customer's jobs only (Job's
`customer_path`): another customer's job, like another operator's, is a 404. A job is named by
its scheduler job id, never a database key. The figures are the console's
(investigations/selectors_jobs.py, which the jobs pages read too).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from ingest.models import Job
from investigations import selectors_jobs
from investigations.api.jobs_serializers import (
    DEFAULT_JOB_ORDERING,
    JOB_ORDERINGS,
    JobDetailSerializer,
    JobListQuery,
    JobSerializer,
    JobSeriesQuery,
    JobSeriesSerializer,
)
from investigations.pricing import RealPrice
from tenants.api.base import TenantScopedReadOnlyViewSet
from tenants.models import Customer

_PRICE_EXAMPLE = {
    "productive_share": 0.62,
    "gpu_hours": 16.0,
    "list_price_per_gpu_hour": "2.4900",
    "effective_price_per_productive_gpu_hour": "4.0161",
    "currency": "USD",
    "unpriced_models": [],
}
_JOB_EXAMPLE: dict[str, Any] = {
    "job_id": "4471023",
    "name": "llama-8b-sft",
    "state": "running",
    "kind": "training",
    "scheduler": "slurm",
    "customer": {"id": 3, "slug": "acme", "name": "Acme ML"},
    "world_size": 8,
    "exit_code": None,
    "gpu_count": 8,
    "node_count": 2,
    "started": "2026-12-02T09:00:00Z",
    "last_seen": "2026-12-02T11:00:00Z",
    "ended": None,
    "duration_s": 7200.0,
    "price": _PRICE_EXAMPLE,
    "open_incidents": ["6f1c2d9e-8a47-4f0e-9d55-3f8f0f3b2a10"],
}
_JOB_DETAIL_EXAMPLE = {
    **_JOB_EXAMPLE,
    "ranks": [
        {"rank": 0, "local_rank": 0, "node": "gpu-node-01", "gpu": "GPU-5f3c…", "pid": 41210},
    ],
    "gpus": [
        {"uuid": "GPU-5f3c…", "node": "gpu-node-01", "index": 0, "model": "NVIDIA H100 80GB HBM3"}
    ],
    "nodes": ["gpu-node-01", "gpu-node-02"],
    "data_start": 1764666000.0,
    "data_end": 1764673200.0,
}
_SERIES_EXAMPLE = {
    "job": "4471023",
    "signal": "DCGM_FI_DEV_POWER_USAGE",
    "unit": "W",
    "start": 1764672600.0,
    "end": 1764673200.0,
    "resolution": 60.0,
    "data_source": "raw samples",
    "points": 2,
    "series": [
        {
            "rank": 0,
            "gpu": "GPU-5f3c…",
            "gpu_index": 0,
            "node": "gpu-node-01",
            "pid": None,
            "labels": {},
            "t": [1764672600.0, 1764672660.0],
            "mean": [612.4, 598.1],
            "min": [540.0, 530.2],
            "max": [688.9, 671.0],
            "count": [60, 60],
        }
    ],
}


def price_fields(price: RealPrice) -> dict[str, Any]:
    list_price = selectors_jobs.list_price_per_gpu_hour(price)
    effective = price.effective_price_per_productive_gpu_hour
    return {
        "productive_share": (
            None if price.productive_share is None else round(price.productive_share, 6)
        ),
        "gpu_hours": round(price.gpu_hours, 6),
        "list_price_per_gpu_hour": None if list_price is None else str(list_price),
        "effective_price_per_productive_gpu_hour": None if effective is None else str(effective),
        "currency": price.currency,
        "unpriced_models": list(price.unpriced_models),
    }


def _customer(job: Job) -> dict[str, Any] | None:
    customer = job.customer
    if customer is None:
        return None
    return {"id": customer.pk, "slug": customer.slug, "name": customer.name}


def job_fields(
    job: Job, *, price: RealPrice, open_incidents: list[str], gpus: int | None, nodes: int | None
) -> dict[str, Any]:
    duration = getattr(job, "duration_s", None)
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state,
        "kind": job.kind,
        "scheduler": job.scheduler,
        "customer": _customer(job),
        "world_size": job.world_size,
        "exit_code": job.exit_code,
        "gpu_count": gpus,
        "node_count": nodes,
        "started": job.first_seen_at,
        "last_seen": job.last_seen_at,
        "ended": job.ended_at,
        "duration_s": None if duration is None else round(float(duration), 3),
        "price": price_fields(price),
        "open_incidents": open_incidents,
    }


def _floats(values: np.ndarray, digits: int | None = None) -> list[float]:
    out = values.astype(np.float64)
    return (np.round(out, digits) if digits is not None else out).tolist()  # type: ignore[no-any-return]


@extend_schema_view(
    list=extend_schema(
        summary="Jobs",
        description=(
            "The jobs this principal may see (a customer: its own), newest first, cursor-paged. "
            "Each with its GPU and node counts, data span, productive share, list and "
            "effective price per GPU-hour and the public ids of its open incidents."
        ),
        parameters=[JobListQuery],
        examples=[OpenApiExample("A page of jobs", value=[_JOB_EXAMPLE], response_only=True)],
    ),
    retrieve=extend_schema(
        summary="One job",
        description=(
            "A job by its scheduler job id: as in the list, with its ranks (rank, node, GPU, "
            "pid), GPUs (UUID, node, index, model) and nodes. Another customer's or another "
            "operator's job is a 404."
        ),
        responses=JobDetailSerializer,
        examples=[OpenApiExample("A job", value=_JOB_DETAIL_EXAMPLE, response_only=True)],
    ),
)
class JobViewSet(TenantScopedReadOnlyViewSet):
    model = Job
    route = "jobs"
    serializer_class = JobSerializer
    lookup_field = "job_id"
    # Scheduler ids may hold dots (torchrun run ids, pod names): anything but a slash (or a
    # NUL, which no stored id holds and PostgreSQL refuses in a query).
    lookup_value_regex = r"[^/\x00]+"

    @property
    def cursor_ordering(self) -> tuple[str, ...]:
        """The order the list's cursor pages in (tenants/api/pagination.py)."""
        key = getattr(self, "_ordering", DEFAULT_JOB_ORDERING)
        column = JOB_ORDERINGS[key.removeprefix("-")]
        return (f"-{column}",) if key.startswith("-") else (column,)

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        queryset = queryset.select_related("customer")
        if self.action != "list":
            return queryset
        query = self.validated(JobListQuery, self.request.query_params.dict())
        self._ordering = str(query["ordering"])
        op = self.principal.operator_id
        if "state" in query:
            queryset = queryset.filter(state=query["state"])
        if "kind" in query:
            queryset = queryset.filter(kind=query["kind"])
        if "customer" in query:
            queryset = queryset.filter(customer=self._customer_named(query["customer"]))
        if "node" in query:
            queryset = selectors_jobs.on_node(queryset, op, query["node"])
        if "gpu" in query:
            queryset = selectors_jobs.on_gpu(queryset, op, query["gpu"])
        if "since" in query:
            queryset = queryset.filter(last_seen_at__gte=_when(query["since"]))
        if "until" in query:
            queryset = queryset.filter(first_seen_at__lte=_when(query["until"]))
        if query.get("q"):
            queryset = selectors_jobs.matching(queryset, query["q"])
        return selectors_jobs.annotate_job_figures(queryset)

    def _customer_named(self, name: str) -> Customer:
        customers = Customer.objects.for_tenant(self.principal)
        # A numeric id (ASCII digits, within a bigint) or a slug.
        numeric = name.isascii() and name.isdigit() and len(name) <= 18
        lookup = {"pk": int(name)} if numeric else {"slug": name}
        customer = customers.filter(**lookup).first()
        if customer is None:
            raise ValidationError({"customer": [f"no customer {name!r} here"]})
        return customer

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        jobs: list[Job] = list(page) if page is not None else []
        pks = [int(j.pk) for j in jobs]
        prices = selectors_jobs.page_prices(self.principal.operator_id, pks)
        incidents = selectors_jobs.open_incident_ids(self.principal, pks)
        rows = [
            job_fields(
                job,
                price=prices[int(job.pk)],
                open_incidents=incidents.get(int(job.pk), []),
                gpus=job.gpu_count,  # type: ignore[attr-defined]
                nodes=selectors_jobs.node_count_of(job, job.node_count),  # type: ignore[attr-defined]
            )
            for job in jobs
        ]
        return self.get_paginated_response(JobSerializer(rows, many=True).data)  # type: ignore[arg-type]

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        job = self.get_object()
        detail = selectors_jobs.job_detail(self.principal, job)
        span = detail.data_span
        if span is not None:
            job.duration_s = span[1] - span[0]
        body = {
            **job_fields(
                job,
                price=detail.price,
                open_incidents=detail.open_incidents,
                gpus=len(detail.gpus) or job.world_size,
                nodes=len(detail.nodes) or None,
            ),
            "ranks": [vars(r) for r in detail.ranks],
            "gpus": [vars(g) for g in detail.gpus],
            "nodes": detail.nodes,
            "data_start": None if span is None else span[0],
            "data_end": None if span is None else span[1],
        }
        return Response(JobDetailSerializer(body).data)

    @extend_schema(
        summary="A signal of a job",
        description=(
            "Any signal the job stored (its own series, and the GPU-scope series of the GPUs "
            "its ranks ran on), one series per rank/GPU/label set, downsampled to buckets of "
            "`resolution` seconds: per bucket holding samples its start, mean, min, max and "
            "count. The range is kept within the job's own data (the GPU-scope series of its "
            "GPUs carry no job key: outside the job they are another job's). Raw samples are read over at most 6 node-hours of the nodes holding the "
            "series (6 h of one node, 3 h of two, never under 10 min; default: the newest "
            "that much); a resolution of whole hours reads the hourly rollups over up to 31 "
            "days. At most 10,000 points a response: a finer resolution is a 400 naming "
            "`resolution` and the finest that fits. An unknown signal is a 400 naming "
            "`signal` and listing the job's signals."
        ),
        parameters=[JobSeriesQuery],
        responses=JobSeriesSerializer,
        examples=[OpenApiExample("Power of rank 0", value=_SERIES_EXAMPLE, response_only=True)],
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def series(self, request: Request, job_id: str | None = None) -> Response:
        # The job first: another tenant's job is a 404 whatever the parameters.
        job = self.get_object()
        query = self.validated(JobSeriesQuery, request.query_params.dict())
        try:
            read = selectors_jobs.job_signal(
                self.principal,
                job,
                signal=query["signal"],
                rank=query.get("rank"),
                gpu=query.get("gpu"),
                start=query.get("start"),
                end=query.get("end"),
                resolution=query.get("resolution"),
            )
        except selectors_jobs.SeriesRequestError as error:
            raise ValidationError({error.name: [error.message]}) from None
        body = {
            "job": job.job_id,
            "signal": read.signal,
            "unit": read.unit,
            "start": round(read.start, 3),
            "end": round(read.end, 3),
            "resolution": read.resolution,
            "data_source": read.source,
            "points": read.points,
            "series": [
                {
                    "rank": s.rank,
                    "gpu": s.info.gpu,
                    "gpu_index": s.info.gpu_index,
                    "node": s.info.node,
                    "pid": s.info.pid,
                    "labels": dict(s.info.labels),
                    "t": _floats(s.buckets.start, 3),
                    "mean": _floats(s.buckets.mean),
                    "min": _floats(s.buckets.min),
                    "max": _floats(s.buckets.max),
                    "count": s.buckets.count.astype(np.int64).tolist(),
                }
                for s in read.series
            ],
        }
        return Response(body)


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
