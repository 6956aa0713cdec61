"""When a job is evaluated: the cadences of the live pipeline, kept in the cache.

A stored batch asks for its jobs' evaluations (`plan_evaluations`, from
`services.note_job_data`): urgent within seconds when the batch showed a sign, backed off for
lasting signs that change nothing, held to each job's cost (JOB_CPU_SHARE, HAPPENING_CPU_SHARE),
settled while a known problem stays known, and routine otherwise; the fan-out's routine pass
(`routine_due`, `claim_fan_out`); the non-blocking evaluation lock. Every piece of state is a
cache key private to this database (Redis in production, shared by every worker; the
process-local cache in the embedded default). docs/live-pipeline.md has the reasons and the
figures.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.cache import cache
from django.db import connection

log = logging.getLogger(__name__)

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
# ...and never more often than its own cost allows: a job's evaluations on lasting signs, and
# its routine ones, may each use at most 0.5% of a core (its last evaluation's CPU /
# JOB_CPU_SHARE seconds apart: the routine pass from ROUTINE_S up to ROUTINE_MAX_S, lasting
# signs up to that). A 4-GPU job's ~20 ms evaluation is not held by it (4 s: lasting signs
# 2-8 s, routine 30 s); a 64-GPU job's ~120 ms one is (24 s); a 200-GPU job's ~450 ms one is
# evaluated every ~90 s unless a happening shows (an event, an error line, a counter that
# moved: HAPPENING_CPU_SHARE). Lasting signs scale with the GPUs compared: of a 25-node job's
# 200 GPUs one nearly always drifts or changes level a little, and the fleet bench's five
# such jobs were evaluated every ~5 s on them (0.35 of its 0.43 cores per 1,000 GPUs); at
# the routine 30 s they still cost 5 x 450 ms / 30 s = 0.075 cores per 1,000 GPUs, most of
# the 0.1 budget, for jobs the screen sees nothing new in. A fault on a large job that shows
# only lasting signs therefore waits up to its cost's interval (docs/live-pipeline.md).
JOB_CPU_SHARE = 0.005
ROUTINE_MAX_S = 120.0
COST_TTL_S = 600.0
# A happening is never dropped, but a costly job's happenings are held to 5% of a core: the
# evaluation they ask for runs once the job's last one is cost / HAPPENING_CPU_SHARE behind
# (one announcement per hold, with that countdown). A 4-GPU job's ~20 ms evaluation is never
# held (0.4 s, under the 2 s debounce); a 200-GPU job's ~550 ms one runs at most every ~11 s.
# On the fleet bench a 200-GPU checkpoint-stall job was evaluated every ~2 s on its save lines
# and hang signs (183 evaluations at 552 ms in 600 s, a third of all detection CPU), and a
# healthy one saving to local disk every 2-3 s on its save lines.
HAPPENING_CPU_SHARE = 0.05
# Notices (engine/screen.py: a save's log line, a young job's first minute, a corrected-error
# counter that moved) are what a healthy job shows in its normal course, so a costly job's are
# held to 1% of a core: its evaluations run once the last one is cost / NOTICE_CPU_SHARE
# behind (a 200-GPU job's ~450 ms one every ~45 s; a 4-GPU job's ~20-30 ms one within 2-3 s).
# On the fleet bench (2026-12-04, 18:31) two healthy 200-GPU jobs took 55 of the 91 s of
# evaluation CPU at the happenings' 5%, every 7-13 s each: one on its save lines, one on its
# nodes' trickling InfiniBand symbol errors.
NOTICE_CPU_SHARE = 0.01
# A fan-out evaluation waiting in the queue keeps the next passes from queueing another for
# the same job, up to this long (a lost task: the next pass after it queues one again).
FAN_OUT_QUEUED_S = 60.0
# An evaluation holding the lock longer than this is presumed dead (its worker was killed):
# evaluations take 0.02–0.5 s (a cold cache of a 200-GPU job: a few seconds), and a killed
# worker's lock must not hold the job's next verdicts back for long. If one ever outlives it,
# a second evaluation runs beside it, which merging tolerates (unique open incidents,
# notification claims).
LOCK_TTL_S = 30.0


# When the cache last failed to plan an evaluation (logged at most once a minute).
_cache_failed_at = [float("-inf")]


def cache_unavailable(exc: Exception) -> None:
    now = time.monotonic()
    if now - _cache_failed_at[0] >= 60.0:
        _cache_failed_at[0] = now
        log.warning(
            "evaluations not scheduled: the cache is unavailable (%s); batches are still "
            "stored, and the fan-out evaluates their jobs once it is back",
            exc,
        )


def plan_evaluations(
    operator_id: int,
    spans: dict[int, tuple[float, float]],
    urgent: set[int],
    prompt: set[int],
    severe: set[int] | None = None,
) -> list[tuple[int, float]]:
    """(job pk, countdown) of the evaluations the batch's jobs are due, by the cadences above
    (the cache holds their debounce, backoff, settle and cost keys). The prompt jobs not in
    `severe` showed only notices (None: every prompt job is severe)."""
    scheduled: list[tuple[int, float]] = []
    for pk in spans:
        urgent_now = pk in urgent and cache.get(_settled_key(operator_id, pk)) is None
        if urgent_now and pk in prompt:
            # One announcement per hold: the debounce lasts until the held evaluation runs.
            share = HAPPENING_CPU_SHARE if severe is None or pk in severe else NOTICE_CPU_SHARE
            countdown = happening_countdown(operator_id, pk, share=share)
            debounce = max(URGENT_S, round(countdown))
            if cache.add(_debounce_key(operator_id, pk, "urgent"), 1, debounce):
                scheduled.append((pk, countdown))
                continue
        elif (
            urgent_now
            and _lasting_due(operator_id, pk)
            and cache.add(_debounce_key(operator_id, pk, "urgent"), 1, URGENT_S)
        ):
            scheduled.append((pk, URGENT_COUNTDOWN_S))
            continue
        routine = max(1, round(routine_interval(operator_id, pk)))  # cache TTLs: whole seconds
        if cache.add(_debounce_key(operator_id, pk, "routine"), 1, routine):
            scheduled.append((pk, ROUTINE_COUNTDOWN_S))
    return scheduled


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


def queued_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-queued", operator_id, job_pk)


def claim_fan_out(operator_id: int, job_pk: int) -> bool:
    """Whether the routine fan-out may enqueue this job's evaluation: not while one it enqueued
    is still waiting in the queue (cleared when any evaluation of the job is taken from the
    queue, even one that finds the job busy; lapses after FAN_OUT_QUEUED_S should that task be
    lost). With the workers behind, each 15 s pass queued the same jobs again, and every copy
    ran (the fleet bench's probe: 200-GPU jobs evaluated
    1-10 s apart while the queue was behind)."""
    return bool(cache.add(queued_key(operator_id, job_pk), 1, FAN_OUT_QUEUED_S))


def _cost_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-cost", operator_id, job_pk)


def _cost(operator_id: int, job_pk: int) -> float:
    """The job's last warm evaluation's thread CPU (0: not known)."""
    return float(cache.get(_cost_key(operator_id, job_pk)) or 0.0)


def _evaluated_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-at", operator_id, job_pk)


def seen_key(operator_id: int, job_pk: int) -> str:
    return _key("eval-seen", operator_id, job_pk)


def happening_countdown(
    operator_id: int,
    job_pk: int,
    now: float | None = None,
    *,
    share: float = HAPPENING_CPU_SHARE,
) -> float:
    """Seconds from now until a happening's (or, with NOTICE_CPU_SHARE, a notice's) evaluation
    of this job may run: the urgent countdown, or later while its last evaluation is less than
    its cost / `share` behind."""
    now = time.time() if now is None else now
    cost = _cost(operator_id, job_pk)
    last = cache.get(_evaluated_key(operator_id, job_pk))
    if last is None or cost <= 0:
        return URGENT_COUNTDOWN_S
    return max(URGENT_COUNTDOWN_S, float(last) + cost / share - now)


def _cost_floor(cpu_s: float) -> float:
    """Seconds between lasting-sign (or routine) evaluations a job costing `cpu_s` allows, up
    to ROUTINE_MAX_S."""
    return min(ROUTINE_MAX_S, cpu_s / JOB_CPU_SHARE)


def routine_interval(operator_id: int, job_pk: int) -> float:
    """Seconds between routine evaluations of a job: ROUTINE_S, or longer for a job whose
    evaluation costs more than JOB_CPU_SHARE of a core at that cadence (up to ROUTINE_MAX_S)."""
    cost = _cost(operator_id, job_pk)
    return max(ROUTINE_S, _cost_floor(cost))


def routine_due(operator_id: int, job_pk: int, now: float | None = None) -> bool:
    """Whether the routine pass may evaluate the job now: its last evaluation (whatever brought
    it) is at least `routine_interval` behind, or unknown."""
    last = cache.get(_evaluated_key(operator_id, job_pk))
    if last is None:
        return True
    now = time.time() if now is None else now
    return now - float(last) >= routine_interval(operator_id, job_pk) - 1.0


def lasting_interval(operator_id: int, job_pk: int) -> float:
    """Seconds between evaluations of a job on lasting signs alone: its backed-off interval
    (URGENT_S doubling to URGENT_MAX_S), and at least what its cost allows (JOB_CPU_SHARE),
    up to ROUTINE_MAX_S."""
    backoff = float(cache.get(_backoff_key(operator_id, job_pk)) or URGENT_S)
    cost = _cost(operator_id, job_pk)
    return max(backoff, _cost_floor(cost))


def _lasting_due(operator_id: int, job_pk: int) -> bool:
    """Whether a job whose batch shows only lasting signs is due an urgent evaluation: once
    per `lasting_interval`, kept apart from the prompt signs' 2 s debounce so that a happening
    is never held back by a backoff."""
    interval = max(1, round(lasting_interval(operator_id, job_pk)))  # cache TTLs: whole seconds
    return bool(cache.add(_debounce_key(operator_id, job_pk, "lasting"), 1, interval))


def note_outcome(
    operator_id: int,
    job_pk: int,
    verdicts: bool,
    changed: bool,
    cpu_s: float | None = None,
    *,
    cold: bool = False,
) -> None:
    """After an evaluation: its CPU is the job's cost (JOB_CPU_SHARE); a change resets the
    job's urgent cadence, an unchanged outcome doubles its interval for lasting signs
    (URGENT_MAX_S) and, with verdicts, settles it. A `cold` evaluation (the window read from
    storage in full: a worker's first of the job, after a restart or an eviction) costs
    several times a warm one and is not the job's cost: it would hold the next ones back by
    as much."""
    if cpu_s is not None:
        cache.set(_evaluated_key(operator_id, job_pk), time.time(), COST_TTL_S)
    if cpu_s is not None and not cold:
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
