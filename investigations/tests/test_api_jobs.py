"""/api/v1/jobs/, /jobs/<job_id>/ and /jobs/<job_id>/series/ on real stored runs: simulated
training jobs stored through ingest's services and evaluated by the live pipeline, read back
over HTTP with API tokens. Who sees what (another operator, a sibling customer), the filters,
bad parameters, the series' downsampling against the raw samples, and query counts that do not
grow with the jobs listed."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from contract import signals
from contract.wire.encode import BatchBuilder
from ingest import selectors as ingest_selectors
from ingest import services as ingest_services
from ingest.models import Job
from ingest.processing import Limits, decode_batch
from investigations import selectors_jobs, window_cache
from investigations import services as inv_services
from investigations.selectors import real_price_for
from investigations.selectors_jobs import MAX_POINTS, bucket_stats, rollup_buckets
from investigations.tests.live_helpers import GPU_MODEL, job_pk, store_gpu_job, store_sim
from simulator import simulate
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Customer
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db

POWER = signals.DCGM_FI_DEV_POWER_USAGE
TEMP = signals.DCGM_FI_DEV_MEMORY_TEMP
MARK = 12345.0  # a reading no simulated GPU gives


@dataclass
class World:
    a: Tenant
    b: Tenant
    other: Customer  # a's second customer
    mine: str  # a's customer's job (a stored, evaluated run of 1 node x 4 GPUs)
    theirs: str  # the other customer's job
    b_job: str


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _assign(operator_id: int, job_id: str, customer: Customer) -> None:
    # The simulator draws its Slurm ids per seed: the test attributes the stored jobs itself
    # (the mapping rules are tenants' business, tested there).
    with tenant_context(operator_id):
        Job.objects.for_tenant(operator_id).filter(job_id=job_id).update(customer=customer)


def _run(tenant: Tenant, seed: int, agent: str) -> str:
    op = tenant.operator.pk
    sim = store_sim(op, "slow_rank", duration_s=120, seed=seed, agent_id=agent)
    job_id = sim.jobs[0]
    inv_services.evaluate_job(op, job_pk(op, job_id))
    return job_id


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    ingest_selectors.clear_cache()
    window_cache.CACHE.clear()


@pytest.fixture
def world() -> World:
    a, b = make_tenant("jobs-a"), make_tenant("jobs-b")
    admin = a.principal(a.operator_admin)
    inv_services.set_list_price(admin, gpu_model=GPU_MODEL, price_per_gpu_hour=Decimal("2.49"))
    other = tenant_services.do_create_customer(admin, name="Other team", slug="other-team")
    mine = _run(a, 4, "agent-mine")
    theirs = _run(a, 5, "agent-theirs")
    _assign(a.operator.pk, mine, a.customer)
    _assign(a.operator.pk, theirs, other)
    b_job = _run(b, 4, "agent-b")
    return World(a, b, other, mine, theirs, b_job)


def _job_ids(body: dict[str, Any]) -> list[str]:
    return [row["job_id"] for row in body["results"]]


def test_operator_lists_and_reads_jobs_with_ranks_gpus_and_price(world: World) -> None:
    a = world.a
    client = _client(a.api_token(a.operator_support))
    listed = client.get("/api/v1/jobs/")
    assert listed.status_code == 200
    assert sorted(_job_ids(listed.json())) == sorted([world.mine, world.theirs])
    row = next(r for r in listed.json()["results"] if r["job_id"] == world.mine)
    assert row["gpu_count"] == 4 and row["node_count"] == 1
    assert row["customer"]["slug"] == a.customer.slug

    response = client.get(f"/api/v1/jobs/{world.mine}/")
    assert response.status_code == 200
    job = response.json()
    assert [r["rank"] for r in job["ranks"]] == [0, 1, 2, 3]
    assert all(r["node"] and r["gpu"].startswith("GPU-") and r["pid"] for r in job["ranks"])
    assert {g["uuid"] for g in job["gpus"]} == {r["gpu"] for r in job["ranks"]}
    assert {g["model"] for g in job["gpus"]} == {GPU_MODEL}
    assert job["nodes"] == sorted({r["node"] for r in job["ranks"]})
    assert job["state"] and job["kind"] == "training"
    assert job["duration_s"] == pytest.approx(job["data_end"] - job["data_start"], abs=1e-3)
    # The price is the pipeline's real price of the job, against the list price set above.
    with tenant_context(a.operator.pk):
        price = real_price_for(
            a.principal(a.operator_admin), job_pk=job_pk(a.operator.pk, world.mine)
        )
    assert price.productive_share is not None and 0 < price.productive_share <= 1
    assert job["price"]["productive_share"] == pytest.approx(price.productive_share, abs=1e-6)
    # The list cost is summed to 4 decimals before it is divided by the GPU-hours.
    assert abs(Decimal(job["price"]["list_price_per_gpu_hour"]) - Decimal("2.49")) < Decimal(
        "0.001"
    )
    assert job["price"]["effective_price_per_productive_gpu_hour"] == str(
        price.effective_price_per_productive_gpu_hour
    )
    assert job["price"]["currency"] == "USD"
    # The slow rank's verdict is open on the job, by its public id.
    incidents = client.get(f"/api/v1/incidents/?job={world.mine}&state=open").json()["results"]
    assert set(job["open_incidents"]) == {i["id"] for i in incidents} and incidents
    assert row["open_incidents"] == job["open_incidents"]


def test_customer_sees_only_its_own_jobs_and_another_operator_none(world: World) -> None:
    a, b = world.a, world.b
    customer = _session(a.customer_viewer)
    assert _job_ids(customer.get("/api/v1/jobs/").json()) == [world.mine]
    assert customer.get(f"/api/v1/jobs/{world.mine}/").status_code == 200
    for url in (
        f"/api/v1/jobs/{world.theirs}/",
        f"/api/v1/jobs/{world.theirs}/series/?signal={POWER}",
    ):
        response = customer.get(url)
        assert response.status_code == 404, url
        assert world.theirs not in response.content.decode()
    # Naming the sibling customer is refused like naming one that does not exist.
    response = customer.get("/api/v1/jobs/?customer=other-team")
    assert response.status_code == 400
    assert "customer" in response.json()["error"]["fields"]

    other = _client(b.api_token(b.operator_admin))
    # Another operator stored a job with the same id: it sees its own, never a's.
    assert _job_ids(other.get("/api/v1/jobs/").json()) == [world.b_job]
    assert other.get(f"/api/v1/jobs/{world.theirs}/").status_code == 404
    assert other.get(f"/api/v1/jobs/{world.theirs}/series/?signal={POWER}").status_code == 404
    # A foreign job is a 404 before its parameters are looked at.
    assert other.get(f"/api/v1/jobs/{world.theirs}/series/").status_code == 404
    assert customer.get(f"/api/v1/jobs/{world.theirs}/series/?rank=x").status_code == 404
    b_customer = _session(b.customer_viewer)
    assert _job_ids(b_customer.get("/api/v1/jobs/").json()) == []


def test_filters_and_ordering(world: World) -> None:
    a = world.a
    client = _client(a.api_token(a.operator_admin))
    mine = client.get(f"/api/v1/jobs/{world.mine}/").json()
    gpu = mine["ranks"][0]["gpu"]
    node = mine["ranks"][0]["node"]

    def ids(query: str) -> list[str]:
        response = client.get(f"/api/v1/jobs/?{query}")
        assert response.status_code == 200, (query, response.content)
        return _job_ids(response.json())

    assert ids(f"customer={a.customer.slug}") == [world.mine]
    assert ids(f"customer={world.other.pk}") == [world.theirs]
    assert ids(f"gpu={gpu}") == [world.mine]
    assert ids(f"node={node}") == [world.mine]
    assert ids("node=no-such-node") == []
    assert ids(f"q={world.mine[2:]}") == [world.mine]
    assert ids("kind=inference") == []
    assert sorted(ids("kind=training")) == sorted([world.mine, world.theirs])
    assert ids(f"state={mine['state']}&customer={a.customer.slug}") == [world.mine]
    assert ids("since=2100-01-01T00:00:00Z") == []
    assert ids("until=1000") == []
    # A bare date is that day in UTC: since its start, until its end.
    today = datetime.now(UTC).date().isoformat()
    assert sorted(ids(f"since={today}&until={today}")) == sorted([world.mine, world.theirs])
    assert ids("until=2000-01-01") == []
    assert sorted(ids("since=1000&until=4102444800")) == sorted([world.mine, world.theirs])
    assert ids("ordering=job") == sorted([world.mine, world.theirs])
    assert ids("ordering=-job") == sorted([world.mine, world.theirs], reverse=True)
    # Cursor pages: one job a page, the second page holds the other job.
    first = client.get("/api/v1/jobs/?page_size=1&ordering=job").json()
    assert _job_ids(first) == [min(world.mine, world.theirs)] and first["next"]
    second = client.get(first["next"]).json()
    assert _job_ids(second) == [max(world.mine, world.theirs)] and second["next"] is None


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("state=sleeping", "state"),
        ("state=", "state"),  # empty is not "no filter": the schema says what a value is
        ("q=", "q"),
        ("kind=batch", "kind"),
        ("ordering=price", "ordering"),
        ("since=yesterday", "since"),
        ("until=2026-01-01T00:00:00", "until"),  # no zone
        ("since=2026-13-01", "since"),
        ("since=0001-01-01", "since"),
        ("since=2000&until=1000", "until"),
        ("customer=nobody", "customer"),
        ("page_size=0", "page_size"),
        ("cursor=garbage", "cursor"),
    ],
)
def test_bad_list_parameters_are_400_naming_them(query: str, name: str) -> None:
    a = make_tenant("jobs-bad")
    response = _client(a.api_token(a.operator_admin)).get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400, response.content
    assert name in response.json()["error"]["fields"]


# --- series ------------------------------------------------------------------------------------


def _raw(operator_id: int, job_id: str, rank_gpu: str, t0: float, t1: float) -> Any:
    [raw] = [
        s
        for s in ingest_selectors.job_series(operator_id, job_id, t0, t1)
        if s.info.name == POWER and s.info.gpu == rank_gpu
    ]
    return raw


def test_series_is_the_raw_samples_downsampled_per_bucket(world: World) -> None:
    a = world.a
    op = a.operator.pk
    client = _client(a.api_token(a.customer_admin, scope="read"))  # a customer: its own job
    job = client.get(f"/api/v1/jobs/{world.mine}/").json()
    rank1_gpu = next(r["gpu"] for r in job["ranks"] if r["rank"] == 1)
    start, end = job["data_start"] + 7.3, job["data_end"]
    response = client.get(
        f"/api/v1/jobs/{world.mine}/series/?signal={POWER}&rank=1&start={start}&end={end}"
        "&resolution=10"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["signal"] == POWER and body["unit"] == "W" and body["resolution"] == 10
    [series] = body["series"]
    assert series["rank"] == 1 and series["gpu"] == rank1_gpu and series["node"]

    raw = _raw(op, world.mine, rank1_gpu, start, end)
    assert len(raw.ts) > 50
    expected: dict[int, list[float]] = {}
    for t, v in zip(raw.ts.tolist(), raw.values.tolist(), strict=True):
        expected.setdefault(math.floor((t - start) / 10), []).append(v)
    keys = sorted(expected)
    assert series["t"] == pytest.approx([start + 10 * k for k in keys], abs=1e-3)
    assert series["count"] == [len(expected[k]) for k in keys]
    assert series["mean"] == pytest.approx([sum(expected[k]) / len(expected[k]) for k in keys])
    assert series["min"] == [min(expected[k]) for k in keys]
    assert series["max"] == [max(expected[k]) for k in keys]
    assert sum(series["count"]) == len(raw.ts)
    assert body["points"] == len(keys)

    # Every rank without ?rank=: one series each, rank order; by GPU: that GPU's only.
    every = client.get(f"/api/v1/jobs/{world.mine}/series/?signal={POWER}&resolution=30").json()
    assert [s["rank"] for s in every["series"]] == [0, 1, 2, 3]
    by_gpu = client.get(f"/api/v1/jobs/{world.mine}/series/?signal={POWER}&gpu={rank1_gpu}")
    assert [s["gpu"] for s in by_gpu.json()["series"]] == [rank1_gpu]
    # A range reaching outside the job is kept to the job's data: before and after it, its
    # GPUs' series (no job key) are whichever job held them then.
    wide = client.get(
        f"/api/v1/jobs/{world.mine}/series/?signal={POWER}&rank=1&resolution=10"
        f"&start={job['data_start'] - 86400}&end={job['data_end'] + 86400}"
    ).json()
    assert wide["start"] == pytest.approx(job["data_start"], abs=1e-3)
    assert wide["end"] == pytest.approx(job["data_end"], abs=1e-3)
    # No resolution: the finest that fits the point budget, never more points than it.
    finest = client.get(f"/api/v1/jobs/{world.mine}/series/?signal={POWER}").json()
    assert 0 < finest["points"] <= MAX_POINTS and finest["resolution"] >= 1


def test_series_of_whole_hours_reads_the_hourly_rollups(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = world.a
    op = a.operator.pk
    hour = int(time.time() * 1000) // 3_600_000 * 3_600_000
    for back in range(2):  # as the ingest-rollups task builds them
        ingest_services.build_rollups(op, hour - back * 3_600_000)
    client = _client(a.api_token(a.operator_admin))
    job = client.get(f"/api/v1/jobs/{world.mine}/").json()
    rank2_gpu = next(r["gpu"] for r in job["ranks"] if r["rank"] == 2)
    end = job["data_end"]
    start = job["data_start"]
    url = f"/api/v1/jobs/{world.mine}/series/?signal={POWER}&gpu={rank2_gpu}&end={end}"
    # A raw read of this job may cover 30 s here: the range is too long at 60 s buckets, and
    # fine at whole hours, which read the rollups.
    monkeypatch.setattr(selectors_jobs, "RAW_NODE_SECONDS", 30.0)
    monkeypatch.setattr(selectors_jobs, "RAW_MIN_RANGE_S", 10.0)
    refused = client.get(f"{url}&start={start}&resolution=60").json()["error"]["fields"]
    assert "start" in refused and "3600" in refused["start"][0]
    response = client.get(f"{url}&start={start}&resolution=3600")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["data_source"] == "hourly rollups" and body["start"] % 3600 == 0
    [series] = body["series"]
    # The same buckets as the raw samples cut into those hours.
    raw = _raw(op, world.mine, rank2_gpu, start, end)
    expected = bucket_stats(raw.ts, raw.values, body["start"], 3600.0)
    assert series["t"] == expected.start.tolist()
    assert series["count"] == expected.count.tolist()
    assert series["mean"] == pytest.approx(expected.mean.tolist())
    assert series["min"] == expected.min.tolist() and series["max"] == expected.max.tolist()


def test_series_keeps_to_the_job_s_own_data() -> None:
    """A GPU's readings without a job key, from before the job (another job's time on that
    GPU), are not the job's: a raw read is kept to the job's data span, and the rollups count
    only whole hours inside it (none, for a job of two minutes)."""
    c = make_tenant("jobs-own")
    op = c.operator.pk
    now = time.time()
    # The run store_sim will store (its hosts and GPUs are the seed's).
    run = simulate("slow_rank", seed=4, duration_s=120, nodes=1, gpus_per_node=4, start_ts=0)
    first = next(r for r in run.records() if r.get("gpu") and r.get("node"))
    node, gpu, index = first["node"], first["gpu"], first["gpu_index"]
    before = np.arange(now - 3000.0, now - 130.0, 10.0)
    builder = BatchBuilder("agent-before")
    identity = {signals.NODE: node, signals.GPU: gpu, signals.GPU_INDEX: index}
    builder.add_samples(TEMP, identity, before, np.full(len(before), MARK))
    ingest_services.store_batch(op, decode_batch(builder.build(1), Limits()))
    job_id = store_sim(op, "slow_rank", duration_s=120, seed=4, end_ts=now).jobs[0]
    hour = int(now * 1000) // 3_600_000 * 3_600_000
    for back in range(2):
        ingest_services.build_rollups(op, hour - back * 3_600_000)
    client = _client(c.api_token(c.operator_admin))
    job = client.get(f"/api/v1/jobs/{job_id}/").json()
    url = f"/api/v1/jobs/{job_id}/series/?signal={TEMP}&gpu={gpu}&start={now - 3000}"
    raw = client.get(f"{url}&resolution=60").json()
    assert raw["start"] == pytest.approx(job["data_start"], abs=1e-3)
    assert raw["start"] > before[-1]
    # The job-less series is the job's (its GPU's) and is read, but holds nothing in range.
    assert len(raw["series"]) >= 2 and [] in [s["count"] for s in raw["series"]]
    assert all(MARK not in s["max"] for s in raw["series"])
    hourly = client.get(f"{url}&resolution=3600").json()
    assert hourly["data_source"] == "hourly rollups"
    assert any(s["count"] for s in hourly["series"])  # the job's own readings
    assert all(MARK not in s["max"] for s in hourly["series"])


def test_series_bad_parameters_are_400_naming_them(world: World) -> None:
    a = world.a
    client = _client(a.api_token(a.operator_admin))
    url = f"/api/v1/jobs/{world.mine}/series/"

    def fields(query: str) -> dict[str, list[str]]:
        response = client.get(f"{url}?{query}")
        assert response.status_code == 400, (query, response.content)
        problems: dict[str, list[str]] = response.json()["error"]["fields"]
        return problems

    unknown = fields("signal=DCGM_FI_NOT_A_SIGNAL")["signal"][0]
    assert "DCGM_FI_NOT_A_SIGNAL" in unknown and POWER in unknown  # it lists the job's signals
    assert "signal" in fields("rank=0")  # required
    assert "rank" in fields(f"signal={POWER}&rank=99")
    assert "rank" in fields(f"signal={POWER}&rank=-1")
    assert "gpu" in fields(f"signal={POWER}&gpu=GPU-nope")
    assert "resolution" in fields(f"signal={POWER}&resolution=0")
    assert "resolution" in fields(f"signal={POWER}&resolution=abc")
    too_fine = fields(f"signal={POWER}&resolution=0.01")["resolution"][0]
    assert str(MAX_POINTS) in too_fine
    assert "start" in fields(f"signal={POWER}&start=not-a-time")
    assert "end" in fields(f"signal={POWER}&start=2000&end=1000")
    assert "end" in fields(f"signal={POWER}&start=1000&end={1000 + 7 * 3600}")  # before the job
    assert "start" in fields(f"signal={POWER}&start=4102444800")  # after the job's data


def test_bucket_stats_unit() -> None:
    ts = np.array([0.0, 0.5, 1.0, 2.5, 2.9, 7.0])
    values = np.array([1.0, 3.0, np.nan, 5.0, -1.0, 4.0])
    out = bucket_stats(ts, values, 0.0, 1.0)
    assert out.start.tolist() == [0.0, 2.0, 7.0]  # NaN dropped, empty buckets omitted
    assert out.mean.tolist() == [2.0, 2.0, 4.0]
    assert out.min.tolist() == [1.0, -1.0, 4.0] and out.max.tolist() == [3.0, 5.0, 4.0]
    assert out.count.tolist() == [2, 2, 1]
    shuffled = bucket_stats(ts[::-1], values[::-1], 0.0, 1.0)  # out of order: same buckets
    assert shuffled.mean.tolist() == [2.0, 2.0, 4.0] and shuffled.count.tolist() == [2, 2, 1]


def test_rollup_buckets_unit() -> None:
    hour_ms = np.array([7_200_000, 0, 3_600_000, 10_800_000], dtype=np.float64)
    out = rollup_buckets(
        hour_ms,
        count=np.array([2, 1, 3, 0]),
        low=np.array([1.0, 5.0, 2.0, 0.0]),
        high=np.array([9.0, 5.0, 4.0, 0.0]),
        total=np.array([10.0, 5.0, 9.0, 0.0]),
        start=0.0,
        resolution=7200.0,
    )
    # Hours 0 and 1 merge; hour 2 alone; hour 3 (no samples) is dropped.
    assert out.start.tolist() == [0.0, 7200.0] and out.count.tolist() == [4, 2]
    assert out.mean.tolist() == [3.5, 5.0]
    assert out.min.tolist() == [2.0, 1.0] and out.max.tolist() == [5.0, 9.0]


# --- queries -----------------------------------------------------------------------------------


def _list_queries(client: APIClient) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/api/v1/jobs/")
    assert response.status_code == 200
    return len(captured), len(response.json()["results"])


def test_list_query_count_does_not_grow_with_jobs() -> None:
    a = make_tenant("jobs-count")
    op = a.operator.pk
    for k in range(2):
        store_gpu_job(op, f"job-{k}", f"agent-{k}")
    client = _client(a.api_token(a.operator_admin))
    _list_queries(client)  # warm: the token's first use records it
    few, listed = _list_queries(client)
    assert listed == 2
    for k in range(2, 8):
        store_gpu_job(op, f"job-{k}", f"agent-{k}")
    many, listed = _list_queries(client)
    assert listed == 8
    assert many == few
    assert few == QUERIES[connection.vendor]


# The request's transaction and the token's lookup (in a system context on PostgreSQL: 3 more
# statements) and the tenant context (1 more on PostgreSQL): 8 on PostgreSQL, 5 on SQLite.
# Then the page of jobs with their figures (one query), their usage grouped per GPU model and
# method (one), the list prices (one), their open incidents (one): 4, whatever the page holds.
QUERIES = {"postgresql": 12, "sqlite": 9}
