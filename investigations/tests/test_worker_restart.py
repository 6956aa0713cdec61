"""Issue 18: a restart of the workers mid-incident loses no verdict and duplicates none.

Real `celery -A proof_web.celery:app worker` processes (prefork, on a private Redis database
and this run's test database: investigations/tests/celery_workers.py) run the live pipeline
while the test stores two simulated jobs through ingest's real services in data-time slices
and plays beat (the job fan-out, every BEAT_S), and forwards the ingest signal's countdown
evaluations to the broker, as production's enqueue does:

1. job A (hardware_fault) is stored up to past its onset, job B (collective_hang) up to
   before its onset; the worker opens A's incident (one `new` notification);
2. the worker is SIGKILLed with its pool processes — idle, or in the middle of an evaluation
   of A (stopped inside the evaluation lock: investigations/tests/worker_hold.py);
3. with no worker running, the rest of both jobs is stored: A's fault goes on, B's starts —
   B's verdict is due while the workers are down (beat keeps sending the fan-out);
4. a fresh worker starts. Within RECOVERY_S of its start every job must be evaluated through
   its last data and B's incident exist; then: A is still exactly one open incident with
   consecutive revisions, one notification per (incident, kind), and the GPU time of each job
   equals one pass over its data (no sample counted twice across the restart).

A third test stalls an evaluation past LOCK_TTL_S instead of killing it: when it finally
commits, after another evaluation of the job's newer data, it must count no GPU time twice.

The in-flight kill leaves the evaluation lock of A (a cache key with LOCK_TTL_S expiry, in
Redis) behind; the new worker's evaluations of A answer `busy` until it expires, so RECOVERY_S
fails this test where LOCK_TTL_S is much longer than it (investigations/services.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from investigations import cadence, live, pricing, services
from investigations.models import (
    Incident,
    IncidentState,
    JobActivity,
    JobGpuUsage,
    NotificationLog,
    RevisionKind,
    VerdictRevision,
)
from investigations.signals import evaluation_due
from investigations.tests.celery_workers import (
    SlicedRun,
    Worker,
    private_redis,
    sender,
    wait_for,
    worker_env,
)
from investigations.tests.live_helpers import job_pk
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BEAT_S = 2.0  # the test's beat: production's fan-out period is 15 s; faster keeps it short
RECOVERY_S = 60.0  # after the fresh worker is ready: every verdict due is there by then
DURATION_S = 240.0


class Pipeline:
    """The test's side of production: beat, the forwarded ingest signal, the workers."""

    def __init__(self, tmp_path: Path, redis_url: str) -> None:
        self.tmp_path = tmp_path
        self.redis_url = redis_url
        self.hold_dir = tmp_path / "hold"
        self.hold_dir.mkdir()
        self.app = sender(redis_url)
        self.env = worker_env(redis_url, self.hold_dir)
        self.workers: list[Worker] = []
        self.last_beat = 0.0
        evaluation_due.connect(self._forward, weak=False, dispatch_uid=id(self))

    def _forward(
        self, sender: Any, *, operator_id: int, job_pk: int, countdown: float, **kw: Any
    ) -> None:
        """investigations.tasks.enqueue_evaluation, to the workers' broker (this process's
        Celery configuration is the test's in-process one)."""
        self.app.send_task(
            "investigations.evaluate_job", (operator_id, job_pk), countdown=countdown
        )

    def beat(self) -> None:
        """Send the job fan-out if BEAT_S passed since the last one (workers up or not)."""
        if time.monotonic() - self.last_beat >= BEAT_S:
            self.last_beat = time.monotonic()
            self.app.send_task("investigations.fan_out_job_evaluations")

    def start_worker(self) -> Worker:
        n = len(self.workers)
        worker = Worker(f"restart-{n}", self.env, self.tmp_path / f"worker-{n}.log")
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        evaluation_due.disconnect(dispatch_uid=id(self))
        for worker in self.workers:
            worker.kill()
        (self.hold_dir / "hold").unlink(missing_ok=True)
        self.app.close()
        for worker in self.workers:  # shown with a failure (captured output)
            print(f"--- {worker.log_path.name}\n{worker.log()[-4000:]}")


@pytest.fixture
def pipeline(tmp_path: Path, settings: Any) -> Iterator[Pipeline]:
    with private_redis(settings.REDIS_URL or "redis://127.0.0.1:6379/0") as url:
        p = Pipeline(tmp_path, url)
        try:
            yield p
        finally:
            p.close()


def _incidents(op: int, job: int) -> list[Incident]:
    with tenant_context(op):
        return list(Incident.objects.for_tenant(op).filter(job_id=job).order_by("pk"))


def _activity(op: int, job: int) -> JobActivity:
    with tenant_context(op):
        return JobActivity.objects.for_tenant(op).get(job_id=job)


def _evaluated(op: int, *jobs: int) -> Callable[[], bool]:
    def done() -> bool:
        for job in jobs:
            a = _activity(op, job)
            if a.evaluated_through_ts is None or a.evaluated_through_ts < a.last_data_ts:
                return False
        return True

    return done


def _claims(op: int) -> Counter[tuple[int, str]]:
    """The notifications claimed (NotificationLog rows), per (incident, kind)."""
    with tenant_context(op):
        return Counter(NotificationLog.objects.for_tenant(op).values_list("incident_id", "kind"))


def _usage(op: int, job: int) -> dict[str, float]:
    """GPU-seconds accounted per GPU of the job."""
    with tenant_context(op):
        rows = JobGpuUsage.objects.for_tenant(op).filter(job_id=job)
        return dict(rows.values_list("gpu", "gpu_seconds"))


def _lock_keys(redis_url: str) -> dict[str, int]:
    """The evaluation locks in the workers' Redis, with their remaining TTL (s)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return {k.decode(): int(client.ttl(k)) for k in client.scan_iter("*:lock:job:*")}
    finally:
        client.close()


@pytest.mark.parametrize("kill", ["idle", "in_flight"])
def test_worker_restart_loses_no_verdict_and_duplicates_none(pipeline: Pipeline, kill: str) -> None:
    tenant = make_tenant(f"restart-{kill.replace('_', '-')}")
    op = tenant.operator.pk
    end = time.time()
    a = SlicedRun(op, "hardware_fault", duration_s=DURATION_S, end_ts=end)
    b = SlicedRun(op, "collective_hang", duration_s=DURATION_S, end_ts=end)
    assert a.job != b.job

    # 1. The first worker opens A's incident; B has shown nothing yet.
    first = pipeline.start_worker()
    a.store_until(a.onset + 36.0)
    b.store_until(b.onset - 15.0)
    ja, jb = job_pk(op, a.job), job_pk(op, b.job)
    first.wait_ready()
    wait_for(
        lambda: any(i.family == a.family for i in _incidents(op, ja)),
        60.0,
        "the first worker to open A's incident",
        pipeline.beat,
    )
    wait_for(_evaluated(op, ja, jb), 30.0, "the first worker to evaluate both jobs", pipeline.beat)
    [incident_a] = _incidents(op, ja)
    assert (incident_a.family, incident_a.state) == (a.family, IncidentState.OPEN)
    assert _incidents(op, jb) == []
    assert _claims(op) == {(incident_a.pk, "new"): 1}

    # 2. Kill the worker and its pool: idle, or inside an evaluation of A (holding its lock).
    if kill == "in_flight":
        (pipeline.hold_dir / "hold.tmp").write_text(a.job)
        (pipeline.hold_dir / "hold.tmp").rename(pipeline.hold_dir / "hold")
        a.store_until(a.onset + 66.0)
        wait_for(
            lambda: any(pipeline.hold_dir.glob("held-*")),
            30.0,
            "an evaluation of A to be in flight",
            pipeline.beat,
        )
    first.kill()
    killed_at = time.time()
    (pipeline.hold_dir / "hold").unlink(missing_ok=True)
    locks_left = _lock_keys(pipeline.redis_url)
    if kill == "in_flight":
        assert locks_left, "the killed evaluation held A's lock"

    # 3. No worker: the rest of both jobs arrives; B's fault starts; beat goes on sending.
    stored_before_kill = a.stored_through
    a.store_all()
    b.store_all()
    pipeline.beat()

    # 4. A fresh worker: everything due is evaluated within RECOVERY_S of its start.
    second = pipeline.start_worker()
    ready = second.wait_ready()
    try:
        took = wait_for(
            lambda: _evaluated(op, ja, jb)() and bool(_incidents(op, jb)),
            RECOVERY_S,
            "the fresh worker to evaluate both jobs through their last data",
            pipeline.beat,
        )
    except AssertionError as exc:
        busy = second.log().count("'busy'")
        raise AssertionError(
            f"{exc}: A evaluated through {_activity(op, ja).evaluated_through_ts} of "
            f"{_activity(op, ja).last_data_ts}, B through {_activity(op, jb).evaluated_through_ts}"
            f" of {_activity(op, jb).last_data_ts}, B's incidents {_incidents(op, jb)}; the "
            f"fresh worker's evaluations answered 'busy' {busy} times; locks left by the killed "
            f"worker (key: TTL s) {locks_left} (LOCK_TTL_S = {cadence.LOCK_TTL_S:g})"
        ) from None
    print(f"kill={kill}: recovered {took:.1f} s after the fresh worker was ready")

    # A: still exactly the one incident, open, its revisions consecutive from `created`; the
    # data stored while no worker ran reached it.
    [after] = _incidents(op, ja)
    assert after.pk == incident_a.pk and after.state == IncidentState.OPEN
    assert after.created_at.timestamp() < killed_at
    assert after.last_seen.timestamp() > stored_before_kill
    with tenant_context(op):
        revisions = list(
            VerdictRevision.objects.for_tenant(op)
            .filter(incident_id=after.pk)
            .order_by("number")
            .values_list("number", "kind")
        )
    assert [n for n, _ in revisions] == list(range(1, after.revision + 1))
    assert revisions[0][1] == RevisionKind.CREATED
    assert RevisionKind.RESOLVED not in {k for _, k in revisions}
    # B: the verdict that became due while no worker ran, created by the fresh worker.
    [incident_b] = _incidents(op, jb)
    assert (incident_b.family, incident_b.state) == (b.family, IncidentState.OPEN)
    assert incident_b.created_at.timestamp() >= ready - 1.0
    # One notification per (incident, kind): A's and B's `new`, nothing else.
    with tenant_context(op):
        claims = Counter(NotificationLog.objects.for_tenant(op).values_list("incident_id", "kind"))
    assert claims == {(incident_a.pk, "new"): 1, (incident_b.pk, "new"): 1}

    # GPU time: what the evaluations added up equals one pass over each job's data up to
    # usage_through_ts, which reached SETTLE_S behind the job's last data.
    for run, job in ((a, ja), (b, jb)):
        activity = _activity(op, job)
        through = activity.usage_through_ts
        assert through is not None
        assert through == pytest.approx(activity.last_data_ts - services.SETTLE_S, abs=2.0)
        window, _ = live.detect_job(op, run.job, activity.first_data_ts, activity.last_data_ts)
        want = {s.gpu: s for s in pricing.split_gpu_time(window, until=through)}
        with tenant_context(op):
            got = {u.gpu: u for u in JobGpuUsage.objects.for_tenant(op).filter(job_id=job)}
        assert set(got) == set(want) and want
        for gpu, usage in got.items():
            assert usage.gpu_seconds == pytest.approx(want[gpu].gpu_seconds), (run.job, gpu)
            assert usage.compute_seconds == pytest.approx(want[gpu].compute_seconds, abs=0.01)
            assert usage.idle_seconds == pytest.approx(want[gpu].idle_seconds, abs=0.01)
            assert usage.last_ts is not None and usage.last_ts <= through


def test_an_evaluation_outliving_its_lock_counts_no_gpu_time_twice(pipeline: Pipeline) -> None:
    """The other side of a short LOCK_TTL_S: a worker that is slow, not dead (stopped inside an
    evaluation past its lock's expiry) while another process evaluates the job's newer data,
    then finishes its own, older evaluation."""
    if cadence.LOCK_TTL_S > 45.0:
        pytest.skip(f"LOCK_TTL_S = {cadence.LOCK_TTL_S:g} s: the stall would take that long")
    tenant = make_tenant("restart-stalled")
    op = tenant.operator.pk
    a = SlicedRun(op, "hardware_fault", duration_s=DURATION_S, end_ts=time.time())
    worker = pipeline.start_worker()
    a.store_until(a.onset + 36.0)
    ja = job_pk(op, a.job)
    worker.wait_ready()
    wait_for(_evaluated(op, ja), 60.0, "the worker to evaluate A", pipeline.beat)
    (pipeline.hold_dir / "hold.tmp").write_text(a.job)
    (pipeline.hold_dir / "hold.tmp").rename(pipeline.hold_dir / "hold")
    a.store_until(a.onset + 66.0)
    wait_for(
        lambda: any(pipeline.hold_dir.glob("held-*")), 30.0, "an evaluation of A", pipeline.beat
    )
    # Only the held evaluation stops: the worker's other pool process evaluates the rest once
    # the lock expired.
    pipeline.hold_dir.joinpath("hold").write_text("nobody")
    a.store_all()
    wait_for(
        _evaluated(op, ja),
        cadence.LOCK_TTL_S + 30.0,
        "another evaluation once the lock expired",
        pipeline.beat,
    )
    before = _activity(op, ja)
    counted = _usage(op, ja)
    pipeline.hold_dir.joinpath("hold").unlink()  # the stalled evaluation goes on and commits
    wait_for(
        lambda: _activity(op, ja).evaluated_at != before.evaluated_at,
        20.0,
        "the stalled evaluation to finish",
    )
    after = _activity(op, ja)
    # It saw older data than the evaluation that ran meanwhile: it must count no GPU time that
    # one counted, nor move the job's accounting or evaluation marks back.
    assert _usage(op, ja) == pytest.approx(counted)
    assert (after.usage_through_ts, after.evaluated_through_ts) == (
        before.usage_through_ts,
        before.evaluated_through_ts,
    )
