"""/api/v1/nodes/, /gpus/ and /fleet-health/ on real stored data: a simulated run's nodes and
GPUs registered and stored through ingest's services, a silent node, GPUs with open
infrastructure incidents merged by the live pipeline's service. Operators only: customers are
refused on every one, another operator's nodes and GPUs are 404 and absent from lists. Bad
parameters are 400 naming them; list query counts do not grow with rows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from ingest import selectors as ingest_selectors
from ingest import services as ingest_services
from ingest.models import Gpu
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import services, window_cache
from investigations.models import Incident
from investigations.tests.live_helpers import GPU_MODEL, store_sim, verdict
from tenants.context import tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db

LIVE_JOB = "live-1"


@dataclass
class World:
    a: Tenant
    b: Tenant
    node: str  # a's simulated node (reporting, running a job)
    gpus: list[str]  # its 4 GPUs by index
    job: str  # the simulated run's job (ended)
    silent: str  # a's node last heard from an hour ago
    silent_gpu: str
    b_node: str
    b_gpu: str


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _register(operator_id: int, node: str, gpus: list[str], seen: datetime | None = None) -> None:
    ingest_services.register_agent(
        operator_id,
        agent_id=f"agent-{node}",
        hostname=node,
        agent_version="1.2.3",
        gpus=[{"uuid": g, "index": i, "model": GPU_MODEL} for i, g in enumerate(gpus)],
        now=seen,
    )


def _degrading(operator_id: int, gpu: str, signs: int = 2) -> str:
    """A fleet-health verdict on the GPU, merged as the pipeline merges them; its public id."""
    v = verdict("gpu_degrading", "infrastructure", job=None, gpu=gpu)
    v["evidence"] = [
        {**v["evidence"][0], "id": f"e{k}", "signal": f"DCGM_FI_DEV_SIGN_{k}", "observed": 3}
        for k in range(signs)
    ]
    with tenant_context(operator_id):
        services.merge_verdicts(operator_id, [v], window_end=1_100, gpu=gpu)
    with tenant_context(operator_id):
        incident = Incident.objects.for_tenant(operator_id).get(subject_gpu=gpu)
    return str(incident.public_id)


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    ingest_selectors.clear_cache()
    window_cache.CACHE.clear()


@pytest.fixture
def world() -> World:
    a, b = make_tenant("fleet-a"), make_tenant("fleet-b")
    op = a.operator.pk
    sim = store_sim(op, "healthy_training", duration_s=60, seed=2, agent_id="agent-sim")
    job = sim.jobs[0]
    with tenant_context(op):
        rows = list(
            Gpu.objects.for_tenant(op).order_by("index").values_list("node__hostname", "uuid")
        )
    node = rows[0][0]
    # The simulated run has ended by now; a second job runs on the node's last GPU.
    now = time.time()
    live = [
        {"type": "job", "ts": now - 5, "job": LIVE_JOB, "kind": "training", "state": "running"},
        {
            "type": "process",
            "ts": now - 5,
            "pid": 4242,
            "node": node,
            "gpu": rows[3][1],
            "gpu_index": 3,
            "job": LIVE_JOB,
            "rank": 0,
            "world_size": 1,
        },
    ]
    batch = gpu_batch("agent-live", node=node, job=LIVE_JOB, gpus=1, extra_records=live)
    ingest_services.store_batch(op, decode_batch(batch, Limits()))
    _register(op, "silent-01", ["GPU-silent-0"], seen=datetime.now(UTC) - timedelta(hours=1))
    _register(b.operator.pk, "b-node-01", ["GPU-b-0"])
    return World(
        a, b, node, [u for _n, u in rows], job, "silent-01", "GPU-silent-0", "b-node-01", "GPU-b-0"
    )


def _hostnames(body: dict[str, Any]) -> list[str]:
    return [row["hostname"] for row in body["results"]]


def test_nodes_list_and_detail(world: World) -> None:
    a = world.a
    client = _client(a.api_token(a.operator_support))
    body = client.get("/api/v1/nodes/").json()
    assert _hostnames(body) == sorted([world.node, world.silent])
    node = client.get(f"/api/v1/nodes/{world.node}/").json()
    assert node["state"] == "reporting" and node["last_seen"]
    assert [g["uuid"] for g in node["gpus"]] == world.gpus
    assert [g["index"] for g in node["gpus"]] == [0, 1, 2, 3]
    assert {g["model"] for g in node["gpus"]} == {GPU_MODEL}
    silent = client.get(f"/api/v1/nodes/{world.silent}/").json()
    assert silent["state"] == "silent" and silent["agent_version"] == "1.2.3"
    assert _hostnames(client.get("/api/v1/nodes/?state=silent").json()) == [world.silent]
    assert _hostnames(client.get("/api/v1/nodes/?state=reporting").json()) == [world.node]
    assert _hostnames(client.get(f"/api/v1/nodes/?model={GPU_MODEL}").json()) == sorted(
        [world.node, world.silent]
    )
    assert _hostnames(client.get("/api/v1/nodes/?model=A100").json()) == []


def test_gpus_health_and_current_job(world: World) -> None:
    a = world.a
    op = a.operator.pk
    incident = _degrading(op, world.gpus[1])
    client = _client(a.api_token(a.operator_admin))
    body = client.get("/api/v1/gpus/").json()
    assert sorted(r["uuid"] for r in body["results"]) == sorted([*world.gpus, world.silent_gpu])
    gpu = client.get(f"/api/v1/gpus/{world.gpus[1]}/").json()
    assert gpu["health"] == "degrading" and gpu["incidents"] == ["gpu_degrading"]
    assert gpu["node"] == world.node and gpu["index"] == 1 and gpu["model"] == GPU_MODEL
    assert gpu["current_job"] is None  # the simulated run has ended
    held = client.get(f"/api/v1/gpus/{world.gpus[3]}/").json()
    assert held["current_job"] == {"job_id": LIVE_JOB, "customer": None}
    healthy = client.get(f"/api/v1/gpus/{world.gpus[0]}/").json()
    assert healthy["health"] == "ok" and healthy["incidents"] == []
    assert client.get(f"/api/v1/gpus/{world.silent_gpu}/").json()["health"] == "silent"

    def uuids(query: str) -> list[str]:
        response = client.get(f"/api/v1/gpus/?{query}")
        assert response.status_code == 200, response.content
        return [r["uuid"] for r in response.json()["results"]]

    assert uuids("health=degrading") == [world.gpus[1]]
    assert uuids("health=silent") == [world.silent_gpu]
    assert sorted(uuids("health=ok")) == sorted([world.gpus[0], *world.gpus[2:]])
    assert uuids(f"node={world.silent}") == [world.silent_gpu]
    assert uuids("model=A100") == []

    health = client.get("/api/v1/fleet-health/").json()
    assert health["summary"] == {"gpus": 1, "failing": 0, "degrading": 1, "nodes": 1}
    [at_risk] = health["gpus"]
    assert at_risk["gpu"] == world.gpus[1] and at_risk["node"] == world.node
    assert at_risk["tier"] == 3 and at_risk["action"] == "Schedule diagnostics"
    assert at_risk["running_job"] is None
    assert [i["id"] for i in at_risk["incidents"]] == [incident]
    assert len(at_risk["incidents"][0]["signs"]) == 2
    # Three signs: the next tier, ranked first.
    _degrading(op, world.gpus[2], signs=3)
    ranked = client.get("/api/v1/fleet-health/?days=7").json()
    assert [(g["gpu"], g["tier"]) for g in ranked["gpus"]] == [
        (world.gpus[2], 2),
        (world.gpus[1], 3),
    ]
    assert ranked["days"] == 7 and ranked["pages"] == 1


def test_customers_are_refused_and_another_operator_sees_none_of_them(world: World) -> None:
    a, b = world.a, world.b
    _degrading(a.operator.pk, world.gpus[1])
    urls = (
        "/api/v1/nodes/",
        f"/api/v1/nodes/{world.node}/",
        "/api/v1/gpus/",
        f"/api/v1/gpus/{world.gpus[0]}/",
        "/api/v1/fleet-health/",
    )
    for client in (
        _session(a.customer_viewer),
        _client(a.api_token(a.customer_admin, scope="read")),
    ):
        for url in urls:
            response = client.get(url)
            assert response.status_code == 403, url
            assert world.node not in response.content.decode()
    other = _client(b.api_token(b.operator_admin))
    assert other.get(f"/api/v1/nodes/{world.node}/").status_code == 404
    assert other.get(f"/api/v1/gpus/{world.gpus[0]}/").status_code == 404
    assert _hostnames(other.get("/api/v1/nodes/").json()) == [world.b_node]
    assert [r["uuid"] for r in other.get("/api/v1/gpus/").json()["results"]] == [world.b_gpu]
    assert other.get("/api/v1/fleet-health/").json()["gpus"] == []


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("/api/v1/nodes/?state=asleep", "state"),
        ("/api/v1/gpus/?health=bad", "health"),
        ("/api/v1/gpus/?page_size=501", "page_size"),
        ("/api/v1/fleet-health/?days=0", "days"),
        ("/api/v1/fleet-health/?days=", "days"),
        ("/api/v1/nodes/?model=", "model"),
        ("/api/v1/fleet-health/?days=15", "days"),
        ("/api/v1/fleet-health/?page=x", "page"),
    ],
)
def test_bad_parameters_are_400_naming_them(url: str, name: str) -> None:
    a = make_tenant("fleet-bad")
    response = _client(a.api_token(a.operator_admin)).get(url)
    assert response.status_code == 400, response.content
    assert name in response.json()["error"]["fields"]


def _queries(client: APIClient, url: str) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured), len(response.json()["results"])


@pytest.mark.parametrize(
    ("url", "per_node", "pinned"),
    [
        # Nodes: the page, then the page's GPUs (one prefetch query).
        ("/api/v1/nodes/", 1, {"postgresql": 10, "sqlite": 7}),
        # GPUs: the page with its nodes, the open infrastructure incidents on them, the jobs
        # holding them.
        ("/api/v1/gpus/", 2, {"postgresql": 11, "sqlite": 8}),
    ],
)
def test_list_query_counts_do_not_grow_with_rows(
    url: str, per_node: int, pinned: dict[str, int]
) -> None:
    a = make_tenant("fleet-count")
    op = a.operator.pk
    _register(op, "n-0", ["GPU-n0-0", "GPU-n0-1"])
    client = _client(a.api_token(a.operator_admin))
    _queries(client, url)
    few, rows = _queries(client, url)
    assert rows == per_node
    for k in range(1, 6):
        _register(op, f"n-{k}", [f"GPU-n{k}-0", f"GPU-n{k}-1"])
    _degrading(op, "GPU-n3-1")
    many, rows = _queries(client, url)
    assert rows == 6 * per_node
    assert many == few == pinned[connection.vendor]


def test_fleet_health_query_count_does_not_grow_with_gpus_at_risk() -> None:
    a = make_tenant("fleet-health-count")
    op = a.operator.pk
    _register(op, "h-0", ["GPU-h0-0", "GPU-h0-1", "GPU-h0-2", "GPU-h0-3"])
    _degrading(op, "GPU-h0-0")
    client = _client(a.api_token(a.operator_admin))

    def counted() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as captured:
            response = client.get("/api/v1/fleet-health/")
        assert response.status_code == 200
        return len(captured), len(response.json()["gpus"])

    counted()
    few, rows = counted()
    assert rows == 1
    for gpu in ("GPU-h0-1", "GPU-h0-2", "GPU-h0-3"):
        _degrading(op, gpu, signs=3)
    many, rows = counted()
    assert rows == 4
    assert many == few == HEALTH_QUERIES[connection.vendor]


# The request's own statements (8 on PostgreSQL, 5 on SQLite), the selector's tenant context
# (a savepoint and its release, and on PostgreSQL the settings set and restored: 4, or 2), then
# the summary, the page's GPUs ranked, where they are, the jobs holding them and their
# incidents: 5, whatever the page holds (the rollups and events of cited counters would add one
# query each; these verdicts cite none).
HEALTH_QUERIES = {"postgresql": 17, "sqlite": 12}
