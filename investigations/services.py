"""The live pipeline's writes: job activity from ingest, evaluations, incidents and verdicts.

    ingest announces batch_stored ─► receivers ─► note_job_data() ─► (debounced) evaluate_job
    periodic fan-out ──────► evaluate_job / evaluate_fleet_health tasks
    evaluate_job(): lock ─► window from ingest ─► detectors ─► merge_verdicts() ─► notifications
                                               └► account_usage() (the real price)

docs/live-pipeline.md describes the lifecycle; the numbers below carry their reasons.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
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
from investigations import cadence, live, notifications, pricing, signals, window_cache
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
# Its start moves in whole minutes (window_start).
WINDOW_STEP_S = 60.0
# A finding absent for 10 min of data time resolves its incident. Shorter would flap on
# periodic problems (a checkpoint stall recurs at each save, typically every 10–60 min);
# longer keeps a fixed problem open for no reason.
GRACE_S = 600.0
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
# A verdict revision is kept when the verdict changes in substance: family, category,
# subject, title or recommendation, or confidence moving by at least this much.
CONFIDENCE_STEP = 0.05


def window_start(first_ts: float, t1: float) -> float:
    """The start of a live window ending at `t1`: the job's first data, or once the job is
    longer than WINDOW_S, WINDOW_S before t1 rounded down to a whole WINDOW_STEP_S after the
    first data. A start that moves in whole minutes keeps the window's grid where it was, so
    the next evaluation updates the last one's matrices instead of placing every sample again
    (engine/window_grid.py); the window is up to a minute longer than WINDOW_S."""
    if t1 - first_ts <= WINDOW_S:
        return first_ts
    return first_ts + math.floor((t1 - WINDOW_S - first_ts) / WINDOW_STEP_S) * WINDOW_STEP_S


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
    severe_jobs: Iterable[int] | None = None,
    severe_nodes: Iterable[int] | None = None,
) -> list[int]:
    """Ingest stored data for these jobs (job pk → (first ts, last ts) in the batch), and
    samples without a job on these nodes (node pk → span), which count for the running jobs
    with a rank on the node (a GPU reading the agent could not attribute is still the job's).

    Records the activity (in the caller's transaction, so it commits with the batch) and
    schedules an evaluation of each job: within URGENT_COUNTDOWN_S, at most once per URGENT_S,
    for `urgent_jobs` and the running jobs on `urgent_nodes` (their batch showed a sign) unless
    settled; else at most once per ROUTINE_S. The urgent ones among `prompt_jobs` /
    `prompt_nodes` (a happening, not only a lasting condition; None: all of them) are never
    backed off (URGENT_MAX_S). Of those, the ones not among `severe_jobs` and not on
    `severe_nodes` (their batch showed only notices: a save line, a young job, a corrected
    error counted; None: every prompt one is severe) are held to the notices' share of a
    costly job's CPU (cadence.NOTICE_CPU_SHARE). Returns the job pks it scheduled."""
    now = now or datetime.now(UTC)
    spans = dict(spans)
    urgent = set(urgent_jobs)
    hot_nodes = set(urgent_nodes)
    prompt = set(urgent) if prompt_jobs is None else set(prompt_jobs)
    prompt_on = hot_nodes if prompt_nodes is None else set(prompt_nodes)
    severe = set(prompt) if severe_jobs is None else set(severe_jobs)
    severe_on = prompt_on if severe_nodes is None else set(severe_nodes)
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
                if node_pk in severe_on:
                    severe.add(job_pk)
        if not spans:
            return []
        # In job pk order: concurrent batches of the same jobs lock their activity rows in one
        # order, so neither holds one the other waits for (docs/ingest.md, "Concurrency").
        for job_pk, (first, last) in sorted(spans.items()):
            _widen_activity(operator_id, job_pk, first, last, now)
    try:
        scheduled = cadence.plan_evaluations(operator_id, spans, urgent, prompt, severe)
    except Exception as exc:  # any cache failure: the batch is stored anyway
        # The cadence lives in the cache (Redis in production). With it down the batch must
        # still be stored and acked: its evaluation is left to the fan-out, which evaluates
        # every job whose data no evaluation saw once the broker and cache are back.
        cadence.cache_unavailable(exc)
        return []
    for job_pk, countdown in scheduled:
        transaction.on_commit(
            lambda pk=job_pk, c=countdown: schedule_job_evaluation(operator_id, pk, c),  # type: ignore[misc]
            robust=True,  # a broker that is down after the commit: logged, the batch stays acked
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
        # The earliest since the last consumption (an evaluation clears it): a worker that
        # missed several late batches re-reads from the oldest of them, not from the newest.
        "late_first_ts": Case(
            When(late, then=Least(Coalesce(F("late_first_ts"), Value(first)), Value(first))),
            default=F("late_first_ts"),
        ),
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


def schedule_job_evaluation(
    operator_id: int, job_pk: int, countdown: float = cadence.ROUTINE_COUNTDOWN_S
) -> None:
    """Announce that the job needs an evaluation in `countdown` seconds (the countdown lets it
    see the rest of the debounce period's data too). investigations.tasks answers by enqueuing
    its evaluate_job task: to the broker's workers in production, to the in-process runner's
    workers in the embedded default (proof_web/runner.py). The services never import the
    tasks, which import the services."""
    signals.evaluation_due.send(
        sender=schedule_job_evaluation, operator_id=operator_id, job_pk=job_pk, countdown=countdown
    )


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
    # "evaluated", "busy" (another evaluation holds the lock), "no_data", "unchanged" (an
    # evaluation already saw exactly this data and job state)
    status: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    merge: MergeResult = field(default_factory=MergeResult)
    window: tuple[float, float] | None = None


def _evaluation_cpu_s() -> float:
    """This thread's CPU so far plus what the decode pool spent on its reads: an evaluation's
    cost is the growth of it."""
    return time.thread_time() + ingest_selectors.caller_pool_cpu_s()


def evaluate_job(operator_id: int, job_pk: int) -> EvaluationResult:
    """Run the detectors over the job's sliding window and merge their verdicts.

    Reads and writes are separate short transactions (not one around the detectors): on the
    embedded SQLite a read transaction that later writes fails if ingest committed meanwhile.
    """
    # Out of the queue, whatever comes of it (busy too: the fan-out may queue the next one).
    cache.delete(cadence.queued_key(operator_id, job_pk))
    with cadence.evaluation_lock(f"job:{operator_id}:{job_pk}") as acquired:
        if not acquired:
            return EvaluationResult("busy")
        began_cpu = _evaluation_cpu_s()
        with tenant_context(operator_id):
            job = ingest_selectors.job_by_pk(operator_id, job_pk)
            activity = JobActivity.objects.for_tenant(operator_id).filter(job_id=job_pk).first()
        if job is None or activity is None:
            return EvaluationResult("no_data")
        # What this evaluation would see; one that saw exactly this already decided it (a
        # routine signal's and a fan-out's evaluation queued behind a busy worker, a lock
        # found free after the other ran): the detectors would only repeat themselves.
        seen = (activity.last_data_ts, activity.late_batches, job.state, job.ended_at)
        if cache.get(cadence.seen_key(operator_id, job_pk)) == seen:
            return EvaluationResult("unchanged")
        t1 = activity.last_data_ts
        t0 = window_start(activity.first_data_ts, t1)
        ended = job.state in TERMINAL_JOB_STATES
        entry = window_cache.CACHE.entry(operator_id, job.job_id)
        full_reads = entry.full_reads
        window, verdicts = live.detect_job(
            operator_id,
            job.job_id,
            t0,
            t1,
            job_state=(job.state, job.ended_at, job.world_size, job.rerun_of),
            late=window_cache.LateData(
                activity.late_batches, activity.late_first_ts, activity.late_consumed
            ),
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
            if activity.late_batches != activity.late_consumed:
                # This worker's entry now holds every late batch counted so far: the next
                # ones are told apart from them (unless one came meanwhile: then the earliest
                # still covers both).
                rows.filter(late_batches=activity.late_batches).update(
                    late_first_ts=None, late_consumed=activity.late_batches
                )
        cadence.note_outcome(
            operator_id,
            job_pk,
            bool(verdicts),
            bool(merge.created or merge.revised),
            cpu_s=_evaluation_cpu_s() - began_cpu,
            cold=entry.full_reads != full_reads,
        )
        if not held:  # a held period is evaluated again when the hold is released
            cache.set(cadence.seen_key(operator_id, job_pk), seen, cadence.COST_TTL_S)
        return EvaluationResult("evaluated", verdicts, merge, (t0, t1))


def evaluate_fleet_health(
    operator_id: int, gpu: str, window_s: float = 6 * 3600.0
) -> EvaluationResult:
    """`gpu_degrading` for one GPU over its recent history (one incident per GPU)."""
    with cadence.evaluation_lock(f"gpu:{operator_id}:{gpu}") as acquired:
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
    found = live.detect_node_gpus(operator_id, hostname, window_s)
    with tenant_context(operator_id):
        # A GPU with no finding and no open incident has nothing to merge: nearly every GPU
        # at nearly every pass. Its lock, transaction and merge read were most of a healthy
        # node's pass (8 GPUs x 5 round trips).
        with_open = set(
            Incident.objects.for_tenant(operator_id)
            .filter(
                job__isnull=True,
                family=GPU_DEGRADING,
                state=IncidentState.OPEN,
                subject_gpu__in=[gpu for gpu, _, _ in found],
            )
            .values_list("subject_gpu", flat=True)
        )
    for gpu, (t0, t1), verdicts in found:
        verdicts = [v for v in verdicts if v.get("family") == GPU_DEGRADING]
        if not verdicts and gpu not in with_open:
            results[gpu] = EvaluationResult("evaluated", [], MergeResult(), (t0, t1))
            continue
        with cadence.evaluation_lock(f"gpu:{operator_id}:{gpu}") as acquired:
            if not acquired:
                results[gpu] = EvaluationResult("busy")
                continue
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
