"""Reads of the fleet page (/fleet/, operators only): headline cards, the nodes × GPUs heat
map (one page of nodes at a time), GPUs idle while holding memory.

Sizes it is built for (`proof bench console`): 1,250 nodes, 10,000 GPUs, 2,000 jobs, 20,000
incidents. Nothing here reads samples: a GPU's utilisation is its newest hourly rollup
bucket (ingest.selectors.latest_gpu_buckets), the whole fleet's idle-while-holding-memory
scan is one query over those buckets, and the heat map reads only its page's 50 nodes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from contract import signals
from frontend.selectors import price as price_selectors
from ingest import selectors as ingest_selectors
from ingest.models import Gpu, Node
from investigations.models import Incident, IncidentState
from investigations.pricing import RealPrice
from investigations.selectors_fleet import (
    DEFAULT_SILENT_MIN as DEFAULT_SILENT_MIN,  # re-exported: the fleet view's default
)
from investigations.selectors_fleet import (
    gpu_health,
    holding,
    jobs_holding,
    open_infrastructure,
)
from tenants.access import Principal
from tenants.context import tenant_context
from tenants.models import Customer

NODES_PER_PAGE = 50
# Utilisation reads the newest rollup bucket that started within this window: the rollups are
# hourly and rebuilt every 15 minutes, so the current hour's bucket (or the last one) is in it,
# and a GPU that has reported nothing for two hours shows no value rather than an old one.
RECENT_S = 2 * 3600.0
# Idle while holding memory: framebuffer used at every sample of the bucket at least this
# (a CUDA context alone takes ~500 MiB; 1 GiB is an allocation) while the GPU's mean activity
# over the bucket is under 1% (a kernel now and then at most).
DEFAULT_IDLE_MEMORY_MIB = 1024
IDLE_MAX_ACTIVITY = 0.01
IDLE_ROWS = 50
# The cards' productive share and effective price: the last day's GPU time, what the fleet is
# doing now (the real-price page has any period).
PRICE_HOURS = 24

STATES = ("reporting", "silent", "incident")
COLOURS = ("utilisation", "health")
# What a GPU's utilisation is: the engine's active share, the pricing formula's "busy"
# (docs/pricing.md); NVML's utilisation (%) where profiling metrics are missing.
UTILISATION_SIGNALS = (signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE, signals.DCGM_FI_DEV_GPU_UTIL)


@dataclass(frozen=True)
class FleetFilters:
    model: str | None = None
    state: str | None = None  # one of STATES
    customer_id: int | None = None
    silent_min: int = DEFAULT_SILENT_MIN
    colour: str = "utilisation"
    idle_memory_mib: int = DEFAULT_IDLE_MEMORY_MIB
    page: int = 1


@dataclass(frozen=True)
class Cards:
    nodes: int
    nodes_reporting: int
    gpus: int
    gpus_reporting: int
    gpus_in_use: int
    price: RealPrice  # the last PRICE_HOURS hours' usage
    open_by_category: dict[str, int]
    price_hours: int = 24


@dataclass(frozen=True)
class Cell:
    gpu: str
    index: int | None
    model: str
    utilisation: float | None  # 0–1, the newest bucket's mean
    utilisation_source: str  # which signal it came from
    health: str  # ok | degrading | fault | incident | silent
    incidents: tuple[str, ...]  # families of the open infrastructure incidents on the GPU
    job: str | None
    customer: str | None
    # What the template writes (computed once here: 400 cells a page).
    css: str = ""
    text: str = ""
    title: str = ""

    @property
    def level(self) -> int | None:
        """The utilisation colour step, 0–10."""
        if self.utilisation is None:
            return None
        return max(0, min(10, round(self.utilisation * 10)))


HEALTH_MARKS = {"ok": "✓", "degrading": "D", "fault": "F", "incident": "I", "silent": "S"}


def _drawn(cell: Cell, hostname: str, colour: str) -> Cell:
    """The cell with its CSS class, text and hover title for the chosen colouring."""
    if colour == "health":
        css, text = f"h-{cell.health}", HEALTH_MARKS.get(cell.health, "?")
    elif cell.level is None:
        css, text = "nodata", "–"
    else:
        css, text = f"u{cell.level}", f"{(cell.utilisation or 0.0) * 100:.0f}"
    parts = [
        hostname,
        f"GPU {cell.index if cell.index is not None else '?'}",
        cell.model or "unknown model",
        (
            f"utilisation {cell.utilisation * 100:.0f}% ({cell.utilisation_source})"
            if cell.utilisation is not None
            else "utilisation: no recent data"
        ),
        f"health: {cell.health}" + (f" ({', '.join(cell.incidents)})" if cell.incidents else ""),
        (f"job {cell.job}" + (f" ({cell.customer})" if cell.customer else ""))
        if cell.job
        else "no job",
    ]
    return replace(cell, css=css, text=text, title=" · ".join(parts))


def _cells_html(cells: list[Cell | None]) -> SafeString:
    """A row's cells as one escaped HTML string: 400 cells × 4 template variables took more
    of the page's rendering than all the rest of it."""
    out = []
    for cell in cells:
        if cell is None:
            out.append('<td class="hm none"></td>')
        else:
            out.append(
                f'<td class="hm {escape(cell.css)}" data-gpu="{escape(cell.gpu)}" '
                f'title="{escape(cell.title)}">{escape(cell.text)}</td>'
            )
    return mark_safe("".join(out))  # noqa: S308 - every value escaped above


@dataclass(frozen=True)
class NodeRow:
    hostname: str
    reporting: bool
    last_seen: datetime | None
    incidents: tuple[str, ...]  # families of open infrastructure incidents naming the node
    cells: list[Cell | None]  # by GPU index, None where the node has no GPU of that index
    cells_html: SafeString = field(default_factory=lambda: SafeString(""))  # their <td>s


@dataclass(frozen=True)
class IdleRow:
    gpu: str
    node: str
    index: int | None
    model: str
    memory_min_mib: float
    memory_mean_mib: float
    activity: float
    since: float  # the bucket's start
    samples: int
    job: str | None
    customer: str | None


@dataclass
class FleetPage:
    filters: FleetFilters
    cards: Cards
    rows: list[NodeRow]
    columns: list[int]  # GPU indexes shown
    nodes_total: int  # matching the filters
    pages: int
    idle_total: int
    idle: list[IdleRow]
    idle_as_of: float
    models: list[str] = field(default_factory=list)
    customers: list[tuple[int, str]] = field(default_factory=list)


def customer_exists(principal: Principal, customer_id: int) -> bool:
    with tenant_context(principal.operator_id):
        return Customer.objects.for_tenant(principal).filter(pk=customer_id).exists()


def _cards(principal: Principal, cutoff: datetime, now: float) -> tuple[Cards, list[str]]:
    """The headline cards and the fleet's GPU models (5 queries)."""
    nodes = Node.objects.for_tenant(principal).aggregate(
        n=Count("id"), reporting=Count("id", filter=Q(last_seen_at__gte=cutoff))
    )
    # GPUs per model and whether their node reports: the counts and the model filter's
    # options from one pass over the GPUs.
    per_model = list(
        Gpu.objects.for_tenant(principal)
        .values("model")
        .annotate(n=Count("id"), reporting=Count("id", filter=Q(node__last_seen_at__gte=cutoff)))
        .order_by("model")
        .values_list("model", "n", "reporting")
    )
    in_use = holding(principal, cutoff).values("gpu").distinct().count()
    price = price_selectors.price_between(principal, now - PRICE_HOURS * 3600.0, now)
    by_category = dict(
        Incident.objects.for_tenant(principal)
        .filter(state=IncidentState.OPEN)
        .values("category")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("category", "n")
    )
    cards = Cards(
        nodes=nodes["n"],
        nodes_reporting=nodes["reporting"],
        gpus=sum(n for _m, n, _r in per_model),
        gpus_reporting=sum(r for _m, _n, r in per_model),
        gpus_in_use=in_use,
        price=price,
        open_by_category=by_category,
        price_hours=PRICE_HOURS,
    )
    return cards, [m for m, _n, _r in per_model if m]


def _nodes(principal: Principal, filters: FleetFilters, cutoff: datetime) -> QuerySet[Node]:
    nodes = Node.objects.for_tenant(principal)
    if filters.model:
        nodes = nodes.filter(
            Exists(
                Gpu.objects.for_tenant(principal).filter(node=OuterRef("pk"), model=filters.model)
            )
        )
    if filters.state == "reporting":
        nodes = nodes.filter(last_seen_at__gte=cutoff)
    elif filters.state == "silent":
        nodes = nodes.filter(Q(last_seen_at__lt=cutoff) | Q(last_seen_at__isnull=True))
    elif filters.state == "incident":
        nodes = nodes.filter(
            Exists(open_infrastructure(principal).filter(subject_node=OuterRef("hostname")))
        )
    if filters.customer_id is not None:
        nodes = nodes.filter(
            Exists(
                holding(principal, cutoff).filter(
                    node_id=OuterRef("pk"), job__customer_id=filters.customer_id
                )
            )
        )
    return nodes


def _utilisation(
    buckets: dict[tuple[str, str], ingest_selectors.GpuBucket], gpu: str
) -> tuple[float | None, str]:
    engine = buckets.get((gpu, signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE))
    if engine is not None:
        return max(0.0, min(1.0, engine.mean)), "engine active"
    util = buckets.get((gpu, signals.DCGM_FI_DEV_GPU_UTIL))
    if util is not None:
        return max(0.0, min(1.0, util.mean / 100.0)), "NVML utilisation"
    return None, ""


def _heat_map(
    principal: Principal, nodes: list[Node], cutoff: datetime, now: float, colour: str
) -> tuple[list[NodeRow], list[int], list[str]]:
    """The page's rows (4 queries: GPUs, utilisation, jobs, incidents), the GPU indexes, and
    the page's GPU uuids."""
    page_gpus = Gpu.objects.for_tenant(principal).filter(node_id__in=[n.pk for n in nodes])
    gpus = list(
        page_gpus.order_by("node_id", "index", "uuid").values_list(
            "node_id", "uuid", "index", "model"
        )
    )
    uuids = [g[1] for g in gpus]
    buckets = (
        ingest_selectors.latest_gpu_buckets(
            principal.operator_id, UTILISATION_SIGNALS, since=now - RECENT_S, gpus=uuids
        )
        if uuids
        else {}
    )
    jobs = jobs_holding(principal, uuids, cutoff) if uuids else {}
    hostnames = [n.hostname for n in nodes]
    on_gpu: dict[str, list[str]] = {}
    on_node: dict[str, list[str]] = {}
    for subject_node, subject_gpu, family in (
        open_infrastructure(principal)
        # The page's GPUs as a subquery of its nodes, not their 400 UUIDs as parameters: psycopg
        # binds parameters client-side (Django's default), splitting and quoting a statement
        # of hundreds of them in Python on every request.
        .filter(Q(subject_node__in=hostnames) | Q(subject_gpu__in=page_gpus.values("uuid")))
        .values_list("subject_node", "subject_gpu", "family")
    ):
        if subject_gpu:
            on_gpu.setdefault(subject_gpu, []).append(family)
        elif subject_node:
            on_node.setdefault(subject_node, []).append(family)
    indexes = sorted({g[2] for g in gpus if g[2] is not None})
    columns = list(range(max(indexes) + 1)) if indexes else []
    by_node: dict[int, list[tuple[str, int | None, str]]] = {}
    for node_id, gpu, index, model in gpus:
        by_node.setdefault(node_id, []).append((gpu, index, model))
    rows = []
    for node in nodes:
        reporting = node.last_seen_at is not None and node.last_seen_at >= cutoff
        node_families = tuple(sorted(set(on_node.get(node.hostname, []))))
        cells: list[Cell | None] = [None] * len(columns)
        extra: list[Cell] = []
        for gpu, index, model in by_node.get(node.pk, []):
            families = tuple(sorted(set(on_gpu.get(gpu, []))))
            value, source = _utilisation(buckets, gpu)
            job, customer = jobs.get(gpu, (None, None))
            cell = _drawn(
                Cell(
                    gpu,
                    index,
                    model,
                    value,
                    source,
                    gpu_health(families + node_families, reporting),
                    families + node_families,
                    job,
                    customer,
                ),
                node.hostname,
                colour,
            )
            if index is not None and 0 <= index < len(cells) and cells[index] is None:
                cells[index] = cell
            else:
                extra.append(cell)  # no index reported, or two GPUs claim one: keep both
        shown = [*cells, *extra]
        rows.append(
            NodeRow(
                node.hostname,
                reporting,
                node.last_seen_at,
                node_families,
                shown,
                _cells_html(shown),
            )
        )
    return rows, columns, uuids


@dataclass(frozen=True)
class _IdleScan:
    at: float  # when it was read (seconds)
    total: int
    hour: float | None
    rows: list[IdleRow]


# The idle scan per (database, operator, memory threshold), kept IDLE_CACHE_S in this process.
# It reads one hour of the whole fleet's rollups — 57,000 rows at 10,000 GPUs, 0.2–0.6 s on
# the seeded bench fleet — and what it reads changes only when the rollups are rebuilt (every
# 15 minutes, ingest-rollups): reusing it for 5 minutes adds at most a third of the staleness
# the rollups have anyway, and the page says when it was read.
IDLE_CACHE_S = 300.0
_idle_cache: dict[tuple[str, int, int], _IdleScan] = {}
_idle_lock = threading.Lock()


def clear_idle_cache() -> None:
    with _idle_lock:
        _idle_cache.clear()


def _idle(principal: Principal, filters: FleetFilters, cutoff: datetime, now: float) -> _IdleScan:
    key = (
        str(connection.settings_dict.get("NAME")),
        principal.operator_id,
        filters.idle_memory_mib,
    )
    with _idle_lock:
        cached = _idle_cache.get(key)
    if cached is not None and 0 <= now - cached.at < IDLE_CACHE_S:
        return cached
    total, hour, holders = ingest_selectors.idle_gpus_holding_memory(
        principal.operator_id,
        since=now - RECENT_S,
        min_memory_mib=filters.idle_memory_mib,
        max_activity=IDLE_MAX_ACTIVITY,
        limit=IDLE_ROWS,
    )
    rows: list[IdleRow] = []
    if holders:
        uuids = [h.gpu for h in holders]
        where = {
            uuid: (node or "", index, model)
            for uuid, node, index, model in Gpu.objects.for_tenant(principal)
            .filter(uuid__in=uuids)
            .values_list("uuid", "node__hostname", "index", "model")
        }
        jobs = jobs_holding(principal, uuids, cutoff)
        rows = [
            IdleRow(
                h.gpu,
                *where.get(h.gpu, ("", None, "")),
                memory_min_mib=h.memory_min_mib,
                memory_mean_mib=h.memory_mean_mib,
                activity=h.activity,
                since=h.bucket_start,
                samples=h.samples,
                job=jobs.get(h.gpu, (None, None))[0],
                customer=jobs.get(h.gpu, (None, None))[1],
            )
            for h in holders
        ]
    scan = _IdleScan(now, total, hour, rows)
    with _idle_lock:
        _idle_cache[key] = scan
    return scan


def fleet_page(principal: Principal, filters: FleetFilters, now: float | None = None) -> FleetPage:
    """Everything /fleet/ shows. A page past the last is empty."""
    now = datetime.now(UTC).timestamp() if now is None else now
    cutoff = datetime.fromtimestamp(now, UTC) - timedelta(minutes=filters.silent_min)
    with tenant_context(principal.operator_id):
        cards, models = _cards(principal, cutoff, now)
        customers = list(
            Customer.objects.for_tenant(principal).order_by("name", "id").values_list("pk", "name")
        )
        nodes_qs = _nodes(principal, filters, cutoff)
        # Unfiltered, the nodes matching are the cards' count of every node.
        unfiltered = filters.model is None and filters.state is None and filters.customer_id is None
        total = cards.nodes if unfiltered else nodes_qs.count()
        start = (filters.page - 1) * NODES_PER_PAGE
        nodes = (
            list(nodes_qs.order_by("hostname", "id")[start : start + NODES_PER_PAGE])
            if start < total
            else []
        )
        rows, columns, _ = (
            _heat_map(principal, nodes, cutoff, now, filters.colour) if nodes else ([], [], [])
        )
        idle = _idle(principal, filters, cutoff, now)
    return FleetPage(
        filters=filters,
        cards=cards,
        rows=rows,
        columns=columns,
        nodes_total=total,
        pages=max(1, -(-total // NODES_PER_PAGE)),
        idle_total=idle.total,
        idle=idle.rows,
        idle_as_of=idle.at,
        models=models,
        customers=customers,
    )
