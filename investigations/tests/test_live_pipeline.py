"""The live path below gRPC: simulated agent data stored by ingest's real services → the
ingest signal → evaluate_job (window from ingest's storage, the real detectors) → incidents,
notifications and GPU-time accounting; the lock and the debounce."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import cadence, notifications, selectors, services
from investigations.models import Incident, JobActivity, JobGpuUsage
from investigations.signals import evaluation_due
from investigations.tasks import evaluate_fleet_health, evaluate_job, fan_out_job_evaluations
from investigations.tests.live_helpers import (
    GPU_MODEL,
    StoredSim,
    job_pk,
    run_together,
    store_sim,
)
from tenants.context import tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _reference_case(slug: str) -> tuple[Tenant, StoredSim, int]:
    """A new tenant with the reference case (a sequence imbalance) stored: the tenant, the
    stored simulation, its job's pk."""
    tenant = make_tenant(slug)
    sim = store_sim(tenant.operator.pk, "sequence_imbalance")
    return tenant, sim, job_pk(tenant.operator.pk, sim.jobs[0])


def test_reference_case_gets_a_verdict_and_live_matches_offline(
    fired: list[notifications.Notification],
) -> None:
    a, imbalance_sim, imbalance = _reference_case("live-a")
    op = a.operator.pk
    healthy_sim = store_sim(op, "healthy_training", seed=7)
    healthy_jobs = {job_pk(a.operator.pk, j): j for j in healthy_sim.jobs}
    # The ingest signal recorded every job's data span; the fan-out would evaluate them all.
    due = selectors.jobs_due_for_evaluation(services.ACTIVE_S)
    assert {(op, imbalance), *((op, j) for j in healthy_jobs)} <= set(due)

    first = services.evaluate_job(op, imbalance)
    assert first.status == "evaluated"
    for job in healthy_jobs:
        assert services.evaluate_job(op, job).status == "evaluated"
    with tenant_context(op):
        incidents = list(Incident.objects.for_tenant(op).select_related("job"))
    live: dict[str, set[str]] = {}
    for i in incidents:
        assert i.job is not None
        live.setdefault(i.job.job_id, set()).add(i.family)
    # The reference case is found live, with the category docs/design.md §6 gives it...
    assert [(i.family, i.category) for i in incidents if i.job_id == imbalance] == [
        ("sequence_imbalance", "job")
    ]
    # ...and live verdicts are exactly what `proof analyze` finds in the same records.
    for sim in (imbalance_sim, healthy_sim):
        for name, families in sim.offline_families.items():
            assert live.get(name, set()) == families, name
    mine = [n for n in fired if n.job == imbalance_sim.jobs[0]]
    assert [(n.family, n.kind) for n in mine] == [("sequence_imbalance", "new")]
    [incident] = [i for i in incidents if i.job_id == imbalance]
    assert incident.verdict["evidence"], "a verdict cites its evidence"
    # Evaluated: no longer due; evaluating again changes nothing and notifies nothing.
    assert (op, imbalance) not in selectors.jobs_due_for_evaluation(services.ACTIVE_S)
    revision = incident.revision
    services.evaluate_job(op, imbalance)
    with tenant_context(op):
        assert Incident.objects.for_tenant(op).get(job_id=imbalance).revision == revision
    assert len([n for n in fired if n.job == imbalance_sim.jobs[0]]) == 1

    # GPU time was accounted per GPU, up to SETTLE_S behind the newest data.
    with tenant_context(op):
        usage = {
            job: list(JobGpuUsage.objects.for_tenant(op).filter(job_id=job))
            for job in (imbalance, *healthy_jobs)
        }
        activity = JobActivity.objects.for_tenant(op).get(job_id=imbalance)
    assert all(len(rows) == 4 for rows in usage.values())
    for rows in usage.values():
        for u in rows:
            assert u.method == "engine+ebpf"
            assert 0 < u.compute_seconds < u.gpu_seconds
            total = u.compute_seconds + u.wait_seconds + u.idle_seconds
            assert total == pytest.approx(u.gpu_seconds, rel=1e-6)
    assert activity.usage_through_ts == pytest.approx(
        activity.last_data_ts - services.SETTLE_S, abs=2.0
    )

    # The straggling job's ranks wait in collectives for the slowest: that time is accounted
    # as waiting, not compute (docs/pricing.md), and the share says so.
    price = selectors.real_price_for(a.principal(a.operator_admin), job_pk=imbalance)
    assert price.productive_share is not None
    assert price.wait_hours / price.gpu_hours >= 0.05
    assert price.productive_share == pytest.approx(price.compute_hours / price.gpu_hours)
    assert price.methods == ("engine+ebpf",)


def test_concurrent_evaluations_of_one_job_run_once(
    fired: list[notifications.Notification],
) -> None:
    a, sim, job = _reference_case("live-b")
    op = a.operator.pk
    expected = len(sim.offline_families[sim.jobs[0]])
    assert expected == 1  # the reference case is found (test above)
    # A held lock: the evaluation is skipped, not queued behind it.
    with cadence.evaluation_lock(f"job:{op}:{job}") as acquired:
        assert acquired
        assert services.evaluate_job(op, job).status == "busy"
    statuses: list[str] = []

    def evaluate(_: int) -> None:
        statuses.append(services.evaluate_job(op, job).status)

    run_together(evaluate, 3)
    assert statuses.count("evaluated") >= 1
    assert "busy" in statuses
    with tenant_context(op):
        assert Incident.objects.for_tenant(op).filter(job_id=job).count() == expected
        gpu_seconds = sum(u.gpu_seconds for u in JobGpuUsage.objects.for_tenant(op))
    assert len([n for n in fired if n.job == sim.jobs[0]]) == expected
    # GPU time is never counted twice, however many evaluations ran.
    services.evaluate_job(op, job)
    with tenant_context(op):
        assert sum(u.gpu_seconds for u in JobGpuUsage.objects.for_tenant(op)) == gpu_seconds


def test_ingest_signal_is_debounced_and_a_worker_runs_the_evaluation(
    start_task_worker: Callable[[], Any], fired: list[notifications.Notification]
) -> None:
    """The announcement is debounced per job, goes through the task (a real Celery worker
    runs it), and the countdown lets the evaluation see the rest of the debounce period."""
    task_worker = start_task_worker()
    a = make_tenant("live-c")
    op = a.operator.pk
    announced: list[tuple[int, int, float, float]] = []

    def record(sender: Any, *, operator_id: int, job_pk: int, countdown: float, **_: Any) -> None:
        announced.append((operator_id, job_pk, countdown, time.monotonic()))

    evaluation_due.connect(record)
    try:
        started = time.monotonic()
        sim = store_sim(op, "sequence_imbalance", seed=3)
        stored_in = time.monotonic() - started
    finally:
        evaluation_due.disconnect(record)
    with tenant_context(op):
        activity = JobActivity.objects.for_tenant(op).get()
    # Twelve batches: one routine announcement (at most one per job per ROUTINE_S), with the
    # countdown that lets it see the job's first seconds; and the batches whose screen showed
    # a sign (the imbalance: GPUs drifting from their peers) announced at most every URGENT_S,
    # to run within seconds.
    routine = [a for a in announced if a[2] == cadence.ROUTINE_COUNTDOWN_S]
    urgent = [a for a in announced if a[2] == cadence.URGENT_COUNTDOWN_S]
    assert len(routine) == 1
    assert len(routine) + len(urgent) == len(announced)
    assert len(urgent) <= 1 + stored_in / cadence.URGENT_S
    assert {(o, j) for o, j, _, _ in announced} == {(op, activity.job_id)}
    assert task_worker.wait_idle(120)
    # The worker ran one evaluate_job per announcement, each after its countdown.
    assert task_worker.completed[evaluate_job.name] == len(announced)
    assert task_worker.failures == []
    assert time.monotonic() - routine[0][3] >= cadence.ROUTINE_COUNTDOWN_S - 0.5
    with tenant_context(op):
        activity = JobActivity.objects.for_tenant(op).get()
    if stored_in < cadence.ROUTINE_COUNTDOWN_S:  # its countdown outlasted the storing
        assert activity.evaluated_through_ts == activity.last_data_ts
    assert selectors.jobs_due_for_evaluation(services.ACTIVE_S) == []
    # Live verdicts = `proof analyze` on the same records.
    expected = sim.offline_families[sim.jobs[0]]
    with tenant_context(op):
        families = set(Incident.objects.for_tenant(op).values_list("family", flat=True))
    assert families == expected
    assert len(fired) == len(expected)


def test_fan_out_task_evaluates_the_jobs_left_unevaluated(
    start_task_worker: Callable[[], Any], fired: list[notifications.Notification]
) -> None:
    a = make_tenant("live-c2")
    op = a.operator.pk
    # Stored while no worker ran: the announcements' messages are gone with the queue (the
    # worker below starts on an empty one), so the job's data stands unevaluated...
    sim = store_sim(op, "sequence_imbalance", seed=3)
    with tenant_context(op):
        activity = JobActivity.objects.for_tenant(op).get()
    assert activity.evaluated_through_ts is None
    assert selectors.jobs_due_for_evaluation(services.ACTIVE_S) == [(op, activity.job_id)]
    # ...which the periodic fan-out task finds, and a real worker evaluates.
    worker = start_task_worker()
    fan_out_job_evaluations.delay()
    assert worker.wait_idle(20), (worker.pending, worker.completed, worker.failures)
    assert worker.completed == {fan_out_job_evaluations.name: 1, evaluate_job.name: 1}
    expected = sim.offline_families[sim.jobs[0]]
    with tenant_context(op):
        families = set(Incident.objects.for_tenant(op).values_list("family", flat=True))
    assert families == expected
    assert len(fired) == len(expected)


def test_real_price_with_list_prices() -> None:
    a = make_tenant("live-d")
    op = a.operator.pk
    job = job_pk(a.operator.pk, store_sim(op, "healthy_training", seed=7).jobs[0])
    services.evaluate_job(op, job)
    admin = a.principal(a.operator_admin)
    with tenant_context(op):
        models = set(JobGpuUsage.objects.for_tenant(op).values_list("gpu_model", flat=True))
    price = selectors.real_price_for(admin, job_pk=job)
    assert price.list_cost is None and price.unpriced_models  # no price set yet
    assert models == {GPU_MODEL}  # from the agents' registration
    services.set_list_price(admin, gpu_model=GPU_MODEL, price_per_gpu_hour=Decimal("2.50"))
    price = selectors.real_price_for(admin, job_pk=job)
    assert price.productive_share is not None and 0 < price.productive_share < 1
    assert price.effective_price_per_productive_gpu_hour is not None
    expected = Decimal("2.50") / Decimal(str(price.productive_share))
    assert float(price.effective_price_per_productive_gpu_hour) == pytest.approx(
        float(expected), rel=1e-3
    )


def test_unattributed_node_samples_extend_only_a_live_job() -> None:
    a = make_tenant("live-e")
    op = a.operator.pk
    t0 = time.time() - 3000
    process = {
        "type": "process",
        "ts": t0,
        "node": "node-a",
        "pid": 11,
        "job": "job-9",
        "rank": 0,
        "gpu": "GPU-node-a-0",
    }

    def store(seq: int, start: float, job: str | None, extra: list[dict[str, object]]) -> None:
        batch = gpu_batch(
            "agent-e",
            seq,
            job=job,
            start=start,
            seconds=10,
            extra_records=extra,
        )
        ingest_services.store_batch(op, decode_batch(batch, Limits()))

    store(1, t0, "job-9", [process])
    job = job_pk(a.operator.pk, "job-9")

    def span() -> tuple[float, float]:
        with tenant_context(op):
            act = JobActivity.objects.for_tenant(op).get(job_id=job)
            return act.first_data_ts, act.last_data_ts

    assert span() == pytest.approx((t0, t0 + 9), abs=0.01)
    # GPU readings without the job, right after: still the job's (its rank is on the node).
    store(2, t0 + 60, None, [])
    assert span()[1] == pytest.approx(t0 + 69, abs=0.01)
    # Ten minutes of silence later: the node runs something else; the job is not revived.
    store(3, t0 + 69 + 600, None, [])
    assert span()[1] == pytest.approx(t0 + 69, abs=0.01)


def test_fleet_health_fan_out_opens_one_incident_per_degrading_gpu(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("live-f")
    op = a.operator.pk
    sim = store_sim(op, "gpu_degrading", duration_s=300)
    assert sim.offline_gpu_families  # the scenario's degrading GPU, as `proof analyze` says
    due = selectors.gpus_due_for_fleet_health()
    ours = [gpu for o, gpu in due if o == op]
    assert set(sim.offline_gpu_families) <= set(ours)
    for _ in range(2):  # the next fan-out tick changes nothing
        for gpu in ours:
            assert evaluate_fleet_health(op, gpu) == "evaluated"
    with tenant_context(op):
        rows = list(
            Incident.objects.for_tenant(op)
            .filter(job__isnull=True)
            .values_list("subject_gpu", "family", "category")
        )
    assert sorted(rows) == sorted(
        (gpu, family, "infrastructure")
        for gpu, families in sim.offline_gpu_families.items()
        for family in families
    )
    assert len([n for n in fired if n.job is None]) == len(rows)
    # Fleet health is the operator's: a customer sees none of it.
    with tenant_context(op):
        assert not Incident.objects.for_tenant(a.principal(a.customer_viewer)).exists()


def test_concurrent_batches_of_one_job_widen_its_span_without_losing_either() -> None:
    a = make_tenant("live-g")
    op = a.operator.pk
    t0 = time.time() - 600
    batches = [
        decode_batch(
            gpu_batch(f"agent-{k}", 1, node=f"node-{k}", job="job-c", start=t0 + 100 * k),
            Limits(),
        )
        for k in range(4)
    ]
    errors = run_together(lambda k: ingest_services.store_batch(op, batches[k]), 4)
    assert errors == []
    with tenant_context(op):
        activity = JobActivity.objects.for_tenant(op).get(job__job_id="job-c")
    assert (activity.first_data_ts, activity.last_data_ts) == pytest.approx(
        (t0, t0 + 309), abs=0.01
    )


def test_evaluation_tasks_take_the_operator_id_first() -> None:
    with pytest.raises(TypeError, match="operator id"):
        evaluate_job("1", 1)
    with pytest.raises(TypeError, match="operator id"):
        evaluate_fleet_health(None, "GPU-1")
    a = make_tenant("live-h")
    assert evaluate_job(a.operator.pk, 999_999) == "no_data"
    assert evaluate_fleet_health(a.operator.pk, "GPU-unknown") == "no_data"
