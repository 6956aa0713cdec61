"""/health/: GPUs degrading (the fleet-health pass over simulated degrading GPUs) or failing (a
hardware fault the job detectors found), ranked by drain urgency, with trend charts of the
counters their verdicts cite read from ingest's hourly rollups; operators only, never another
operator's GPUs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from django.test import Client

from contract import signals
from frontend.tests.fleet_world import (
    by_vendor,
    clear_process_caches,
    degrading_gpus,
    roll_up,
    store_and_evaluate,
    store_gpu,
)
from ingest import selectors as ingest_selectors
from ingest.models import Event
from investigations import services
from investigations.models import GPU_DEGRADING, Incident, IncidentState
from investigations.tests.live_helpers import verdict
from tenants.context import tenant_context
from tenants.testing import TEST_PASSWORD, Tenant, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    clear_process_caches()


@dataclass
class World:
    a: Tenant
    b: Tenant
    degrading: list[str]
    faulty: str  # the GPU a hardware fault hit
    fault_job: str
    b_degrading: list[str]


def _fault_gpu(tenant: Tenant, job: str) -> str:
    with tenant_context(tenant.operator.pk):
        incident = Incident.objects.for_tenant(tenant.operator.pk).get(
            job__job_id=job, family="hardware_fault", state=IncidentState.OPEN
        )
    return incident.subject_gpu


@pytest.fixture
def world() -> World:
    a, b = make_tenant("health-a"), make_tenant("health-b")
    op = a.operator.pk
    degrading = degrading_gpus(op, seed=1)
    [fault_job], _ = store_and_evaluate(op, "hardware_fault", 1, "agent-fault")
    roll_up(op)
    b_degrading = degrading_gpus(b.operator.pk, seed=2)
    roll_up(b.operator.pk)
    return World(a, b, degrading, _fault_gpu(a, fault_job), fault_job, b_degrading)


def _client(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def _chart(body: str, chart_id: str) -> dict[str, Any]:
    match = re.search(rf'<script id="{chart_id}" type="application/json">(.*?)</script>', body)
    assert match, chart_id
    spec: dict[str, Any] = json.loads(match.group(1))
    return spec


def test_operator_sees_gpus_at_risk_ranked_with_their_trends(world: World) -> None:
    a = world.a
    op = a.operator.pk
    response = _client(a.operator_admin).get("/health/")
    assert response.status_code == 200
    body = response.content.decode()
    data = response.context["data"]
    assert data.summary.gpus == len(world.degrading) + 1
    assert (data.summary.failing, data.summary.degrading) == (1, len(world.degrading))
    # Drain advice: the GPU a fault already hit first, then the degrading ones.
    ranked = [(g.gpu, g.tier) for g in data.gpus]
    assert ranked[0] == (world.faulty, 1)
    assert {g for g, _t in ranked[1:]} == set(world.degrading)
    assert all(t == 2 for _g, t in ranked[1:])  # the simulated GPUs show >= 3 signs
    assert [g.rank for g in data.gpus] == list(range(1, len(ranked) + 1))
    assert "Drain now" in body and "Drain at the next job boundary" in body
    # The faulted GPU's XID events, counted per hour from ingest's events.
    faulty = data.gpus[0]
    assert faulty.incidents[0].job == world.fault_job
    with tenant_context(op):
        xids = Event.objects.for_tenant(op).filter(gpu=world.faulty, name="xid").count()
    [xid_trend] = [t for t in faulty.trends if t.key == "event: xid"]
    assert xids >= 1 and xid_trend.increase == xids
    assert sum(_chart(body, xid_trend.chart_id)["series"][0]["values"]) == xids
    # A degrading GPU: a chart per counter its verdict cites, whose hourly level is the
    # counter's highest sample of that hour, read back from the raw samples.
    gpu = next(g for g in data.gpus if g.gpu == world.degrading[0])
    with tenant_context(op):
        incident = Incident.objects.for_tenant(op).get(subject_gpu=gpu.gpu, family=GPU_DEGRADING)
    cited = {
        e["signal"] for e in incident.verdict["evidence"] if e["signal"] in signals.GPU_COUNTERS
    }
    assert cited and cited <= {t.key for t in gpu.trends}
    series = ingest_selectors.gpu_series(op, gpu.gpu, 0, 4e9)
    for trend in gpu.trends:
        if trend.key not in cited:
            continue
        samples = np.concatenate([s.values for s in series if s.info.name == trend.key])
        assert trend.last == samples.max()
        assert trend.increase == pytest.approx(samples.max() - trend.first)
        spec = _chart(body, trend.chart_id)
        assert [v for v in spec["series"][0]["values"] if v is not None][-1] == samples.max()
        assert len(spec["x"]) <= 600 and spec["interval"] is not None
    assert incident.verdict["recommendation"] in body
    # Never another operator's.
    for other in world.b_degrading:
        assert other not in body
    assert "health-b" not in body


def test_two_signs_rank_after_three(world: World) -> None:
    """A GPU degrading with two signs (the detector's least) is to be diagnosed, after the
    ones with three or more, which are drained at the next job boundary."""
    op = world.a.operator.pk
    gpu = "GPU-two-signs"
    store_gpu(op, node="health-two-1", gpu=gpu, index=3, readings={signals.DCGM_FI_DEV_GPU_UTIL: 0})
    two = verdict("gpu_degrading", "infrastructure", job=None, gpu=gpu, confidence=0.85)
    two["subject"]["node"] = "health-two-1"
    two["evidence"] = [
        {**two["evidence"][0], "id": f"e{k}", "signal": name, "observed": 3.0, "baseline": 0.0}
        for k, name in enumerate(
            (signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER), 1
        )
    ]
    with tenant_context(op):
        services.merge_verdicts(op, [two], window_end=two["interval"]["end"], gpu=gpu)
    data = _client(world.a.operator_admin).get("/health/").context["data"]
    tiers = [(g.gpu, g.tier) for g in data.gpus]
    assert tiers[-1] == (gpu, 3) and tiers[0] == (world.faulty, 1)
    assert {t for _g, t in tiers[1:-1]} == {2}
    assert data.gpus[-1].action == "Schedule diagnostics" and data.gpus[-1].index == 3


def test_customers_get_404_and_another_operator_sees_only_its_own(world: World) -> None:
    for user in (world.a.customer_viewer, world.a.customer_admin):
        assert _client(user).get("/health/").status_code == 404
    response = _client(world.b.operator_support).get("/health/")
    assert response.status_code == 200
    assert [g.gpu for g in response.context["data"].gpus] == world.b_degrading
    body = response.content.decode()
    assert world.faulty not in body and all(g not in body for g in world.degrading)


@pytest.mark.parametrize(
    ("query", "name"),
    [("days=0", "days"), ("days=15", "days"), ("days=x", "days"), ("page=0", "page")],
)
def test_bad_parameters_are_400_naming_the_parameter(query: str, name: str) -> None:
    a = make_tenant("health-bad")
    response = _client(a.operator_admin).get(f"/health/?{query}")
    assert response.status_code == 400
    assert f"<code>{name}</code>" in response.content.decode()


def test_pages(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from frontend.selectors import health as health_selectors

    monkeypatch.setattr(health_selectors, "PER_PAGE", 1)
    client = _client(world.a.operator_admin)
    first = client.get("/health/").context["data"]
    second = client.get("/health/?page=2").context["data"]
    assert [g.gpu for g in first.gpus] == [world.faulty]
    assert [g.rank for g in second.gpus] == [2] and first.pages == 1 + len(world.degrading)
    assert client.get("/health/?page=50").context["data"].gpus == []


def test_query_count_does_not_grow_with_gpus(django_assert_num_queries: Any, world: World) -> None:
    client = _client(world.a.operator_admin)
    client.get("/health/")
    with django_assert_num_queries(by_vendor(QUERIES)):
        client.get("/health/")
    op = world.a.operator.pk
    more = degrading_gpus(op, seed=2)
    roll_up(op)
    assert len(client.get("/health/").context["data"].gpus) == len(world.degrading) + 1 + len(more)
    with django_assert_num_queries(by_vendor(QUERIES)):
        client.get("/health/?days=7")


# Signing in and the request's tenant context: 11 on PostgreSQL, 7 on SQLite (see
# test_fleet_page). The page: the summary, the page's GPUs ranked, where they are, the jobs
# holding them, their incidents, the counters' rollups, the events per hour: 7. The days-ahead
# section: the flagged forecasts, and for the drain plan the flagged forecasts again and the
# running jobs (their processes only when there are any), inside their tenant contexts: 4.
QUERIES = {"postgresql": 22, "sqlite": 18}
