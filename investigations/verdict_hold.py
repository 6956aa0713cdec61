"""Holding an operator's new verdicts back, and evaluating the held period on release.

The layer above decides when (billing's dunning: an unpaid account past its grace period; an
air-gapped site past its licence) and calls these; investigations only obeys. While held,
ingest stores everything and evaluations still run and account GPU time (the operator's
chargeback and the metering must not lose a second), but they merge nothing: no incident, no
revision, no notification. On release, each job with data in the held period is evaluated
over it, window by window in time order as the live pipeline would have, before new verdicts
flow again, so a verdict is delayed by the hold, never lost.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Q

from ingest import selectors as ingest_selectors
from ingest.models import TERMINAL_JOB_STATES
from investigations import live, window_cache
from investigations.cadence import evaluation_lock
from investigations.models import JobActivity, VerdictHold
from investigations.services import (
    WINDOW_S,
    _take_write_lock,
    merge_verdicts,
)
from tenants.context import system_context, tenant_context

log = logging.getLogger(__name__)

# A job's evaluation lock is normally held for well under a second; a replay waits this long
# for a live evaluation of the same job to finish before it gives the job up (and says so).
LOCK_WAIT_S = 30.0


@dataclass(frozen=True)
class HeldPeriodResult:
    jobs: int
    windows: int
    incidents_created: int
    skipped_busy: int


def do_hold_verdicts(operator_id: int, reason: str, now: datetime | None = None) -> VerdictHold:
    """Hold the operator's new verdicts (idempotent: an existing hold keeps its start, takes
    the new reason)."""
    now = now or datetime.now(UTC)
    with tenant_context(operator_id):
        hold, created = VerdictHold.objects.get_or_create(
            operator_id=operator_id, defaults={"reason": reason[:300], "held_since": now}
        )
        if not created and hold.reason != reason[:300]:
            hold.reason = reason[:300]
            hold.save(update_fields=["reason"])
        return hold


def current_hold(operator_id: int) -> VerdictHold | None:
    with tenant_context(operator_id):
        return VerdictHold.objects.for_tenant(operator_id).first()


def holds() -> list[tuple[int, str, datetime]]:
    """(operator id, reason, since) of every hold: cross-tenant on purpose (staff, checks)."""
    with system_context():
        return list(VerdictHold.objects.values_list("operator_id", "reason", "held_since"))


def _windows(first: float, last: float, since: float) -> list[tuple[float, float]]:
    """Consecutive window ends from `since` to the job's last data, each window WINDOW_S long
    (or from the job's first data), the last one ending at `last`."""
    ends: list[float] = []
    t = max(since, first) + WINDOW_S
    while t < last:
        ends.append(t)
        t += WINDOW_S
    ends.append(last)
    return [(max(first, t1 - WINDOW_S), t1) for t1 in ends]


def evaluate_held_period(operator_id: int, since: datetime) -> HeldPeriodResult:
    """Evaluate every job with data since `since`, window by window up to its newest data,
    merging the verdicts (incidents, notifications) the hold kept back. Runs while the hold is
    still in place, so live evaluations merge nothing meanwhile."""
    since_ts = since.timestamp()
    with tenant_context(operator_id):
        activity = list(
            JobActivity.objects.for_tenant(operator_id)
            # Data stamped in the held period, or received during it (an agent's spool
            # shipped late carries older timestamps).
            .filter(Q(last_data_ts__gte=since_ts) | Q(received_at__gte=since))
            .order_by("first_data_ts", "id")
            .values_list("job_id", flat=True)
        )
    windows = created = busy = 0
    for job_pk in activity:
        done = _replay_job(operator_id, job_pk, since_ts)
        if done is None:
            busy += 1
            continue
        windows += done[0]
        created += done[1]
    return HeldPeriodResult(len(activity), windows, created, busy)


def _replay_job(operator_id: int, job_pk: int, since_ts: float) -> tuple[int, int] | None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        with evaluation_lock(f"job:{operator_id}:{job_pk}") as acquired:
            if acquired:
                return _replay_locked(operator_id, job_pk, since_ts)
        if time.monotonic() > deadline:
            log.warning(
                "held-period replay: job %s of operator %s stayed busy", job_pk, operator_id
            )
            return None
        time.sleep(0.2)


def _replay_locked(operator_id: int, job_pk: int, since_ts: float) -> tuple[int, int]:
    with tenant_context(operator_id):
        job = ingest_selectors.job_by_pk(operator_id, job_pk)
        activity = JobActivity.objects.for_tenant(operator_id).filter(job_id=job_pk).first()
    if job is None or activity is None:
        return 0, 0
    ended = job.state in TERMINAL_JOB_STATES
    created = 0
    # At least the job's newest window, when what arrived during the hold is older than it.
    start = min(since_ts, activity.last_data_ts - WINDOW_S)
    spans = _windows(activity.first_data_ts, activity.last_data_ts, start)
    for t0, t1 in spans:
        _window, verdicts = live.detect_job(
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
        with transaction.atomic(), tenant_context(operator_id):
            _take_write_lock()
            merge = merge_verdicts(
                operator_id,
                verdicts,
                window_end=t1,
                job_pk=job_pk,
                ended=ended and t1 >= activity.last_data_ts,
            )
        created += len(merge.created)
    return len(spans), created


def do_release_verdicts(operator_id: int) -> HeldPeriodResult | None:
    """Evaluate the held period, then lift the hold; None if there was none."""
    hold = current_hold(operator_id)
    if hold is None:
        return None
    result = evaluate_held_period(operator_id, hold.held_since)
    with tenant_context(operator_id):
        VerdictHold.objects.for_tenant(operator_id).filter(pk=hold.pk).delete()
    log.info(
        "verdicts of operator %s released after %s: %s jobs, %s windows, %s incidents",
        operator_id,
        hold.reason,
        result.jobs,
        result.windows,
        result.incidents_created,
    )
    return result
