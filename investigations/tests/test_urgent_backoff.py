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
from investigations import services
from investigations.signals import evaluation_due
from investigations.tasks import enqueue_evaluation
from investigations.tests.live_helpers import job_pk
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
        cache.delete(services._debounce_key(op, pk, kind))
    cache.delete(services._backoff_key(op, pk))
    cache.delete(services._settled_key(op, pk))
    return op, pk


def _note(op: int, pk: int, capture: Any, *, prompt: bool) -> None:
    now = time.time()
    with capture(execute=True):
        services.note_job_data(
            op, {pk: (now - 1, now)}, urgent_jobs=[pk], prompt_jobs=[pk] if prompt else []
        )


def test_unchanged_outcomes_double_the_interval_up_to_the_cap_and_a_change_resets_it() -> None:
    op, pk = _job("backoff-a")
    key = services._backoff_key(op, pk)
    steps = []
    for _ in range(4):
        services._note_outcome(op, pk, verdicts=False, changed=False)
        steps.append(cache.get(key))
    assert steps == [4.0, 8.0, 8.0, 8.0]
    assert cache.get(services._settled_key(op, pk)) is None  # no verdicts: not settled
    services._note_outcome(op, pk, verdicts=True, changed=True)
    assert cache.get(key) is None
    assert cache.get(services._settled_key(op, pk)) is None  # changed: not settled either
    services._note_outcome(op, pk, verdicts=True, changed=False)
    assert cache.get(services._settled_key(op, pk)) == 1


def test_a_backed_off_job_waits_on_lasting_signs_but_not_on_a_happening(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-b")
    services._note_outcome(op, pk, verdicts=False, changed=False)
    services._note_outcome(op, pk, verdicts=False, changed=False)  # interval now 8 s
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced == [services.URGENT_COUNTDOWN_S]
    time.sleep(services.URGENT_S + 0.2)
    # 2 s later: the 2 s debounce is over, but a lasting sign waits for its 8 s ...
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced[1:] == [services.ROUTINE_COUNTDOWN_S]  # the routine pass only
    # ... while a happening (an event, an error line) is evaluated within seconds.
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    assert announced[2:] == [services.URGENT_COUNTDOWN_S]


def test_without_a_backoff_lasting_signs_keep_the_two_second_cadence(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-c")
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    time.sleep(services.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced == [services.URGENT_COUNTDOWN_S, services.URGENT_COUNTDOWN_S]


def test_a_costly_job_is_evaluated_on_lasting_signs_no_more_often_than_its_cost_allows() -> None:
    op, pk = _job("backoff-d")
    assert services.lasting_interval(op, pk) == services.URGENT_S  # nothing known yet
    # A 4-GPU job's ~20 ms evaluation leaves the backoff alone (2 s, doubling to 8 s) ...
    services._note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.02)
    assert services.lasting_interval(op, pk) == services.URGENT_S
    # ... a 64-GPU job's 120 ms one spaces lasting-sign evaluations 12 s apart, even right
    # after a change reset the backoff ...
    services._note_outcome(op, pk, verdicts=True, changed=True, cpu_s=0.12)
    assert services.lasting_interval(op, pk) == pytest.approx(12.0)
    # ... and a 200-GPU job's 350 ms one leaves them to the routine pass.
    services._note_outcome(op, pk, verdicts=False, changed=False, cpu_s=0.35)
    assert services.lasting_interval(op, pk) == services.ROUTINE_S


def test_a_costly_job_waits_on_lasting_signs_but_not_on_a_happening(
    announced: list[float], django_capture_on_commit_callbacks: Any
) -> None:
    op, pk = _job("backoff-e")
    # A 4-GPU job's evaluation: the next lasting sign is evaluated within seconds.
    services._note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.02)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced == [services.URGENT_COUNTDOWN_S]
    # A 200-GPU job's: counted from that evaluation, lasting signs wait the routine pass ...
    services._note_outcome(op, pk, verdicts=False, changed=True, cpu_s=0.35)
    time.sleep(services.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=False)
    assert announced[1:] == [services.ROUTINE_COUNTDOWN_S]
    # ... and a happening does not.
    time.sleep(services.URGENT_S + 0.2)
    _note(op, pk, django_capture_on_commit_callbacks, prompt=True)
    assert announced[2:] == [services.URGENT_COUNTDOWN_S]


def test_an_evaluation_records_its_cost() -> None:
    op, pk = _job("backoff-f")
    cache.delete(services._cost_key(op, pk))
    result = services.evaluate_job(op, pk)
    assert result.status == "evaluated"
    cost = cache.get(services._cost_key(op, pk))
    assert cost is not None and 0 < cost < 5


def test_the_fan_out_queues_a_job_once_until_its_evaluation_starts() -> None:
    op, pk = _job("backoff-g")
    cache.delete(services._queued_key(op, pk))
    assert services.claim_fan_out(op, pk)
    # The next passes, while that evaluation still waits in the queue: not again.
    assert not services.claim_fan_out(op, pk)
    assert not services.claim_fan_out(op, pk)
    assert services.evaluate_job(op, pk).status == "evaluated"  # it starts: the claim is gone
    assert services.claim_fan_out(op, pk)
