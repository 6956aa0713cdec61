"""The embedded default's in-process runner (proof_web/runner.py): the schedule it sends, a
failing task, and a job evaluated end to end with no broker."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, shared_task

from investigations import notifications
from investigations.models import Incident, JobActivity
from investigations.tasks import evaluate_job
from investigations.tests.live_helpers import store_sim
from proof_web.runner import PlannedTask, TaskRunner
from proof_web.schedule import BEAT_SCHEDULE, Periodic
from tenants.context import tenant_context
from tenants.testing import make_tenant

_ran: list[tuple[str, float]] = []
_lock = threading.Lock()


def _record(tag: str) -> str:
    with _lock:
        _ran.append((tag, time.monotonic()))
    return tag


def _boom() -> None:
    with _lock:
        _ran.append(("boom", time.monotonic()))
    raise ValueError("boom: a task that always fails")


# Registered as Celery tasks by a call, not decorator syntax: Celery ships no types, and the
# functions above stay typed.
record: Any = shared_task(name="proof_web.tests.record", ignore_result=True)(_record)
boom: Any = shared_task(name="proof_web.tests.boom", ignore_result=True)(_boom)


@pytest.fixture
def ran() -> Iterator[list[tuple[str, float]]]:
    with _lock:
        _ran.clear()
    yield _ran


class _Recording(TaskRunner):
    """The runner's planning alone: sends are recorded with the clock, not published."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sends: list[tuple[str, float]] = []

    def _send(self, planned: PlannedTask) -> bool:
        self.sends.append((planned.name, self.clock()))
        planned.sent += 1
        return True


def test_the_plan_is_the_schedule_and_each_entry_runs_at_its_own_period() -> None:
    now = [0.0]
    runner = _Recording(clock=lambda: now[0])
    # Every entry of BEAT_SCHEDULE, with its task, period and kwargs: no second list.
    assert [(p.name, p.task, p.every_seconds, p.kwargs) for p in runner.plan] == [
        (name, e.task, e.every_seconds, e.kwargs or {}) for name, e in BEAT_SCHEDULE.items()
    ]
    runner.arm()
    day = 86400.0
    while now[0] <= day:  # a simulated day, waking at each next due time as the thread does
        runner.tick()
        now[0] = min(p.next_due for p in runner.plan)
    for name, entry in BEAT_SCHEDULE.items():
        times = [t for n, t in runner.sends if n == name]
        # First one period after start (as beat), then one period apart.
        assert times == [entry.every_seconds * k for k in range(1, len(times) + 1)], name
        assert len(times) == int(day // entry.every_seconds), name
    # A tick between due times sends nothing; `send_now` sends the entries asked for at once.
    assert runner.tick(now[0] - 1.0) == []
    assert runner.send_now(["ingest-retention"]) == ["ingest-retention"]
    assert len(runner.send_now()) == len(BEAT_SCHEDULE)


@pytest.mark.django_db(transaction=True)
def test_periodic_tasks_run_on_the_worker_at_their_periods(ran: list[tuple[str, float]]) -> None:
    schedule = {
        "fast": Periodic("proof_web.tests.record", 0.2, "test", {"tag": "fast"}),
        "slow": Periodic("proof_web.tests.record", 0.5, "test", {"tag": "slow"}),
    }
    runner = TaskRunner(schedule)
    # Taken before start(): start arms the plan and then starts the worker, which on a loaded
    # machine takes long enough (65 ms in CI) that a clock read after it made the first "slow"
    # look early (0.435 s).
    started = time.monotonic()
    runner.start()
    try:
        with pytest.raises(RuntimeError, match="another in-process task runner"):
            TaskRunner({}).start()
        time.sleep(2.1)
        assert runner.wait_idle(30)
    finally:
        runner.stop()
    fast = [t - started for tag, t in ran if tag == "fast"]
    slow = [t - started for tag, t in ran if tag == "slow"]
    # Each with its own kwargs, at its own period (a loaded machine only runs them late).
    assert 5 <= len(fast) <= 11 and 2 <= len(slow) <= 5, (fast, slow)
    assert len(fast) > len(slow)
    assert min(fast) >= 0.2 - 0.05 and min(slow) >= 0.5 - 0.05
    assert runner.completed["proof_web.tests.record"] == len(fast) + len(slow)
    assert runner.failures == []


@pytest.mark.django_db(transaction=True)
def test_a_failing_task_is_logged_once_and_the_runner_goes_on(
    ran: list[tuple[str, float]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    runner = TaskRunner({"boom": Periodic("proof_web.tests.boom", 0.3, "test")})
    runner.start()
    try:
        time.sleep(1.0)
        record.delay("after")
        assert runner.wait_idle(30)
        booms = runner.plan[0].sent
    finally:
        runner.stop()
    # The periodic task failed at each of its periods and is still being sent: it kills
    # nothing, and each failure ran once (no retry).
    assert booms >= 2
    assert [tag for tag, _ in ran].count("boom") == booms
    assert runner.completed == {"proof_web.tests.boom": booms, "proof_web.tests.record": 1}
    assert (
        runner.failures
        == [("proof_web.tests.boom", "ValueError('boom: a task that always fails')")] * booms
    )
    # One error line per failure, naming the task.
    errors = [r for r in caplog.records if "proof_web.tests.boom" in r.getMessage()]
    assert len(errors) == booms
    assert all(r.levelno == logging.ERROR and r.exc_info for r in errors)
    assert "after" in [tag for tag, _ in ran]  # enqueued between failures: it ran too


def test_refuses_a_real_broker() -> None:
    app = Celery("elsewhere", broker="redis://127.0.0.1:6379/15")
    with pytest.raises(RuntimeError, match="needs the in-process broker"):
        TaskRunner({}, app=app).start()


@pytest.mark.django_db(transaction=True)
def test_embedded_mode_evaluates_a_job_end_to_end_with_no_broker(
    fired: list[notifications.Notification],
) -> None:
    """Data in through ingest's services → ingest's announcement → the debounced
    evaluation_due → evaluate_job on the runner's worker → an incident and its notification."""
    a = make_tenant("runner-e2e")
    op = a.operator.pk
    with TaskRunner() as runner:
        sim = store_sim(op, "sequence_imbalance")
        assert runner.wait_idle(120)
        assert runner.completed[evaluate_job.name] >= 1
        assert runner.failures == []
    with tenant_context(op):
        activity = JobActivity.objects.for_tenant(op).get()
        families = set(Incident.objects.for_tenant(op).values_list("family", flat=True))
    assert activity.evaluated_through_ts is not None
    assert families == sim.offline_families[sim.jobs[0]] == {"sequence_imbalance"}
    assert [(n.family, n.kind) for n in fired] == [("sequence_imbalance", "new")]
