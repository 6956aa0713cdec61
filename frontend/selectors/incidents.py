"""Reads of the incidents pages: the list (`/incidents/`) and one verdict (`/incidents/<id>/`).

    params = list_params(request.GET)              # BadParameter (→ 400) names the parameter
    page = incident_page(principal, params)        # 4 queries, whatever the page holds
    detail = incident_detail(principal, public_id) # Http404 across tenants and customers

Operators see every incident of theirs; customer users the incidents of their customer's jobs
only (`for_tenant`: `Incident.customer_path` is the job's customer), and row-level security is
the second wall (the request runs in the operator's tenant context). The evidence charts of a
verdict page are built in frontend/selectors/incident_charts.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import OuterRef, Subquery
from django.http import Http404
from django.urls import reverse

from contract.verdicts import verdict_schema
from frontend.selectors import incident_charts
from investigations.models import (
    GpuListPrice,
    Incident,
    IncidentState,
    JobGpuUsage,
    RevisionKind,
    VerdictRevision,
)
from tenants.access import Principal

PAGE_SIZE = 50
# Longer than any job id or hostname ingest stores (both are ≤ 255 characters).
MAX_TEXT_LEN = 255
FAMILIES: tuple[str, ...] = tuple(verdict_schema()["properties"]["family"]["enum"])
CATEGORIES: tuple[str, ...] = ("job", "infrastructure")
STATES: tuple[str, ...] = tuple(IncidentState.values)
# The checks a verdict's `cleared` list may hold (docs/design.md §7), in the page's order.
CHECKS: tuple[str, ...] = ("hardware", "fabric", "storage", "job")
BADGES = {"job": "JOB", "infrastructure": "INFRASTRUCTURE"}


class BadParameter(ValueError):
    """A query parameter the page cannot use; the view answers 400 naming it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


# `?sort=` keys (a leading "-" reverses) and the columns each orders by; ties: newest first.
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "last_seen": ("last_seen",),
    "first_seen": ("first_seen",),
    "confidence": ("confidence",),
    "family": ("family",),
    "category": ("category",),
    "state": ("state",),
}
# The default, "open first, newest first": "open" sorts before "resolved".
DEFAULT_SORT = "open"
DEFAULT_ORDER = ("state", "-last_seen", "-id")


@dataclass(frozen=True)
class ListParams:
    state: str = ""
    category: str = ""
    family: str = ""
    job: str = ""
    node: str = ""
    sort: str = DEFAULT_SORT
    page: int = 1

    def query(self, **changes: object) -> str:
        """This list's query string with `changes` applied (for sort and page links)."""
        values = {
            "state": self.state,
            "category": self.category,
            "family": self.family,
            "job": self.job,
            "node": self.node,
            "sort": "" if self.sort == DEFAULT_SORT else self.sort,
            "page": "" if self.page == 1 else str(self.page),
        }
        values.update({k: str(v) for k, v in changes.items()})
        if values["page"] == "1":
            values["page"] = ""
        if values["sort"] == DEFAULT_SORT:
            values["sort"] = ""
        return urlencode({k: v for k, v in values.items() if v})

    def sort_links(self) -> dict[str, str]:
        """Each sortable column's link: by it (newest/largest first on a second click), back
        to page 1."""
        links = {}
        for key in SORT_KEYS:
            target = f"-{key}" if self.sort == key else key
            links[key] = self.query(sort=target, page=1)
        return links


def _choice(params: Mapping[str, str], name: str, allowed: Iterable[str]) -> str:
    value = params.get(name, "").strip()
    options = tuple(allowed)
    if value and value not in options:
        raise BadParameter(name, f"{value[:40]!r} is not one of {', '.join(options)}")
    return value


def _text(params: Mapping[str, str], name: str) -> str:
    value = params.get(name, "").strip()
    if len(value) > MAX_TEXT_LEN:
        raise BadParameter(name, f"longer than {MAX_TEXT_LEN} characters")
    return value


def list_params(params: Mapping[str, str]) -> ListParams:
    """The list's filters, sort and page from a query string; BadParameter names the first
    unusable one."""
    sort = params.get("sort", "").strip() or DEFAULT_SORT
    if sort != DEFAULT_SORT and sort.removeprefix("-") not in SORT_KEYS:
        keys = ", ".join([DEFAULT_SORT, *SORT_KEYS])
        raise BadParameter("sort", f"{sort[:40]!r} is not one of {keys} (- reverses)")
    raw_page = params.get("page", "").strip() or "1"
    if not raw_page.isdigit() or int(raw_page) < 1 or len(raw_page) > 9:
        raise BadParameter("page", f"{raw_page[:20]!r} is not a page number (1, 2, …)")
    return ListParams(
        state=_choice(params, "state", STATES),
        category=_choice(params, "category", CATEGORIES),
        family=_choice(params, "family", FAMILIES),
        job=_text(params, "job"),
        node=_text(params, "node"),
        sort=sort,
        page=int(raw_page),
    )


@dataclass(frozen=True)
class Money:
    amount: Decimal
    currency: str


@dataclass(frozen=True)
class IncidentRow:
    public_id: uuid.UUID
    state: str
    category: str
    family: str
    title: str
    job_id: str | None
    subject_node: str
    subject_gpu: str
    subject_rank: int | None
    subject_mount: str
    confidence: float
    first_seen: float
    last_seen: float
    slowdown_pct: float | None
    gpu_hours_lost: float | None
    money_lost: Money | None

    # Formatted here rather than with template filters: 50 rows × several filters was a
    # measurable share of the page's time.
    @property
    def badge(self) -> str:
        return BADGES.get(self.category, self.category.upper())

    @property
    def slowdown_text(self) -> str:
        return "–" if self.slowdown_pct is None else f"{self.slowdown_pct:.1f}%"

    @property
    def gpu_hours_text(self) -> str:
        return "–" if self.gpu_hours_lost is None else f"{self.gpu_hours_lost:,.3f}"

    @property
    def gpu_short(self) -> str:
        return self.subject_gpu if len(self.subject_gpu) <= 16 else self.subject_gpu[:15] + "…"


@dataclass(frozen=True)
class IncidentPage:
    params: ListParams
    rows: list[IncidentRow]
    total: int
    pages: int

    @property
    def previous_query(self) -> str | None:
        return self.params.query(page=self.params.page - 1) if self.params.page > 1 else None

    @property
    def next_query(self) -> str | None:
        return (
            self.params.query(page=self.params.page + 1) if self.params.page < self.pages else None
        )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _prices_per_gpu_hour(operator_id: int, job_pks: set[int]) -> dict[int, Money]:
    """Each job's list price per GPU-hour (its GPUs' models' prices weighted by their GPU time),
    in one query; a job with an unpriced model, two currencies or no accounted usage has none.

    Prices are read in the operator's scope for customer users too: a customer sees the cost of
    its own jobs (the real price, docs/pricing.md), never the price list itself."""
    if not job_pks:
        return {}
    price = GpuListPrice.objects.for_tenant(operator_id).filter(gpu_model=OuterRef("gpu_model"))
    rows = (
        JobGpuUsage.objects.for_tenant(operator_id)
        .filter(job_id__in=job_pks)
        .annotate(
            price=Subquery(price.values("price_per_gpu_hour")[:1]),
            currency=Subquery(price.values("currency")[:1]),
        )
        .values_list("job_id", "gpu_seconds", "price", "currency")
    )
    parts: dict[int, list[tuple[float, Decimal | None, str | None]]] = {}
    for job_pk, seconds, unit_price, currency in rows:
        parts.setdefault(int(job_pk), []).append((float(seconds), unit_price, currency))
    out: dict[int, Money] = {}
    for job_pk, usage in parts.items():
        currencies = {c for _, _, c in usage}
        if any(p is None for _, p, _ in usage) or len(currencies) != 1:
            continue
        total = sum(s for s, _, _ in usage)
        if total <= 0:
            continue
        weighted = sum((Decimal(str(s)) * p for s, p, _ in usage if p is not None), Decimal(0))
        out[job_pk] = Money(weighted / Decimal(str(total)), str(currencies.pop()))
    return out


def _money_lost(
    impact: Mapping[str, Any], job_pk: int | None, prices: Mapping[int, Money]
) -> Money | None:
    """The verdict's own money figure where it carries one (`impact.money_lost` with
    `impact.currency`: an optional extension of docs/design.md §7), else its GPU-hours lost at
    the job's list price."""
    own = _number(impact.get("money_lost"))
    if own is not None and isinstance(impact.get("currency"), str):
        return Money(Decimal(str(own)).quantize(Decimal("0.01")), str(impact["currency"]))
    hours = _number(impact.get("gpu_hours_lost"))
    price = prices.get(job_pk) if job_pk is not None else None
    if hours is None or price is None:
        return None
    return Money((Decimal(str(hours)) * price.amount).quantize(Decimal("0.01")), price.currency)


def _impact(verdict_impact: object) -> Mapping[str, Any]:
    return verdict_impact if isinstance(verdict_impact, dict) else {}


def incident_page(principal: Principal, params: ListParams) -> IncidentPage:
    """One page (PAGE_SIZE rows) of the incidents the principal may see. Four queries: the
    count, the page's rows (light columns only: the verdict JSON stays out of the sort), the
    page's impact objects, and the page's jobs' list prices. A page past the last is
    BadParameter("page")."""
    qs = Incident.objects.for_tenant(principal)
    if params.state:
        qs = qs.filter(state=params.state)
    if params.category:
        qs = qs.filter(category=params.category)
    if params.family:
        qs = qs.filter(family=params.family)
    if params.job:
        qs = qs.filter(job__job_id=params.job)
    if params.node:
        qs = qs.filter(subject_node=params.node)
    total = qs.count()
    pages = max(1, -(-total // PAGE_SIZE))
    if params.page > pages:
        raise BadParameter("page", f"{params.page} is past the last page ({pages})")
    if params.sort == DEFAULT_SORT:
        order: tuple[str, ...] = DEFAULT_ORDER
    else:
        desc = params.sort.startswith("-")
        columns = SORT_KEYS[params.sort.removeprefix("-")]
        order = (*(f"-{c}" if desc else c for c in columns), "-last_seen", "-id")
    start = (params.page - 1) * PAGE_SIZE
    rows = list(
        qs.order_by(*order).values_list(
            "pk",
            "public_id",
            "state",
            "category",
            "family",
            "title",
            "job_id",
            "job__job_id",
            "subject_node",
            "subject_gpu",
            "subject_rank",
            "subject_mount",
            "confidence",
            "first_seen",
            "last_seen",
        )[start : start + PAGE_SIZE]
    )
    impacts: dict[int, Mapping[str, Any]] = {}
    if rows:
        impacts = {
            int(pk): _impact(impact)
            for pk, impact in Incident.objects.for_tenant(principal)
            .filter(pk__in=[r[0] for r in rows])
            .values_list("pk", "verdict__impact")
        }
    priced_jobs = {
        int(r[6])
        for r in rows
        if r[6] is not None and _number(impacts.get(r[0], {}).get("gpu_hours_lost"))
    }
    prices = _prices_per_gpu_hour(principal.operator_id, priced_jobs)
    out = []
    for (
        pk,
        public_id,
        state,
        category,
        family,
        title,
        job_pk,
        job_id,
        node,
        gpu,
        rank,
        mount,
        conf,
        first,
        last,
    ) in rows:
        impact = impacts.get(pk, {})
        out.append(
            IncidentRow(
                public_id=public_id,
                state=state,
                category=category,
                family=family,
                title=title,
                job_id=job_id,
                subject_node=node,
                subject_gpu=gpu,
                subject_rank=rank,
                subject_mount=mount,
                confidence=float(conf),
                first_seen=first.timestamp(),
                last_seen=last.timestamp(),
                slowdown_pct=_number(impact.get("slowdown_pct")),
                gpu_hours_lost=_number(impact.get("gpu_hours_lost")),
                money_lost=_money_lost(impact, job_pk, prices),
            )
        )
    return IncidentPage(params, out, total, pages)


# --- one verdict -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClearedCheck:
    check: str
    result: str  # "clear", "implicated", or "" when the verdict did not make this check
    note: str
    evidence: list[dict[str, Any]]


@dataclass(frozen=True)
class Revision:
    number: int
    kind: str
    kind_label: str
    family: str
    category: str
    confidence: float
    family_changed: bool
    category_changed: bool
    confidence_delta: float | None
    created_at: datetime


@dataclass(frozen=True)
class IncidentDetail:
    incident: Incident
    verdict: dict[str, Any]
    job_id: str | None
    interval: tuple[float, float]
    slowdown_pct: float | None
    gpu_hours_lost: float | None
    money_lost: Money | None
    evidence: list[incident_charts.EvidenceRow]
    cleared: list[ClearedCheck]
    revisions: list[Revision]
    subject_place: list[dict[str, str]]


def _revisions(principal: Principal, incident: Incident) -> list[Revision]:
    rows = list(
        VerdictRevision.objects.for_tenant(principal)
        .filter(incident=incident)
        .order_by("number")
        .values_list("number", "kind", "family", "category", "confidence", "created_at")
    )
    out = []
    previous: tuple[Any, ...] | None = None
    for number, kind, family, category, confidence, created_at in rows:
        out.append(
            Revision(
                number=number,
                kind=kind,
                kind_label=str(RevisionKind(kind).label) if kind in RevisionKind.values else kind,
                family=family,
                category=category,
                confidence=float(confidence),
                family_changed=previous is not None and previous[2] != family,
                category_changed=previous is not None and previous[3] != category,
                confidence_delta=None
                if previous is None
                else round(float(confidence) - float(previous[4]), 4),
                created_at=created_at,
            )
        )
        previous = (number, kind, family, category, confidence)
    return out


def _cleared(verdict: Mapping[str, Any], by_id: Mapping[str, dict[str, Any]]) -> list[ClearedCheck]:
    """The four checks in order: what the verdict says of each (the first entry per check),
    with the evidence rows it cites; a check it did not make has result ""."""
    entries: dict[str, Mapping[str, Any]] = {}
    for entry in verdict.get("cleared") or []:
        if isinstance(entry, dict) and entry.get("check") in CHECKS:
            entries.setdefault(str(entry["check"]), entry)
    out = []
    for check in CHECKS:
        entry = entries.get(check, {})
        cited = [by_id[str(e)] for e in entry.get("evidence") or [] if str(e) in by_id]
        out.append(
            ClearedCheck(check, str(entry.get("result") or ""), str(entry.get("note") or ""), cited)
        )
    return out


def place_parts(place: Mapping[str, Any], fleet_url: str | None) -> list[dict[str, str]]:
    """Where a subject or an evidence row is — node, GPU, rank — as parts to show, each with
    its link to the fleet page where the principal may open it (`fleet_url`: operators).
    Node names are shown as stored: there is no per-customer node naming to apply."""
    node, gpu, rank = place.get("node"), place.get("gpu"), place.get("rank")
    parts: list[dict[str, str]] = []
    if node:
        href = f"{fleet_url}?{urlencode({'node': node})}" if fleet_url else ""
        parts.append({"text": str(node), "href": href, "title": ""})
    if gpu:
        query = {"node": node, "gpu": gpu} if node else {"gpu": gpu}
        href = f"{fleet_url}?{urlencode(query)}" if fleet_url else ""
        short = str(gpu) if len(str(gpu)) <= 16 else str(gpu)[:15] + "…"
        parts.append({"text": short, "href": href, "title": str(gpu)})
    if isinstance(rank, int) and not isinstance(rank, bool):
        parts.append({"text": f"rank {rank}", "href": "", "title": ""})
    return parts


def incident_detail(principal: Principal, public_id: uuid.UUID) -> IncidentDetail:
    """The verdict page's data. Another tenant's incident, or another customer's for a
    customer user, is Http404. Queries: the incident with its job, its revisions, the job's
    list price (when the verdict states GPU-hours lost), and the evidence charts' reads
    (incident_charts.evidence_rows: one series catalog query and one block read for every
    series row together, one events query, one log query; a customer user's one more for the
    job's data span)."""
    incident = (
        Incident.objects.for_tenant(principal)
        .select_related("job")
        .filter(public_id=public_id)
        .first()
    )
    if incident is None:
        raise Http404("No such incident.")
    verdict: dict[str, Any] = incident.verdict if isinstance(incident.verdict, dict) else {}
    impact = _impact(verdict.get("impact"))
    interval = verdict.get("interval") or {}
    start = _number(interval.get("start")) or incident.first_seen.timestamp()
    end = _number(interval.get("end")) or incident.last_seen.timestamp()
    revisions = _revisions(principal, incident)
    hours = _number(impact.get("gpu_hours_lost"))
    prices = (
        _prices_per_gpu_hour(principal.operator_id, {incident.job_id})
        if incident.job_id is not None and hours
        else {}
    )
    evidence = incident_charts.evidence_rows(principal, incident, verdict)
    fleet_url = reverse("fleet") if principal.is_operator else None
    for row in evidence:
        row.place = place_parts(row.evidence, fleet_url)
    subject = verdict.get("subject")
    by_id = {str(row.evidence.get("id")): row.evidence for row in evidence}
    return IncidentDetail(
        incident=incident,
        verdict=verdict,
        job_id=incident.job.job_id if incident.job is not None else None,
        interval=(start, end),
        slowdown_pct=_number(impact.get("slowdown_pct")),
        gpu_hours_lost=hours,
        money_lost=_money_lost(impact, incident.job_id, prices),
        evidence=evidence,
        cleared=_cleared(verdict, by_id),
        revisions=revisions,
        subject_place=place_parts(subject if isinstance(subject, dict) else {}, fleet_url),
    )
