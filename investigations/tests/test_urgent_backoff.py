"""The urgent cadence backs off for lasting signs that change nothing, never for happenings
(investigations/services.py, URGENT_MAX_S; engine/screen.py, Signs.prompt_jobs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache

from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import cadence, services, window_cache
from investigations.models import JobActivity
from investigations.signals import evaluation_due
from investigations.tasks import enqueue_evaluation
from investigations.tests.live_helpers import job_pk
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def announced() -> Iterator[list[float]]:
    """The countdowns of the evaluations announced (no task is enqueued)."""
    countdowns: list[float] = []

    def record(sender: Any, *, countdown: float, **_: Any) -> None:
        countdowns.append(countdown)

    evaluation_due.disconnect(dispatch_uid="investigations.tasks.enqueue_evaluation")
    evaluation_due.connect(record)
    try:
        yield countdowns
    finally:
        evaluation_due.disconnect(record)
        evaluation_due.connect(
            enqueue_evaluation, dispatch_uid="investigations.tasks.enqueue_evaluation"
        )


def _job(slug: str) -> tuple[int, int]:
    op = make_tenant(slug).operator.pk
    ingest_services.store_batch(op, decode_batch(gpu_batch(job="job-b"), Limits()))
    pk = job_pk(op, "job-b")
    for kind in ("urgent", "lasting", "routine"):
        cache.delete(cadence._debounce_key(op, pk, kind))
    cache.delete(cadence._backoff_key(op, pk))
    cache.delete(cadence._settled_key(op, pk))
    return op, pk


def _note(op: int, pk: int, capture: Any, *, prompt: bool, severe: bool = True) -> None:
    now = time.time()
    with capture(execute=True):
        services.note_job_data(
            op,
            {pk: (now - 1, now)},
            urgent_jobs=[pk],
            prompt_jobs=[pk] if prompt else [],
            severe_jobs=[pk] if prompt and severe else [],
        )


def test_unchanged_outcomes_double_the_interval_up_to_the_cap_and_a_change_resets_it() -> None:
    op, pk = _job("backoff-a")
    key = cadence._backoff_key(op, pk)
    steps = []
    for _ in range(4):
        cadence.note_outcome(op, pk, verdicts=False, changed=False)
        steps.append(cache.get(key))
    assert steps == [4.0, 8.0, 8.0, 8.0]
    assert cache.get(cadence._settled_key(op, pk)) is None  # no verdicts: not settled
    cadence.note_outcome(op, pk, verdicts=True, changed=True)
    assert cache.get(key) is None
    assert cache.get(cadence._settled_key(op, pk)) is None  # changed: not settled either
    cadence.note_outcome(op, pk, verdicts=True, changed=False)
    assert cache.get(cadence._settled_key(op, pk)) == 1


def test_a_backed_off_job_waits_on_lasting_signs_but_not_on_a_happening(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-b")
    cadence.note_outcome(op, pk, verdicts=False, changed=False)
    cadence.note_outcome(op, pk, verdicts=False, changed=False)  # interval now 8 s
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced == [cadence.URGENT_COUNTDOWN_S]
    time.sleep(cadence.URGENT_S + 0.2)
    # 2 s later: the 2 s debounce is over, but a lasting sign waits for its 8 s ...
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced[1:] == [cadence.ROUTINE_COUNTDOWN_S]  # the routine pass only
    # ... while a happening (an event, an error line) is evaluated within seconds.
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    assert announced[2:] == [cadence.URGENT_COUNTDOWN_S]


def test_without_a_backoff_lasting_signs_keep_the_two_second_cadence(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-c")
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    time.sleep(cadence.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced == [cadence.URGENT_COUNTDOWN_S, cadence.URGENT_COUNTDOWN_S]


def test_a_costly_job_is_evaluated_on_lasting_signs_no_more_often_than_its_cost_allows() -> None:
    op, pk = _job("backoff-d")
    assert cadence.lasting_interval(op, pk) == cadence.URGENT_S  # nothing known yet
    # A 4-GPU job's ~10 ms evaluation leaves the backoff alone (2 s, doubling to 8 s) ...
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.01)
    assert cadence.lasting_interval(op, pk) == cadence.URGENT_S
    # ... a 64-GPU job's 120 ms one spaces lasting-sign evaluations 24 s apart (0.5% of a
    # core), even right after a change reset the backoff ...
    cadence.note_outcome(op, pk, verdicts=True, changed=True, cpu_s=0.12)
    assert cadence.lasting_interval(op, pk) == pytest.approx(24.0)
    assert cadence.routine_interval(op, pk) == cadence.ROUTINE_S
    # ... and a 200-GPU job's 450 ms one 90 s apart, its routine pass too.
    cadence.note_outcome(op, pk, verdicts=False, changed=False, cpu_s=0.45)
    assert cadence.lasting_interval(op, pk) == pytest.approx(90.0)
    assert cadence.routine_interval(op, pk) == pytest.approx(90.0)
    # Never beyond ROUTINE_MAX_S, however dear (a cold read of a huge job).
    cadence.note_outcome(op, pk, verdicts=False, changed=False, cpu_s=5.0)
    assert cadence.routine_interval(op, pk) == cadence.ROUTINE_MAX_S


def test_the_routine_pass_waits_for_a_costly_job_but_not_for_a_cheap_one() -> None:
    op, pk = _job("backoff-j")
    cache.delete(cadence._evaluated_key(op, pk))
    assert cadence.routine_due(op, pk)  # never evaluated
    now = time.time()
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.01)
    assert not cadence.routine_due(op, pk, now=now + 10)
    assert cadence.routine_due(op, pk, now=now + cadence.ROUTINE_S)
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.45)
    assert not cadence.routine_due(op, pk, now=now + cadence.ROUTINE_S)
    assert cadence.routine_due(op, pk, now=now + 90)


def test_a_costly_job_waits_on_lasting_signs_but_not_on_a_happening(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-e")
    # A 4-GPU job's evaluation: the next lasting sign is evaluated within seconds.
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.01)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced == [cadence.URGENT_COUNTDOWN_S]
    # A 200-GPU job's: counted from that evaluation, lasting signs wait the routine pass ...
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.35)
    time.sleep(cadence.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced[1:] == [cadence.ROUTINE_COUNTDOWN_S]
    # ... and a happening does not: it is announced at once, to run when the job's cost allows
    # (HAPPENING_CPU_SHARE: 0.35 s / 5% = 7 s after that evaluation, >= 4.4 s of it gone).
    time.sleep(cadence.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    assert len(announced) == 3
    assert cadence.URGENT_COUNTDOWN_S <= announced[2] < 7.0 - 2 * cadence.URGENT_S


def test_a_costly_jobs_happenings_are_held_to_its_cost_and_announced_once_per_hold(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-h")
    # A 4-GPU job's ~20 ms evaluation holds nothing: the urgent countdown.
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.02)
    assert cadence.happening_countdown(op, pk) == cadence.URGENT_COUNTDOWN_S
    # A 200-GPU job's 550 ms one: the next happening runs 11 s after it ...
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.55)
    assert 10.0 < cadence.happening_countdown(op, pk) <= 11.0
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    assert len(announced) == 1 and 10.0 < announced[0] <= 11.0
    # ... and the happenings of the batches meanwhile ask for nothing more than the routine
    # pass: that one evaluation will see them.
    time.sleep(cadence.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    assert announced[1:] == [cadence.ROUTINE_COUNTDOWN_S]


def test_a_costly_jobs_notices_wait_longer_than_its_happenings(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-n")
    # A 4-GPU job's ~20 ms evaluation: a save line waits at most the urgent debounce (2 s).
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.02)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True, severe=False)
    assert len(announced) == 1 and announced[0] <= cadence.URGENT_S
    # A 200-GPU job's 450 ms one: a save line runs 45 s after it (1%), an error line 9 s (5%).
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.45)
    notice = cadence.happening_countdown(op, pk, share=cadence.NOTICE_CPU_SHARE)
    assert 44.0 < notice <= 45.0
    assert 8.0 < cadence.happening_countdown(op, pk) <= 9.0
    time.sleep(cadence.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True, severe=False)
    assert len(announced) == 2 and 40.0 < announced[1] <= 45.0


def test_an_evaluation_that_would_see_what_the_last_one_saw_does_not_run() -> None:
    op, pk = _job("backoff-i")
    cache.delete(cadence.seen_key(op, pk))
    assert services.evaluate_job(op, pk).status == "evaluated"
    # The routine signal's and the fan-out's evaluations of the same data: the second is void.
    assert services.evaluate_job(op, pk).status == "unchanged"
    # New data (or a late batch, or the job's state) makes it run again.
    ingest_services.store_batch(
        op, decode_batch(gpu_batch(job="job-b", sequence=2, start=time.time() + 5), Limits())
    )
    assert services.evaluate_job(op, pk).status == "evaluated"


def test_an_evaluation_records_its_cost() -> None:
    op, pk = _job("backoff-f")
    cache.delete(cadence._cost_key(op, pk))
    result = services.evaluate_job(op, pk)
    assert result.status == "evaluated"
    assert cache.get(cadence._evaluated_key(op, pk)) is not None  # when: even a cold one
    ingest_services.store_batch(
        op, decode_batch(gpu_batch(job="job-b", sequence=2, start=time.time() + 5), Limits())
    )
    assert services.evaluate_job(op, pk).status == "evaluated"  # warm: its cost is recorded
    cost = cache.get(cadence._cost_key(op, pk))
    assert cost is not None and 0 < cost < 5


def test_the_fan_out_queues_a_job_once_until_its_evaluation_starts() -> None:
    op, pk = _job("backoff-g")
    cache.delete(cadence.queued_key(op, pk))
    assert cadence.claim_fan_out(op, pk)
    # The next passes, while that evaluation still waits in the queue: not again.
    assert not cadence.claim_fan_out(op, pk)
    assert not cadence.claim_fan_out(op, pk)
    assert services.evaluate_job(op, pk).status == "evaluated"  # it starts: the claim is gone
    assert cadence.claim_fan_out(op, pk)


def test_a_cold_evaluation_is_not_the_jobs_cost() -> None:
    op, pk = _job("backoff-k")
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.02)
    # A worker's first evaluation of the job reads its window in full: several times dearer,
    # and not what the next, warm ones will cost.
    cadence.note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.9, cold=True)
    assert cache.get(cadence._cost_key(op, pk)) == 0.02
    assert cadence.routine_interval(op, pk) == cadence.ROUTINE_S
    # An evaluation of a job whose entry this worker lacks is cold; the next one is warm.
    window_cache.CACHE.drop(op, "job-b")
    cache.delete(cadence.seen_key(op, pk))
    services.evaluate_job(op, pk)
    assert cache.get(cadence._cost_key(op, pk)) == 0.02  # the cold one left the cost alone
    ingest_services.store_batch(
        op, decode_batch(gpu_batch(job="job-b", sequence=3, start=time.time() + 5), Limits())
    )
    services.evaluate_job(op, pk)
    assert cache.get(cadence._cost_key(op, pk)) != 0.02  # the warm one is the cost


def test_an_evaluation_consumes_the_late_batches_its_window_read() -> None:
    op, pk = _job("backoff-l")
    services.evaluate_job(op, pk)
    # Two batches from well before the newest data (stored out of order): counted, the earliest
    # kept; the next evaluation reads them and marks them consumed.
    for seq, back in ((5, 60), (6, 90)):
        ingest_services.store_batch(
            op,
            decode_batch(
                gpu_batch(job="job-b", sequence=seq, seconds=5, start=time.time() - back), Limits()
            ),
        )
    with tenant_context(op):
        a = JobActivity.objects.for_tenant(op).get(job_id=pk)
    assert (a.late_batches, a.late_consumed) == (2, 0)
    assert a.late_first_ts == pytest.approx(time.time() - 90, abs=5)
    assert services.evaluate_job(op, pk).status == "evaluated"
    with tenant_context(op):
        a = JobActivity.objects.for_tenant(op).get(job_id=pk)
    assert (a.late_batches, a.late_consumed, a.late_first_ts) == (2, 2, None)
