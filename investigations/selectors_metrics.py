"""Reads behind the verdict metrics (Prometheus) and the Grafana annotations
(investigations/api/metrics.py): open incidents by family and category, the open incidents
themselves (bounded), and the incidents over a time range. Each through `for_tenant`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce

from investigations.models import Incident, IncidentState
from tenants.access import Principal

# The per-incident series and annotation lists are bounded: Prometheus keeps every label set it
# sees, and a dashboard over a fleet's bad month must still answer in one request.
MAX_INCIDENT_SERIES = 1000
MAX_ANNOTATIONS = 1000


@dataclass(frozen=True)
class FamilyCount:
    family: str
    category: str
    open: int
    gpu_hours_lost: float


@dataclass(frozen=True)
class IncidentRow:
    public_id: str
    family: str
    category: str
    title: str
    job: str
    node: str
    gpu: str
    state: str
    confidence: float
    first_seen: datetime
    last_seen: datetime
    resolved_at: datetime | None


def open_counts(principal: Principal) -> list[FamilyCount]:
    rows = (
        Incident.objects.for_tenant(principal)
        .filter(state=IncidentState.OPEN)
        .values("family", "category")
        .annotate(n=Count("id"), lost=Coalesce(Sum("gpu_hours_lost"), 0.0))
        .order_by("family", "category")
    )
    return [FamilyCount(r["family"], r["category"], r["n"], float(r["lost"])) for r in rows]


def _rows(qs: object, limit: int) -> list[IncidentRow]:
    fields = (
        "public_id",
        "family",
        "category",
        "title",
        "job__job_id",
        "subject_node",
        "subject_gpu",
        "state",
        "confidence",
        "first_seen",
        "last_seen",
        "resolved_at",
    )
    out = []
    for r in qs.values_list(*fields)[:limit]:  # type: ignore[attr-defined]
        out.append(
            IncidentRow(
                str(r[0]), r[1], r[2], r[3], r[4] or "", r[5], r[6], r[7], r[8], r[9], r[10], r[11]
            )
        )
    return out


def open_incidents(principal: Principal, limit: int = MAX_INCIDENT_SERIES) -> list[IncidentRow]:
    """The open incidents, most recently seen first, at most `limit`."""
    qs = (
        Incident.objects.for_tenant(principal)
        .filter(state=IncidentState.OPEN)
        .order_by("-last_seen", "-id")
    )
    return _rows(qs, limit)


def incidents_between(
    principal: Principal,
    start: datetime,
    end: datetime,
    *,
    family: str | None = None,
    category: str | None = None,
    limit: int = MAX_ANNOTATIONS,
) -> list[IncidentRow]:
    """Incidents whose span (first seen to resolved, or to last seen while open) meets
    [start, end], most recent first, at most `limit`."""
    qs = Incident.objects.for_tenant(principal).filter(first_seen__lte=end)
    qs = qs.filter(Q(resolved_at__gte=start) | Q(resolved_at__isnull=True, last_seen__gte=start))
    if family:
        qs = qs.filter(family=family)
    if category:
        qs = qs.filter(category=category)
    return _rows(qs.order_by(F("first_seen").desc(), "-id"), limit)
