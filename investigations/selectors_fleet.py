"""Reads of the fleet's hardware as the operator sees it: whether a node reports, which job
holds a GPU now, a GPU's health from the open infrastructure incidents naming it or its node.

Shared by the console (frontend/selectors/fleet.py, health.py) and the REST API
(investigations/api/fleet.py: /nodes/, /gpus/); operators only, like the fleet page: a node's
or a GPU's state is about the operator's hardware and whatever jobs of any customer ran on it.
Every function takes the principal and filters with `for_tenant`; the API's requests run in
the operator's tenant context already, the console's wrap their reads in one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet

from ingest.models import TERMINAL_JOB_STATES, Gpu, Node, Process
from investigations.models import GPU_DEGRADING, Incident, IncidentState, JobActivity
from tenants.access import Principal

# A node is "reporting" when its agent's batches arrived within this many minutes (its
# last_seen_at moves at most every 30 s): ten minutes outlasts an agent restart or a spool
# replay, and is short enough to be worth a look.
DEFAULT_SILENT_MIN = 10
HARDWARE_FAULT = "hardware_fault"
NODE_STATES = ("reporting", "silent")
GPU_HEALTH = ("ok", "degrading", "fault", "incident", "silent")


def reporting_cutoff(now: datetime | None = None, silent_min: int = DEFAULT_SILENT_MIN) -> datetime:
    """Nodes last seen before this are silent."""
    return (now or datetime.now(UTC)) - timedelta(minutes=silent_min)


def holding(principal: Principal, since: datetime) -> QuerySet[Process]:
    """The processes holding GPUs now: on a GPU, not exited, of a job that has not ended and
    whose data arrived since `since` (a job whose agent went quiet without an exit record
    does not hold its GPUs forever). Processes, not JobRank rows: a rank's row keeps the GPU
    of the last process record of that rank, and a rank's worker processes (data loaders)
    carry no GPU."""
    recent = JobActivity.objects.for_tenant(principal).filter(
        job_id=OuterRef("job_id"), received_at__gte=since
    )
    return (
        Process.objects.for_tenant(principal)
        .filter(Exists(recent), job__isnull=False, exited_at__isnull=True)
        .exclude(gpu="")
        .exclude(job__state__in=list(TERMINAL_JOB_STATES))
    )


def jobs_holding(
    principal: Principal, gpus: Iterable[str], cutoff: datetime
) -> dict[str, tuple[str, str | None]]:
    """GPU uuid → (job id, customer name) of the job holding it now (one query)."""
    rows = (
        holding(principal, cutoff)
        .filter(gpu__in=list(gpus))
        .values_list("gpu", "job__job_id", "job__customer__name")
    )
    return {gpu: (job, customer) for gpu, job, customer in rows}


def open_infrastructure(principal: Principal) -> QuerySet[Incident]:
    return Incident.objects.for_tenant(principal).filter(
        state=IncidentState.OPEN, category="infrastructure"
    )


def gpu_health(families: tuple[str, ...], reporting: bool) -> str:
    """One word for a GPU: silent (its node does not report), fault (an open hardware_fault),
    degrading (an open gpu_degrading), incident (another open infrastructure incident on it
    or its node), else ok."""
    if not reporting:
        return "silent"
    if HARDWARE_FAULT in families:
        return "fault"
    if GPU_DEGRADING in families:
        return "degrading"
    if families:
        return "incident"
    return "ok"


def open_infrastructure_families(
    principal: Principal, hostnames: Iterable[str], gpus: Iterable[str]
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """The families of the open infrastructure incidents naming each of these GPUs, and
    naming each of these nodes (without a GPU), in one query."""
    on_gpu: dict[str, set[str]] = {}
    on_node: dict[str, set[str]] = {}
    for subject_node, subject_gpu, family in (
        open_infrastructure(principal)
        .filter(Q(subject_node__in=list(hostnames)) | Q(subject_gpu__in=list(gpus)))
        .values_list("subject_node", "subject_gpu", "family")
    ):
        if subject_gpu:
            on_gpu.setdefault(subject_gpu, set()).add(family)
        elif subject_node:
            on_node.setdefault(subject_node, set()).add(family)
    return (
        {k: tuple(sorted(v)) for k, v in on_gpu.items()},
        {k: tuple(sorted(v)) for k, v in on_node.items()},
    )


# --- nodes and GPUs for the API ----------------------------------------------------------------


def nodes_with_gpus(queryset: QuerySet[Node], principal: Principal) -> QuerySet[Node]:
    """Nodes with their GPUs (ordered by index) fetched in one more query for the whole page."""
    gpus = Gpu.objects.for_tenant(principal).order_by("index", "uuid")
    return queryset.prefetch_related(Prefetch("gpus", queryset=gpus))


def filter_nodes(
    queryset: QuerySet[Node],
    *,
    state: str | None = None,
    model: str | None = None,
    cutoff: datetime,
) -> QuerySet[Node]:
    if state == "reporting":
        queryset = queryset.filter(last_seen_at__gte=cutoff)
    elif state == "silent":
        queryset = queryset.filter(Q(last_seen_at__lt=cutoff) | Q(last_seen_at__isnull=True))
    if model:
        queryset = queryset.filter(gpus__model=model).distinct()
    return queryset


def node_state(node: Node, cutoff: datetime) -> str:
    return (
        "reporting" if node.last_seen_at is not None and node.last_seen_at >= cutoff else "silent"
    )


def filter_gpus(
    queryset: QuerySet[Gpu],
    principal: Principal,
    *,
    node: str | None = None,
    model: str | None = None,
    health: str | None = None,
    cutoff: datetime,
) -> QuerySet[Gpu]:
    """GPUs narrowed by node hostname, model and health (the words of `gpu_health`)."""
    if node:
        queryset = queryset.filter(node__hostname=node)
    if model:
        queryset = queryset.filter(model=model)
    if not health:
        return queryset
    reporting = Q(node__last_seen_at__gte=cutoff)
    infra = open_infrastructure(principal)
    on_gpu = infra.filter(subject_gpu=OuterRef("uuid"))
    on_node = infra.filter(subject_gpu="", subject_node=OuterRef("node__hostname"))
    fault = Exists(on_gpu.filter(family=HARDWARE_FAULT)) | Exists(
        on_node.filter(family=HARDWARE_FAULT)
    )
    degrading = Exists(on_gpu.filter(family=GPU_DEGRADING)) | Exists(
        on_node.filter(family=GPU_DEGRADING)
    )
    anything = Exists(on_gpu) | Exists(on_node)
    if health == "silent":
        return queryset.exclude(reporting)
    queryset = queryset.filter(reporting)
    if health == "fault":
        return queryset.filter(fault)
    if health == "degrading":
        return queryset.filter(degrading).exclude(fault)
    if health == "incident":
        return queryset.filter(anything).exclude(fault).exclude(degrading)
    return queryset.exclude(anything)  # ok


@dataclass(frozen=True)
class GpuState:
    """What the API says of a GPU beyond its inventory row."""

    health: str
    incidents: tuple[str, ...]  # families of the open infrastructure incidents on it or its node
    current_job: str | None
    current_customer: str | None


def gpu_states(principal: Principal, gpus: list[Gpu], cutoff: datetime) -> dict[str, GpuState]:
    """Health and current job of each of these GPUs (their `node` loaded): two queries for
    the whole page, whatever its size."""
    if not gpus:
        return {}
    uuids = [g.uuid for g in gpus]
    on_gpu, on_node = open_infrastructure_families(
        principal, {g.node.hostname for g in gpus}, uuids
    )
    jobs = jobs_holding(principal, uuids, cutoff)
    out = {}
    for gpu in gpus:
        families = tuple(sorted(set(on_gpu.get(gpu.uuid, ()) + on_node.get(gpu.node.hostname, ()))))
        reporting = gpu.node.last_seen_at is not None and gpu.node.last_seen_at >= cutoff
        job, customer = jobs.get(gpu.uuid, (None, None))
        out[gpu.uuid] = GpuState(gpu_health(families, reporting), families, job, customer)
    return out
