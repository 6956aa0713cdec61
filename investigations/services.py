"""The live pipeline's writes: job activity from ingest, evaluations, incidents and verdicts.

    ingest announces batch_stored ─► receivers ─► note_job_data() ─► (debounced) evaluate_job
    periodic fan-out ──────► evaluate_job / evaluate_fleet_health tasks
    evaluate_job(): lock ─► window from ingest ─► detectors ─► merge_verdicts() ─► notifications
                                               └► account_usage() (the real price)

docs/live-pipeline.md describes the lifecycle; the numbers below carry their reasons.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce, Greatest, Least

from ingest import selectors as ingest_selectors
from ingest.models import TERMINAL_JOB_STATES
from investigations import live, notifications, pricing, signals, window_cache
from investigations.models import (
    GPU_DEGRADING,
    GpuListPrice,
    Incident,
    IncidentState,
    JobActivity,
    JobGpuUsage,
    NotificationKind,
    ResolveReason,
    RevisionKind,
    VerdictHold,
    VerdictRevision,
)

# Share links live in their own module; callers keep calling services.<name>.
from investigations.share_link_services import SHARE_MAX_EXPIRES_S as SHARE_MAX_EXPIRES_S
from investigations.share_link_services import SHARE_MIN_EXPIRES_S as SHARE_MIN_EXPIRES_S
from investigations.share_link_services import SHARE_TOKEN_KIND as SHARE_TOKEN_KIND
from investigations.share_link_services import OpenedShare as OpenedShare
from investigations.share_link_services import ShareRefused as ShareRefused
from investigations.share_link_services import do_create_share_link as do_create_share_link
from investigations.share_link_services import do_revoke_share_link as do_revoke_share_link
from investigations.share_link_services import open_share_link as open_share_link
from tenants.access import Principal
from tenants.audit import record_audit
from tenants.context import tenant_context
from tenants.models import Role
from tenants.services import NotAllowed, TenancyError

log = logging.getLogger(__name__)

# The detectors see at most the last 30 min of a job's data: long enough for several
# checkpoints, a loss trend and hundreds of steps; bounded so an evaluation's cost does not
# grow with the job's age. A younger job is seen from its first sample.
WINDOW_S = 1800.0
# A finding absent for 10 min of data time resolves its incident. Shorter would flap on
# periodic problems (a checkpoint stall recurs at each save, typically every 10–60 min);
# longer keeps a fixed problem open for no reason.
GRACE_S = 600.0
# Routine evaluations: at most one per job per 30 s from the ingest signal (the first 10 s
# after the job's data starts, so it sees those), and the fan-out for any job not evaluated
# for 30 s. Evaluating every job every few seconds would cost far more than the detection
# budget (≤ 0.1 core per 1,000 GPUs: a 4-GPU job's evaluation takes ~25 ms of CPU); most jobs,
# most of the time, are fine and unchanged.
ROUTINE_S = 30.0
ROUTINE_COUNTDOWN_S = 10.0
# A job whose newest batch shows a sign (engine/screen.py: an event, an error line, a counter
# that moved, a level change, a GPU drifting from its peers) is evaluated within seconds: at
# most every 2 s, 1 s after the batch (so the other nodes' batches of that second are in).
URGENT_S = 2.0
URGENT_COUNTDOWN_S = 1.0
# An evaluation that found verdicts and changed nothing (no incident created or revised) makes
# the job routine again for 30 s even while its batches keep showing signs: a known problem
# (an open incident) does not need re-evaluating every 2 s.
SETTLED_S = 30.0
# A job whose signs are only lasting conditions (a GPU throttling, a level changed, a GPU
# drifting: engine/screen.py) and whose evaluations change nothing is evaluated less and less
# often: 2, 4, then every 8 s at most, until an evaluation creates or revises an incident, a
# happening (an event, an error line, a counter that moved) shows, or a minute passes without
# an unchanged evaluation. A 25-node job shows some such condition on one of its nodes nearly
# all the time (bench live fleet mode) and stayed on the 2 s cadence: ~4x the evaluations for
# nothing. 8 s keeps a new fault's verdict within the 20 s target: its evidence takes 4-6 s
# to gather anyway.
URGENT_MAX_S = 8.0
BACKOFF_TTL_S = 60.0
# ...and never more often than its own cost allows: lasting-sign evaluations of one job may
# use at most 1% of a core (its last evaluation's CPU / LASTING_CPU_SHARE seconds apart, up to
# the routine ROUTINE_S). A 4-GPU job's ~20 ms evaluation is not held back by it (2 s); a
# 200-GPU job's ~350 ms one is (35 s: routine). Lasting signs scale with the GPUs compared: of
# a 25-node job's 200 GPUs one nearly always drifts or changes level a little, and the fleet
# bench's five such jobs were evaluated every ~5 s on them (0.35 of its 0.43 cores per 1,000
# GPUs). A happening (an event, an error line, a counter that moved) is never held by it.
LASTING_CPU_SHARE = 0.01
COST_TTL_S = 600.0
# A fan-out evaluation waiting in the queue keeps the next passes from queueing another for
# the same job, up to this long (a lost task: the next pass after it queues one again).
FAN_OUT_QUEUED_S = 60.0
# A job that stored data in the last 10 min is active (the fan-out evaluates it).
ACTIVE_S = 600.0
# GPU time is accounted up to 30 s behind the newest data: batches of a job's nodes arrive
# from different agents a few seconds apart, and a sample accounted is never counted again.
SETTLE_S = 30.0
# How much settled data a running job's GPU-time accounting waits for (account_usage).
ACCOUNT_EVERY_S = 30.0
# Samples without a job extend the span of a job with a rank on their node only if the job's
# data reached within 2 min of them: agents ship every few seconds, so a longer gap means the
# job is gone (its end never reported) and the node runs something else.
CONTINUITY_S = 120.0
# An evaluation holding the lock longer than this is presumed dead (its worker was killed):
# evaluations take 0.02–0.5 s (a cold cache of a 200-GPU job: a few seconds), and a killed
# worker's lock must not hold the job's next verdicts back for long. If one ever outlives it,
# a second evaluation runs beside it, which merging tolerates (unique open incidents,
# notification claims).
LOCK_TTL_S = 30.0
# A verdict revision is kept when the verdict changes in substance: family, category,
# subject, title or recommendation, or confidence moving by at least this much.
CONFIDENCE_STEP = 0.05


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def _ts(value: datetime) -> float:
    return value.timestamp()


# --- ingest → detectors ------------------------------------------------------------------------


def note_job_data(
    operator_id: int,
    spans: dict[int, tuple[float, float]],
    node_spans: dict[int, tuple[float, float]] | None = None,
    now: datetime | None = None,
    *,
    urgent_jobs: Iterable[int] = (),
    urgent_nodes: Iterable[int] = (),
    prompt_jobs: Iterable[int] | None = None,
    prompt_nodes: Iterable[int] | None = None,
) -> list[int]:
    """Ingest stored data for these jobs (job pk → (first ts, last ts) in the batch), and
    samples without a job on these nodes (node pk → span), which count for the running jobs
    with a rank on the node (a GPU reading the agent could not attribute is still the job's).

    Records the activity (in the caller's transaction, so it commits with the batch) and
    schedules an evaluation of each job: within URGENT_COUNTDOWN_S, at most once per URGENT_S,
    for `urgent_jobs` and the running jobs on `urgent_nodes` (their batch showed a sign) unless
    settled; else at most once per ROUTINE_S. The urgent ones among `prompt_jobs` /
    `prompt_nodes` (a happening, not only a lasting condition; None: all of them) are never
    backed off (URGENT_MAX_S). Returns the job pks it scheduled."""
    now = now or datetime.now(UTC)
    spans = dict(spans)
    urgent = set(urgent_jobs)
    hot_nodes = set(urgent_nodes)
    prompt = set(urgent) if prompt_jobs is None else set(prompt_jobs)
    prompt_on = hot_nodes if prompt_nodes is None else set(prompt_nodes)
    with tenant_context(operator_id):
        if node_spans:
            running = ingest_selectors.running_jobs_on_nodes(operator_id, node_spans)
            last_seen = dict(
                JobActivity.objects.for_tenant(operator_id)
                .filter(job_id__in={job_pk for job_pk, _ in running})
                .values_list("job_id", "last_data_ts")
            )
            for job_pk, node_pk in running:
                lo, hi = node_spans[node_pk]
                # Only a job still live on the node: one whose data stopped long ago (its end
                # was never reported) must not be revived by the node's next job.
                seen = spans.get(job_pk, (None, last_seen.get(job_pk)))[1]
                if seen is None or lo - seen > CONTINUITY_S:
                    continue
                a, b = spans.get(job_pk, (lo, hi))
                spans[job_pk] = (min(a, lo), max(b, hi))
                if node_pk in hot_nodes:
                    urgent.add(job_pk)
                if node_pk in prompt_on:
                    prompt.add(job_pk)
        if not spans:
            return []
        # In job pk order: concurrent batches of the same jobs lock their activity rows in one
        # order, so neither holds one the other waits for (docs/ingest.md, "Concurrency").
        for job_pk, (first, last) in sorted(spans.items()):
            _widen_activity(operator_id, job_pk, first, last, now)
    scheduled: list[tuple[int, float]] = []
    for pk in spans:
        if (
            pk in urgent
            and cache.get(_settled_key(operator_id, pk)) is None
            and (pk in prompt or _lasting_due(operator_id, pk))
            and cache.add(_debounce_key(operator_id, pk, "urgent"), 1, URGENT_S)
        ):
            scheduled.append((pk, URGENT_COUNTDOWN_S))
        elif cache.add(_debounce_key(operator_id, pk, "routine"), 1, ROUTINE_S):
            scheduled.append((pk, ROUTINE_COUNTDOWN_S))
    for job_pk, countdown in scheduled:
        transaction.on_commit(
            lambda pk=job_pk, c=countdown: schedule_job_evaluation(operator_id, pk, c)  # type: ignore[misc]
        )
    return [pk for pk, _ in scheduled]


def _widen_activity(
    operator_id: int, job_pk: int, first: float, last: float, now: datetime
) -> None:
    """Widen the job's data span in one statement (min/max in SQL): batches of one job are
    stored concurrently by ingest's writer threads and by other ingest processes, and a
    read-modify-write here would lose the later one's span."""
    rows = JobActivity.objects.for_tenant(operator_id).filter(job_id=job_pk)
    # Data that begins further back than the window cache re-reads (the values compared are
    # the row's before this update).
    late = Q(last_data_ts__gt=first + window_cache.OVERLAP_S)
    widen = {
        "first_data_ts": Least(F("first_data_ts"), Value(first)),
        "last_data_ts": Greatest(F("last_data_ts"), Value(last)),
        "received_at": now,
        "late_batches": Case(When(late, then=F("late_batches") + 1), default=F("late_batches")),
        "late_first_ts": Case(When(late, then=Value(first)), default=F("late_first_ts")),
    }
    if rows.update(**widen):
        return
    try:
        with transaction.atomic():
            JobActivity.objects.create(
                operator_id=operator_id,
                job_id=job_pk,
                first_data_ts=first,
                last_data_ts=last,
                received_at=now,
            )
    except IntegrityError:  # another batch of the job created it meanwhile
        rows.update(**widen)


def _key(*parts: object) -> str:
    """A cache key private to this database: workers of one deployment share it; another
    deployment or test database on the same Redis does not."""
    return ":".join(["investigations", str(connection.settings_dict["NAME"]), *map(str, parts)])


def _debounce_key(operator_id: int, job_pk: int, kind: str) -> str:
    return _key("eval-debounce", kind, operator_id, job_pk)


def _settled_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-settled", operator_id, job_pk)


def _backoff_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-backoff", operator_id, job_pk)


def _queued_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-queued", operator_id, job_pk)


def claim_fan_out(operator_id: int, job_pk: int) -> bool:
    """Whether the routine fan-out may enqueue this job's evaluation: not while one it enqueued
    is still waiting in the queue (cleared when any evaluation of the job is taken from the
    queue, even one that finds the job busy; lapses after FAN_OUT_QUEUED_S should that task be
    lost). With the workers behind, each 15 s pass queued the same jobs again, and every copy
    ran (the fleet bench's probe: 200-GPU jobs evaluated
    1-10 s apart while the queue was behind)."""
    return bool(cache.add(_queued_key(operator_id, job_pk), 1, FAN_OUT_QUEUED_S))


def _cost_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-cost", operator_id, job_pk)


def _cost_floor(cpu_s: float) -> float:
    """Seconds between lasting-sign evaluations a job costing `cpu_s` allows (up to the
    routine pass)."""
    return min(ROUTINE_S, cpu_s / LASTING_CPU_SHARE)


def lasting_interval(operator_id: int, job_pk: int) -> float:
    """Seconds between evaluations of a job on lasting signs alone: its backed-off interval
    (URGENT_S doubling to URGENT_MAX_S), and at least what its cost allows
    (LASTING_CPU_SHARE), up to ROUTINE_S."""
    backoff = float(cache.get(_backoff_key(operator_id, job_pk)) or URGENT_S)
    cost = float(cache.get(_cost_key(operator_id, job_pk)) or 0.0)
    return max(backoff, _cost_floor(cost))


def _lasting_due(operator_id: int, job_pk: int) -> bool:
    """Whether a job whose batch shows only lasting signs is due an urgent evaluation: once
    per `lasting_interval`, kept apart from the prompt signs' 2 s debounce so that a happening
    is never held back by a backoff."""
    interval = max(1, round(lasting_interval(operator_id, job_pk)))  # cache TTLs: whole seconds
    return bool(cache.add(_debounce_key(operator_id, job_pk, "lasting"), 1, interval))


def _note_outcome(
    operator_id: int, job_pk: int, verdicts: bool, changed: bool, cpu_s: float | None = None
) -> None:
    """After an evaluation: its CPU is the job's cost (LASTING_CPU_SHARE); a change resets the
    job's urgent cadence, an unchanged outcome doubles its interval for lasting signs
    (URGENT_MAX_S) and, with verdicts, settles it."""
    if cpu_s is not None:
        cache.set(_cost_key(operator_id, job_pk), round(cpu_s, 4), COST_TTL_S)
        floor = _cost_floor(cpu_s)
        if floor > URGENT_MAX_S:
            # Counted from this evaluation, whatever brought it (the routine pass, a
            # happening): a costly job's lasting signs add none within its floor.
            cache.set(_debounce_key(operator_id, job_pk, "lasting"), 1, round(floor))
    if changed:
        cache.delete(_backoff_key(operator_id, job_pk))
        return
    key = _backoff_key(operator_id, job_pk)
    interval = float(cache.get(key) or URGENT_S)
    cache.set(key, min(URGENT_MAX_S, 2.0 * interval), BACKOFF_TTL_S)  # whole seconds: TTLs
    if verdicts:
        cache.set(_settled_key(operator_id, job_pk), 1, SETTLED_S)


def schedule_job_evaluation(
    operator_id: int, job_pk: int, countdown: float = ROUTINE_COUNTDOWN_S
) -> None:
    """Announce that the job needs an evaluation in `countdown` seconds (the countdown lets it
    see the rest of the debounce period's data too). investigations.tasks answers by enqueuing
    its evaluate_job task: to the broker's workers in production, to the in-process runner's
    workers in the embedded default (proof_web/runner.py). The services never import the
    tasks, which import the services."""
    signals.evaluation_due.send(
        sender=schedule_job_evaluation, operator_id=operator_id, job_pk=job_pk, countdown=countdown
    )


# --- locking -----------------------------------------------------------------------------------


@contextmanager
def evaluation_lock(name: str) -> Iterator[bool]:
    """A non-blocking lock through the cache: Redis in production (shared by every worker),
    the process-local cache in the embedded default (where every evaluation runs in one
    process). `cache.add` is atomic on both. Yields whether it was acquired; the holder's
    token guards the release, so a lock that expired and was taken over is not released by
    the first holder."""
    key = _key("lock", name)
    token = uuid.uuid4().hex
    acquired = bool(cache.add(key, token, LOCK_TTL_S))
    try:
        yield acquired
    finally:
        if acquired and cache.get(key) == token:
            cache.delete(key)


# --- evaluation --------------------------------------------------------------------------------


@dataclass
class MergeResult:
    created: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    revised: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    notified: int = 0


@dataclass
class EvaluationResult:
    status: str  # "evaluated", "busy" (another evaluation holds the lock), "no_data"
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    merge: MergeResult = field(default_factory=MergeResult)
    window: tuple[float, float] | None = None


def evaluate_job(operator_id: int, job_pk: int) -> EvaluationResult:
    """Run the detectors over the job's sliding window and merge their verdicts.

    Reads and writes are separate short transactions (not one around the detectors): on the
    embedded SQLite a read transaction that later writes fails if ingest committed meanwhile.
    """
    # Out of the queue, whatever comes of it (busy too: the fan-out may queue the next one).
    cache.delete(_queued_key(operator_id, job_pk))
    with evaluation_lock(f"job:{operator_id}:{job_pk}") as acquired:
        if not acquired:
            return EvaluationResult("busy")
        began_cpu = time.thread_time()
        with tenant_context(operator_id):
            job = ingest_selectors.job_by_pk(operator_id, job_pk)
            activity = JobActivity.objects.for_tenant(operator_id).filter(job_id=job_pk).first()
        if job is None or activity is None:
            return EvaluationResult("no_data")
        t1 = activity.last_data_ts
        t0 = max(activity.first_data_ts, t1 - WINDOW_S)
        ended = job.state in TERMINAL_JOB_STATES
        window, verdicts = live.detect_job(
            operator_id,
            job.job_id,
            t0,
            t1,
            job_state=(job.state, job.ended_at, job.world_size, job.rerun_of),
            late=window_cache.LateData(activity.late_batches, activity.late_first_ts),
            span=(activity.first_data_ts, activity.last_data_ts),
        )
        settle = t1 if ended else t1 - SETTLE_S
        with tenant_context(operator_id):
            _take_write_lock()
            # The accounting mark as it is now, row locked: an evaluation that outlived its lock
            # (LOCK_TTL_S) may have committed another one's accounting meanwhile, and what it
            # counted must not be counted again. Both marks only move forward.
            rows = JobActivity.objects.for_tenant(operator_id).filter(pk=activity.pk)
            usage_through = (
                rows.select_for_update().values_list("usage_through_ts", flat=True).first()
            )
            # Held (investigations/verdict_hold.py): GPU time is still accounted, nothing is
            # merged; the held period is evaluated when the hold is released.
            held = verdicts_held(operator_id)
            merge = (
                MergeResult()
                if held
                else merge_verdicts(
                    operator_id, verdicts, window_end=t1, job_pk=job_pk, ended=ended
                )
            )
            if window is not None:
                usage_through = account_usage(
                    operator_id, job_pk, window, usage_through, settle, ended=ended
                )
            marks: dict[str, Any] = {
                "evaluated_through_ts": Greatest(
                    Coalesce(F("evaluated_through_ts"), Value(t1)), Value(t1)
                ),
                "evaluated_at": datetime.now(UTC),
            }
            if usage_through is not None:
                marks["usage_through_ts"] = Greatest(
                    Coalesce(F("usage_through_ts"), Value(usage_through)), Value(usage_through)
                )
            rows.update(**marks)
        _note_outcome(
            operator_id,
            job_pk,
            bool(verdicts),
            bool(merge.created or merge.revised),
            cpu_s=time.thread_time() - began_cpu,
        )
        return EvaluationResult("evaluated", verdicts, merge, (t0, t1))


def evaluate_fleet_health(
    operator_id: int, gpu: str, window_s: float = 6 * 3600.0
) -> EvaluationResult:
    """`gpu_degrading` for one GPU over its recent history (one incident per GPU)."""
    with evaluation_lock(f"gpu:{operator_id}:{gpu}") as acquired:
        if not acquired:
            return EvaluationResult("busy")
        found = live.detect_gpu(operator_id, gpu, window_s)
        if found is None:
            return EvaluationResult("no_data")
        (t0, t1), verdicts = found
        verdicts = [v for v in verdicts if v.get("family") == GPU_DEGRADING]
        with tenant_context(operator_id):
            _take_write_lock()
            # A GPU's trend is re-judged over its last 6 h at each pass: after a hold the next
            # pass sees it again, so nothing needs replaying.
            merge = (
                MergeResult()
                if verdicts_held(operator_id)
                else merge_verdicts(operator_id, verdicts, window_end=t1, gpu=gpu)
            )
        return EvaluationResult("evaluated", verdicts, merge, (t0, t1))


def evaluate_node_health(
    operator_id: int, hostname: str, window_s: float = 6 * 3600.0
) -> dict[str, EvaluationResult]:
    """`gpu_degrading` for every GPU of one node, from one read of the node's data (GPU uuid →
    result). Each GPU merges under its own lock, as `evaluate_fleet_health` does: a GPU another
    evaluation holds is `busy` and left to it."""
    results: dict[str, EvaluationResult] = {}
    for gpu, (t0, t1), verdicts in live.detect_node_gpus(operator_id, hostname, window_s):
        with evaluation_lock(f"gpu:{operator_id}:{gpu}") as acquired:
            if not acquired:
                results[gpu] = EvaluationResult("busy")
                continue
            verdicts = [v for v in verdicts if v.get("family") == GPU_DEGRADING]
            with tenant_context(operator_id):
                _take_write_lock()
                merge = (
                    MergeResult()
                    if verdicts_held(operator_id)
                    else merge_verdicts(operator_id, verdicts, window_end=t1, gpu=gpu)
                )
            results[gpu] = EvaluationResult("evaluated", verdicts, merge, (t0, t1))
    return results


def verdicts_held(operator_id: int) -> bool:
    """Whether the operator's new verdicts are held (investigations.models.VerdictHold)."""
    return VerdictHold.objects.for_tenant(operator_id).exists()


def _take_write_lock() -> None:
    """On SQLite, make the transaction's first statement a write. A transaction that reads and
    then writes cannot take the write lock once another connection (ingest) has committed
    since its read — SQLite fails at once with "database is locked" instead of waiting — while
    one that starts by writing waits for the lock (busy timeout) like any writer."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            # S608: the table name is the model's own, never input.
            cursor.execute(f"UPDATE {Incident._meta.db_table} SET id = id WHERE 0")  # noqa: S608


# --- incidents ---------------------------------------------------------------------------------


def _interval(verdict: dict[str, Any], fallback: float) -> tuple[float, float]:
    interval = verdict.get("interval") or {}
    start = interval.get("start")
    end = interval.get("end")
    end = float(end) if isinstance(end, int | float) else fallback
    start = float(start) if isinstance(start, int | float) else end
    return start, max(start, end)


def _subject(verdict: dict[str, Any]) -> dict[str, Any]:
    subject = verdict.get("subject") or {}
    return {
        "subject_node": subject.get("node") or "",
        "subject_gpu": subject.get("gpu") or "",
        "subject_rank": subject.get("rank"),
        "subject_mount": subject.get("mount") or "",
    }


def _material(old: dict[str, Any], new: dict[str, Any]) -> bool:
    for key in ("family", "category", "subject", "title", "recommendation"):
        if old.get(key) != new.get(key):
            return True
    return abs(float(old.get("confidence") or 0) - float(new.get("confidence") or 0)) >= (
        CONFIDENCE_STEP
    )


def _best_per_family(verdicts: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for v in verdicts:
        family = str(v.get("family") or "")
        if not family:
            continue
        if family not in best or float(v.get("confidence") or 0) > float(
            best[family].get("confidence") or 0
        ):
            best[family] = v
    return best


def _revise(incident: Incident, kind: RevisionKind) -> VerdictRevision:
    return VerdictRevision.objects.create(
        operator_id=incident.operator_id,
        incident=incident,
        number=incident.revision,
        kind=kind,
        family=incident.family,
        category=incident.category,
        confidence=incident.confidence,
        verdict=incident.verdict,
    )


def merge_verdicts(
    operator_id: int,
    verdicts: Iterable[dict[str, Any]],
    *,
    window_end: float,
    job_pk: int | None = None,
    gpu: str | None = None,
    ended: bool = False,
) -> MergeResult:
    """Merge one evaluation's verdicts (docs/design.md §7 dicts) into the scope's incidents.

    Scope: a job (`job_pk`; one incident per family) or a GPU (`gpu`; `gpu_degrading`).
    Runs in the caller's tenant transaction. Per family: no open incident → create one (and
    notify "new") unless the verdict is the same occurrence as a resolved incident still
    inside the window; an open one → update it, keeping a revision on a material change and
    notifying "changed" when the category changed. Open incidents whose finding is absent for
    GRACE_S of data time, or all of them once the job has ended, are resolved.
    """
    if (job_pk is None) == (gpu is None):
        raise ValueError("merge_verdicts needs exactly one of job_pk= or gpu=")
    result = MergeResult()
    scope: dict[str, Any] = (
        {"job_id": job_pk}
        if job_pk is not None
        else {
            "job__isnull": True,
            "subject_gpu": gpu,
        }
    )
    incidents = Incident.objects.for_tenant(operator_id).filter(**scope)
    open_by_family = {
        i.family: i for i in incidents.filter(state=IncidentState.OPEN).select_for_update()
    }
    for family, verdict in _best_per_family(verdicts).items():
        start, end = _interval(verdict, window_end)
        incident = open_by_family.get(family)
        if incident is None:
            last = (
                incidents.filter(family=family, state=IncidentState.RESOLVED)
                .order_by("-last_seen")
                .first()
            )
            if last is not None and end <= _ts(last.last_seen) + 1e-3:
                continue  # the resolved occurrence, still inside the sliding window
            incident = _create_incident(operator_id, verdict, job_pk, gpu, start, end)
            result.created.append(incident.pk)
            revision = _revise(incident, RevisionKind.CREATED)
            if notifications.record(incident, revision, NotificationKind.NEW):
                result.notified += 1
            continue
        material = _material(incident.verdict, verdict)
        if not material and end <= _ts(incident.last_seen):
            continue  # the same evidence seen again: nothing new
        previous_category = incident.category
        previous_verdict = incident.verdict
        incident.verdict = {**verdict, "id": str(incident.public_id)}
        if not material and "investigation" in previous_verdict:
            # The same revision seen again: its investigation (explain_services) still stands.
            for key in ("explanation", "investigation"):
                incident.verdict[key] = previous_verdict[key]
        incident.category = str(verdict.get("category") or incident.category)
        incident.confidence = float(verdict.get("confidence") or 0.0)
        incident.title = str(verdict.get("title") or "")[:300]
        for name, value in _subject(verdict).items():
            setattr(incident, name, value)
        incident.first_seen = min(incident.first_seen, _dt(start))
        incident.last_seen = max(incident.last_seen, _dt(end))
        if material:
            incident.revision += 1
        incident.save()
        result.updated.append(incident.pk)
        if material:
            kind = (
                RevisionKind.CATEGORY_CHANGED
                if incident.category != previous_category
                else RevisionKind.UPDATED
            )
            revision = _revise(incident, kind)
            result.revised.append(incident.pk)
            if kind is RevisionKind.CATEGORY_CHANGED and notifications.record(
                incident,
                revision,
                NotificationKind.CHANGED,
                previous_family=incident.family,
                previous_category=previous_category,
            ):
                result.notified += 1
    for incident in open_by_family.values():
        if ended:
            resolve_incident(incident, ResolveReason.JOB_ENDED, window_end)
            result.resolved.append(incident.pk)
        elif window_end - _ts(incident.last_seen) >= GRACE_S:
            resolve_incident(incident, ResolveReason.FINDING_ABSENT, window_end)
            result.resolved.append(incident.pk)
    return result


def _create_incident(
    operator_id: int,
    verdict: dict[str, Any],
    job_pk: int | None,
    gpu: str | None,
    start: float,
    end: float,
) -> Incident:
    incident = Incident(
        operator_id=operator_id,
        job_id=job_pk,
        family=str(verdict["family"]),
        category=str(verdict.get("category") or ""),
        confidence=float(verdict.get("confidence") or 0.0),
        title=str(verdict.get("title") or "")[:300],
        first_seen=_dt(start),
        last_seen=_dt(end),
        verdict={},
        **_subject(verdict),
    )
    if gpu is not None:
        incident.subject_gpu = gpu
    incident.verdict = {**verdict, "id": str(incident.public_id)}
    incident.save()
    return incident


def resolve_incident(incident: Incident, reason: ResolveReason, at: float) -> None:
    """Mark an open incident resolved at data time `at` (the pipeline's grace or job end, or a
    person: investigations/incident_actions.py), keep the resolved revision and announce it
    (PagerDuty resolves its alert through notify's outbox)."""
    incident.state = IncidentState.RESOLVED
    incident.resolve_reason = reason
    incident.resolved_at = _dt(max(at, _ts(incident.last_seen)))
    incident.revision += 1
    incident.save()
    _revise(incident, RevisionKind.RESOLVED)
    notifications.record_resolved(incident)


# --- the real price: GPU time accounting ------------------------------------------------------


def account_usage(
    operator_id: int,
    job_pk: int,
    window: Any,
    through: float | None,
    until: float,
    *,
    ended: bool = False,
) -> float | None:
    """Add the window's samples in (through, until] to the job's per-GPU usage; returns the new
    `through`. Runs in the caller's tenant transaction. Formula: investigations/pricing.py.

    A running job is accounted once `ACCOUNT_EVERY_S` of settled data has gathered (its first
    evaluation always): evaluations come every few seconds while a job shows signs, and
    accounting each one was a third of their statements (a row lock, a read and one UPDATE per
    GPU) for a productive share that no page shows to the second. An ended job's last
    evaluation accounts whatever is left."""
    if through is not None and not ended and until - through < ACCOUNT_EVERY_S:
        return through
    split = pricing.split_gpu_time(window, after=through, until=until)
    if not split:
        return through
    existing = {
        u.gpu: u
        for u in JobGpuUsage.objects.for_tenant(operator_id)
        .filter(job_id=job_pk, gpu__in=[s.gpu for s in split])
        .select_for_update()
    }
    # The model of a GPU first accounted here (the rows keep it: one inventory read per new GPU,
    # not one per evaluation).
    new_nodes = {s.node for s in split if s.gpu not in existing or not existing[s.gpu].gpu_model}
    models = pricing.gpu_models(operator_id, new_nodes) if new_nodes else {}
    created: list[JobGpuUsage] = []
    for s in split:
        usage = existing.get(s.gpu)
        if usage is None:
            usage = JobGpuUsage(operator_id=operator_id, job_id=job_pk, gpu=s.gpu, node=s.node)
            created.append(usage)
        usage.gpu_model = usage.gpu_model or models.get(s.gpu, "")
        usage.gpu_seconds += s.gpu_seconds
        usage.compute_seconds += s.compute_seconds
        usage.wait_seconds += s.wait_seconds
        usage.idle_seconds += s.idle_seconds
        usage.first_ts = s.first_ts if usage.first_ts is None else min(usage.first_ts, s.first_ts)
        usage.last_ts = s.last_ts if usage.last_ts is None else max(usage.last_ts, s.last_ts)
        usage.method = s.method
    if created:
        JobGpuUsage.objects.bulk_create(created)
    if existing:
        _update_usage(list(existing.values()))
    last = max(s.last_ts for s in split)
    return max(last, through) if through is not None else last


_USAGE_FIELDS = [
    "gpu_model",
    "gpu_seconds",
    "compute_seconds",
    "wait_seconds",
    "idle_seconds",
    "first_ts",
    "last_ts",
    "method",
]


def _update_usage(rows: list[JobGpuUsage]) -> None:
    """One UPDATE per row, sent as one batch (psycopg pipelines executemany). Django's
    bulk_update builds a CASE WHEN per field over every row: for a 200-GPU job that was
    ~0.6 s of CPU resolving expressions, 40% of the job's evaluation (profiled)."""
    table = JobGpuUsage._meta.db_table
    # The fields are plain columns named as the attributes (no db_column on the model).
    columns = list(_USAGE_FIELDS)
    assignments = ", ".join(f"{connection.ops.quote_name(c)} = %s" for c in columns)
    # S608: table and column names are the model's own, never input; values are parameters.
    sql = f"UPDATE {connection.ops.quote_name(table)} SET {assignments} WHERE id = %s"  # noqa: S608
    params = [[getattr(row, name) for name in _USAGE_FIELDS] + [row.pk] for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


# --- list prices -------------------------------------------------------------------------------


def _require_operator_admin(principal: Principal) -> None:
    if principal.role != Role.OPERATOR_ADMIN:
        raise NotAllowed("only operator admins set list prices")


def set_list_price(
    principal: Principal, *, gpu_model: str, price_per_gpu_hour: Decimal, currency: str = "USD"
) -> GpuListPrice:
    """Create or change the operator's list price per GPU-hour for one GPU model."""
    _require_operator_admin(principal)
    gpu_model = gpu_model.strip()
    if not gpu_model:
        raise TenancyError("gpu_model is required (the model name as NVML reports it)")
    if price_per_gpu_hour <= 0:
        raise TenancyError(f"price_per_gpu_hour must be > 0, got {price_per_gpu_hour}")
    currency = currency.strip().upper()
    if len(currency) != 3 or not currency.isalpha():
        raise TenancyError(f"currency must be a 3-letter ISO code, got {currency!r}")
    with tenant_context(principal.operator_id):
        price, created = GpuListPrice.objects.update_or_create(
            operator_id=principal.operator_id,
            gpu_model=gpu_model,
            defaults={"price_per_gpu_hour": price_per_gpu_hour, "currency": currency},
        )
        detail = {"gpu_model": gpu_model, "price_per_gpu_hour": str(price_per_gpu_hour)}
        action = "gpu_price.create" if created else "gpu_price.update"
        record_audit(
            principal, action, "gpu_price", price.pk, detail={**detail, "currency": currency}
        )
    return price


def delete_list_price(principal: Principal, price_id: int) -> None:
    _require_operator_admin(principal)
    with tenant_context(principal.operator_id):
        deleted, _ = (
            GpuListPrice.objects.for_tenant(principal.operator_id).filter(pk=price_id).delete()
        )
        if deleted:
            record_audit(principal, "gpu_price.delete", "gpu_price", price_id)
    if not deleted:
        raise TenancyError(f"no list price {price_id}")
