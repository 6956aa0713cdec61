"""/fleet/: headline cards, the nodes × GPUs heat map and its filters, GPUs idle while holding
memory, from data stored through ingest and evaluated by the live pipeline; operators only,
never another operator's nodes."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from django.test import Client

from contract import signals
from frontend.selectors import fleet as fleet_selectors
from frontend.tests.fleet_world import (
    assign,
    by_vendor,
    clear_process_caches,
    degrading_gpus,
    recent,
    roll_up,
    same_money,
    store_and_evaluate,
    store_gpu,
)
from ingest import selectors as ingest_selectors
from ingest import services as ingest_services
from ingest.models import Gpu, Process
from investigations import selectors as investigation_selectors
from investigations import services
from investigations.models import Incident, IncidentState
from investigations.tests.live_helpers import GPU_MODEL
from tenants.context import tenant_context
from tenants.testing import TEST_PASSWORD, Tenant, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    clear_process_caches()


IDLE_NODE, IDLE_GPU = "alpha-idle-1", "GPU-alpha-idle-0"
SILENT_NODE, SILENT_GPU = "alpha-silent-1", "GPU-alpha-silent-0"
B_NODE, B_GPU = "bravo-node-1", "GPU-bravo-node-0"


@dataclass
class World:
    a: Tenant
    b: Tenant
    job: str  # a's customer's running job
    job_node: str
    degrading: list[str]  # a's GPUs with an open gpu_degrading incident


@pytest.fixture
def world() -> World:
    a, b = make_tenant("fleet-a"), make_tenant("fleet-b")
    op = a.operator.pk
    services.set_list_price(
        a.principal(a.operator_admin), gpu_model=GPU_MODEL, price_per_gpu_hour=Decimal("2.50")
    )
    jobs, _ = store_and_evaluate(op, "healthy_training", 7, "agent-fleet-a")
    assign(op, jobs[0], a.customer)
    degrading = degrading_gpus(op)
    # A GPU holding 30 GiB and running nothing, and a node last heard from an hour ago.
    store_gpu(
        op,
        node=IDLE_NODE,
        gpu=IDLE_GPU,
        index=0,
        readings={
            signals.DCGM_FI_DEV_FB_USED: 30_720.0,
            signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE: 0.0,
            signals.DCGM_FI_DEV_GPU_UTIL: 0.0,
        },
    )
    store_gpu(
        op,
        node=SILENT_NODE,
        gpu=SILENT_GPU,
        index=0,
        readings={signals.DCGM_FI_DEV_GPU_UTIL: 50.0},
        seen=recent(65),
    )
    roll_up(op)
    store_gpu(
        b.operator.pk,
        node=B_NODE,
        gpu=B_GPU,
        index=0,
        readings={signals.DCGM_FI_DEV_FB_USED: 40_000.0, signals.DCGM_FI_DEV_GPU_UTIL: 0.0},
    )
    roll_up(b.operator.pk)
    with tenant_context(op):
        node = (
            Process.objects.for_tenant(op)
            .filter(job__job_id=jobs[0])
            .values_list("node__hostname", flat=True)
            .first()
        )
    assert node is not None
    return World(a, b, jobs[0], node, degrading)


def _client(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def _cell(body: str, gpu: str) -> str:
    match = re.search(
        rf'<td class="hm ([^"]*)" data-gpu="{re.escape(gpu)}" title="([^"]*)">([^<]*)</td>', body
    )
    assert match, f"no cell for {gpu}"
    return " | ".join(match.groups())


def test_operator_sees_cards_heat_map_and_idle_gpus(world: World) -> None:
    a = world.a
    op = a.operator.pk
    admin = a.principal(a.operator_admin)
    response = _client(a.operator_admin).get("/fleet/")
    assert response.status_code == 200
    body = response.content.decode()
    data = response.context["data"]
    cards = data.cards
    with tenant_context(op):
        gpus = Gpu.objects.for_tenant(op).count()
        job_gpus = set(
            Process.objects.for_tenant(op)
            .filter(job__job_id=world.job)
            .exclude(gpu="")
            .values_list("gpu", flat=True)
        )
        open_by_category: dict[str, int] = {}
        for category in (
            Incident.objects.for_tenant(op)
            .filter(state=IncidentState.OPEN)
            .values_list("category", flat=True)
        ):
            open_by_category[category] = open_by_category.get(category, 0) + 1
    assert cards.gpus == gpus >= 4 + len(world.degrading) + 2
    assert cards.gpus_reporting == gpus - 1  # the silent node's GPU
    # In use: the GPUs the running jobs hold (the healthy job's 4, the degrading run's job).
    assert len(job_gpus) == 4 and cards.gpus_in_use >= 4
    assert cards.open_by_category == open_by_category
    assert open_by_category.get("infrastructure", 0) >= len(world.degrading) >= 1
    fleet = investigation_selectors.real_price_for(admin)
    assert cards.price.productive_share == pytest.approx(fleet.productive_share)
    assert same_money(
        cards.price.effective_price_per_productive_gpu_hour,
        fleet.effective_price_per_productive_gpu_hour,
    )
    assert f"${cards.price.effective_price_per_productive_gpu_hour:,.2f}" in body
    assert f'data-testid="gpus-seen">{gpus}<' in body
    # Heat map: the job's GPUs coloured by their newest rollup of engine activity — the same
    # mean as the raw samples of that hour give.
    gpu = sorted(job_gpus)[0]
    buckets = ingest_selectors.latest_gpu_buckets(
        op, [signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE], since=0, gpus=[gpu]
    )
    bucket = buckets[(gpu, signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)]
    samples = [
        s
        for s in ingest_selectors.gpu_series(
            op, gpu, bucket.bucket_start, bucket.bucket_start + 3600
        )
        if s.info.name == signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE
    ]
    expected = float(np.mean(np.concatenate([s.values for s in samples])))
    assert 0.05 < expected < 1
    cell = _cell(body, gpu)
    assert f"u{round(expected * 10)} |" in cell
    assert f"utilisation {expected * 100:.0f}% (engine active)" in cell
    assert world.job_node in cell and f"job {world.job} ({a.customer.name})" in cell
    assert cell.endswith(f"| {round(expected * 100)}")
    assert "(NVML utilisation)" in _cell(body, SILENT_GPU)
    # GPUs idle while holding memory: the idle GPU, none of the job's.
    idle = [r.gpu for r in data.idle]
    assert IDLE_GPU in idle and not job_gpus & set(idle)
    [row] = [r for r in data.idle if r.gpu == IDLE_GPU]
    assert row.memory_min_mib == 30_720.0 and row.activity == 0.0 and row.node == IDLE_NODE
    assert "30720 MiB" in body
    # Never another operator's.
    assert B_NODE not in body and B_GPU not in body and "fleet-b" not in body


def test_health_colours_and_filters(world: World) -> None:
    client = _client(world.a.operator_admin)
    body = client.get("/fleet/?colour=health").content.decode()
    for gpu in world.degrading:
        assert _cell(body, gpu).startswith("h-degrading |")
        assert "gpu_degrading" in _cell(body, gpu)
    assert _cell(body, SILENT_GPU).startswith("h-silent |")
    assert _cell(body, IDLE_GPU).startswith("h-ok |")

    def nodes(query: str) -> set[str]:
        response = client.get(f"/fleet/?{query}")
        assert response.status_code == 200
        return {r.hostname for r in response.context["data"].rows}

    every = nodes("")
    assert {world.job_node, IDLE_NODE, SILENT_NODE} <= every
    assert nodes("state=silent") == {SILENT_NODE}
    assert SILENT_NODE not in nodes("state=reporting")
    assert nodes("state=silent&silent_min=120") == set()  # an hour is not silent at 2 h
    with tenant_context(world.a.operator.pk):
        degrading_nodes = set(
            Gpu.objects.for_tenant(world.a.operator.pk)
            .filter(uuid__in=world.degrading)
            .values_list("node__hostname", flat=True)
        )
    assert nodes("state=incident") == degrading_nodes
    assert nodes(f"customer={world.a.customer.pk}") == {world.job_node}
    assert nodes("model=NVIDIA+A100") == set()
    assert nodes(f"model={GPU_MODEL}") == every


def test_pages_of_nodes(world: World, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from frontend.selectors import fleet as fleet_selectors

    monkeypatch.setattr(fleet_selectors, "NODES_PER_PAGE", 2)
    client = _client(world.a.operator_admin)
    first = client.get("/fleet/").context["data"]
    assert len(first.rows) == 2 and first.pages == -(-first.nodes_total // 2)
    second = client.get("/fleet/?page=2").context["data"]
    assert {r.hostname for r in first.rows}.isdisjoint({r.hostname for r in second.rows})
    assert sorted(r.hostname for r in first.rows + second.rows) == [
        r.hostname for r in first.rows + second.rows
    ]
    assert client.get("/fleet/?page=999").context["data"].rows == []


def test_customers_get_404_and_another_operator_sees_only_its_own(world: World) -> None:
    for user in (world.a.customer_viewer, world.a.customer_admin):
        assert _client(user).get("/fleet/").status_code == 404
    response = _client(world.b.operator_admin).get("/fleet/")
    assert response.status_code == 200
    body = response.content.decode()
    assert B_GPU in body and [r.gpu for r in response.context["data"].idle] == [B_GPU]
    assert world.job_node not in body and IDLE_GPU not in body and world.job not in body
    # Another operator's customer id is no filter of ours.
    other = _client(world.b.operator_admin).get(f"/fleet/?customer={world.a.customer.pk}")
    assert other.status_code == 400


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("colour=red", "colour"),
        ("state=dead", "state"),
        ("page=0", "page"),
        ("page=two", "page"),
        ("silent_min=0", "silent_min"),
        ("customer=abc", "customer"),
        ("customer=999999", "customer"),
        ("idle_memory_mib=-5", "idle_memory_mib"),
        ("model=" + "x" * 200, "model"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(query: str, name: str) -> None:
    a = make_tenant("fleet-bad")
    response = _client(a.operator_support).get(f"/fleet/?{query}")
    assert response.status_code == 400
    assert f"<code>{name}</code>" in response.content.decode()


def test_query_count_does_not_grow_with_nodes(django_assert_num_queries: Any, world: World) -> None:
    client = _client(world.a.operator_admin)
    client.get("/fleet/")
    fleet_selectors.clear_idle_cache()
    with django_assert_num_queries(by_vendor(QUERIES)):
        client.get("/fleet/")
    # Within 5 minutes the idle scan (and where those GPUs are, and their jobs) is reused.
    with django_assert_num_queries(by_vendor(QUERIES) - 3):
        client.get("/fleet/?colour=health")
    before = len(client.get("/fleet/").context["data"].rows)
    op = world.a.operator.pk
    for k in range(3):
        store_gpu(
            op,
            node=f"alpha-more-{k}",
            gpu=f"GPU-alpha-more-{k}",
            index=0,
            readings={signals.DCGM_FI_DEV_FB_USED: 2048.0, signals.DCGM_FI_DEV_GPU_UTIL: 0.0},
        )
    roll_up(op)
    fleet_selectors.clear_idle_cache()
    data = client.get("/fleet/").context["data"]
    assert len(data.rows) == before + 3 and len(data.idle) >= 4
    fleet_selectors.clear_idle_cache()
    with django_assert_num_queries(by_vendor(QUERIES)):
        client.get("/fleet/")
    fleet_selectors.clear_idle_cache()
    # A customer filter checks the customer is the operator's first, and a filtered page
    # counts the nodes matching (unfiltered, that is the cards' count): two more.
    with django_assert_num_queries(by_vendor(QUERIES) + 2):
        client.get("/fleet/?colour=health&state=reporting&customer=" + str(world.a.customer.pk))


# Signing in (session, user, the membership in the system context) and the request's tenant
# context: 11 on PostgreSQL (each context sets and resets the row-level-security settings), 7
# on SQLite (plain savepoints). The page: nodes counted, GPUs counted per model (the model
# filter's options too), GPUs in use, list prices, the last day's usage, open verdicts by
# category, customers (7), the page's nodes (1; their count is the cards' unless a filter
# narrows them), the page's GPUs, their utilisation (their series, then those series'
# buckets), their jobs, open infrastructure incidents (5), the idle-while-holding-memory
# scan, those GPUs, their jobs (3, reused for 5 minutes): 16.
QUERIES = {"postgresql": 27, "sqlite": 23}


def test_a_gpu_heard_late_in_an_hour_counts_until_its_samples_leave_the_window() -> None:
    """The heat map asks for the newest bucket holding samples of the last 2 h. A GPU last
    heard at minute 58 of an hour has its samples in that hour's bucket, which starts before
    the window does for most of the next two hours: it still counts (a cut-off on the bucket's
    start dropped it whenever the page was drawn in an hour's first minutes)."""
    a = make_tenant("late-hour")
    op = a.operator.pk
    hour = int(time.time()) // 3600 * 3600 - 3 * 3600
    heard = datetime.fromtimestamp(hour + 58 * 60, UTC)
    store_gpu(
        op,
        node="late-node",
        gpu="GPU-late-0",
        index=0,
        readings={signals.DCGM_FI_DEV_GPU_UTIL: 40.0},
        seen=heard,
    )
    ingest_services.build_rollups(op, hour * 1000)
    name = signals.DCGM_FI_DEV_GPU_UTIL
    inside = heard.timestamp() - 30  # the window starts 28 min into the bucket
    buckets = ingest_selectors.latest_gpu_buckets(op, [name], since=inside, gpus=["GPU-late-0"])
    assert buckets[("GPU-late-0", name)].bucket_start == hour
    assert buckets[("GPU-late-0", name)].mean == pytest.approx(40.0)
    # Once the window starts after the bucket's hour, the GPU has nothing in it.
    after = ingest_selectors.latest_gpu_buckets(op, [name], since=hour + 3600, gpus=["GPU-late-0"])
    assert after == {}
