"""Fleet health a node at a time: the fan-out enqueues one `evaluate_node_health` per node with
recently reported GPUs, which reads the node's health signals and events once and judges each
of its GPUs from them — the same verdicts the per-GPU evaluation gives, the same incidents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from investigations import live, selectors, services
from investigations.models import Incident
from investigations.tasks import fan_out_fleet_health
from investigations.tests.live_helpers import store_sim
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW_S = 6 * 3600.0


def _families(verdicts: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return sorted((v["family"], v["subject"]["gpu"]) for v in verdicts)


def test_a_node_read_once_judges_each_gpu_as_its_own_read_does() -> None:
    op = make_tenant("node-health").operator.pk
    sim = store_sim(op, "gpu_degrading", duration_s=300, nodes=2, gpus_per_node=4)
    assert sim.offline_gpu_families  # the degrading GPU, as `proof analyze` finds it
    nodes = sorted({h for o, h in selectors.nodes_due_for_fleet_health() if o == op})
    assert len(nodes) == 2
    judged: dict[str, list[tuple[str, str | None]]] = {}
    for hostname in nodes:
        for gpu, _window, verdicts in live.detect_node_gpus(op, hostname, WINDOW_S):
            judged[gpu] = _families(verdicts)
    assert len(judged) == 8
    for gpu, families in judged.items():
        alone = live.detect_gpu(op, gpu, WINDOW_S)
        assert alone is not None
        assert families == _families(alone[1]), gpu
    assert {g for g, f in judged.items() if f} == set(sim.offline_gpu_families)


def test_the_fan_out_evaluates_each_node_once_and_opens_one_incident_per_degrading_gpu(
    start_task_worker: Callable[[], Any],
) -> None:
    a, b = make_tenant("node-fan-a"), make_tenant("node-fan-b")
    op = a.operator.pk
    sim = store_sim(op, "gpu_degrading", duration_s=300, nodes=2, gpus_per_node=4)
    store_sim(b.operator.pk, "healthy_training", duration_s=120, agent_id="other-operator")
    runner = start_task_worker()
    for _ in range(2):  # the next pass changes nothing
        enqueued = fan_out_fleet_health()
        assert enqueued == len(selectors.nodes_due_for_fleet_health()) >= 3
        assert runner.wait_idle(120)
    with tenant_context(op):
        rows = sorted(
            Incident.objects.for_tenant(op)
            .filter(job__isnull=True)
            .values_list("subject_gpu", "family", "category")
        )
    assert rows == sorted(
        (gpu, family, "infrastructure")
        for gpu, families in sim.offline_gpu_families.items()
        for family in families
    )
    with tenant_context(b.operator.pk):
        assert not Incident.objects.for_tenant(b.operator.pk).filter(job__isnull=True).exists()


def test_a_node_without_gpus_or_of_another_operator_has_nothing_to_judge() -> None:
    a, b = make_tenant("node-empty-a"), make_tenant("node-empty-b")
    store_sim(a.operator.pk, "healthy_training", duration_s=60)
    hostname = next(h for o, h in selectors.nodes_due_for_fleet_health() if o == a.operator.pk)
    assert services.evaluate_node_health(b.operator.pk, hostname) == {}
    assert services.evaluate_node_health(a.operator.pk, "no-such-node") == {}
    results = services.evaluate_node_health(a.operator.pk, hostname)
    assert results and all(r.status == "evaluated" for r in results.values())
