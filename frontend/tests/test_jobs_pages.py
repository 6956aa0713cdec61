"""The jobs list (`/jobs/`) and the job page (`/jobs/<job_id>/`).

The job page is tested on a real run: a simulated 8-rank training job with a slow rank stored
through ingest's services and evaluated by the live pipeline's real detectors; the list on
many cheap job rows. Both: who sees what (another operator's job, a sibling customer's job),
bad parameters, and the number of queries, which must not grow with rows or ranks."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test import Client

from contract.parsers import training as tp
from engine.window import parse_logs
from frontend.selectors import job_detail
from ingest import selectors as ingest_selectors
from ingest import services as ingest_services
from ingest.models import Job, LogLine
from ingest.storage import read_block_payloads
from investigations import services as inv_services
from investigations import window_cache
from investigations.models import Incident, JobActivity, JobGpuUsage
from investigations.pricing import UsageRow, real_price
from investigations.selectors import real_price_for
from investigations.tests.live_helpers import GPU_MODEL, job_pk, store_sim
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Customer
from tenants.testing import TEST_PASSWORD, Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("alpha", "bravo")

# slow_rank seed 4 on 2 nodes x 4 GPUs: the slow rank is rank 5 (its GPU throttled); the
# detectors call it within the 240 s run and the log is nanoGPT-style (loss every 10 steps).
SLOW_SEED = 4


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    """Ingest's process caches of series identities start empty: on SQLite a rolled-back
    test's row ids are given again, and a cached identity would belong to another test."""
    ingest_selectors.clear_cache()
    window_cache.CACHE.clear()


def _login(client: Client, username: str) -> Client:
    assert client.login(username=username, password=TEST_PASSWORD)
    return client


def _chart_specs(body: str) -> dict[str, dict[str, Any]]:
    """The JSON specs the page hands charts.js, by element id."""
    specs = {}
    for chart_id, text in re.findall(
        r'<script id="([^"]+)" type="application/json">(.*?)</script>', body, re.S
    ):
        specs[chart_id] = json.loads(text)
    return specs


def _lane_rows(body: str) -> dict[int, dict[str, Any]]:
    rows = {}
    for rank, compute, slowest in re.findall(
        r'<tr class="lane[^"]*" data-rank="(\d+)" data-compute="([^"]*)" '
        r'data-slowest-steps="(\d+)"',
        body,
    ):
        rows[int(rank)] = {
            "compute": [float(v) for v in compute.split(",")],
            "slowest": int(slowest),
        }
    return rows


def _slow_rank_job(t: Tenant, **kwargs: Any) -> tuple[str, int]:
    """A stored and evaluated slow-rank run of tenant t: its job id and pk."""
    op = t.operator.pk
    sim = store_sim(op, "slow_rank", duration_s=240, seed=SLOW_SEED, **kwargs)
    job_id = sim.jobs[0]
    pk = job_pk(op, job_id)
    assert inv_services.evaluate_job(op, pk).status == "evaluated"
    return job_id, pk


# --- the job page on a real run ----------------------------------------------------------------


def test_job_page_shows_the_slow_rank_the_log_and_the_verdict(client: Client, a: Tenant) -> None:
    op = a.operator.pk
    inv_services.set_list_price(
        a.principal(a.operator_admin), gpu_model=GPU_MODEL, price_per_gpu_hour=Decimal("2.49")
    )
    job_id, pk = _slow_rank_job(a, nodes=2, gpus_per_node=4)
    with tenant_context(op):
        [incident] = Incident.objects.for_tenant(op).filter(job_id=pk)
        lines = list(
            LogLine.objects.for_tenant(op)
            .filter(job_id=pk)
            .order_by("ts_us", "id")
            .values_list("line", flat=True)
        )
    assert incident.family == "slow_rank" and incident.subject_rank is not None
    slow = incident.subject_rank

    response = _login(client, "alpha-op-admin").get(f"/jobs/{job_id}/")
    assert response.status_code == 200
    body = response.content.decode()
    assert f'data-testid="job-id">{job_id}<' in body

    # Lanes: one row per rank, the detectors' slow rank the slowest in (nearly) every step.
    lanes = _lane_rows(body)
    assert sorted(lanes) == list(range(8))
    steps = len(lanes[slow]["compute"])
    assert steps == job_detail.LANE_STEPS
    assert all(len(r["compute"]) == steps for r in lanes.values())
    assert lanes[slow]["slowest"] >= 0.9 * steps
    assert sum(r["slowest"] for r in lanes.values()) <= steps
    assert f"Slowest most often: <strong>rank {slow}</strong>" in body
    # …it computes more of each step than the others, which wait for it.
    mean = {r: sum(v["compute"]) / steps for r, v in lanes.items()}
    assert mean[slow] == max(mean.values())
    assert f'aria-label="rank {slow} · {round(mean[slow] * 100)}% · compute | wait"' in body
    slowest_per_step = re.search(r'data-testid="slowest-per-step">([^<]*)<', body)
    assert slowest_per_step is not None
    assert slowest_per_step.group(1).split().count(str(slow)) == lanes[slow]["slowest"]

    # Charts: training curves from the log, GPU signals one line per rank.
    specs = _chart_specs(body)
    for chart in ("job-loss", "job-grad-norm", "job-lr", "job-step-time"):
        assert chart in specs, chart
    parser = tp.LogParser()
    parsed = [parser.feed(line) for line in lines]
    losses = [p.loss for p in parsed if p is not None and p.kind == tp.PROGRESS and p.loss]
    assert len(losses) >= 5
    loss = specs["job-loss"]
    assert [s["label"] for s in loss["series"]] == ["loss"]
    shown_losses = loss["series"][0]["values"]
    assert len(shown_losses) == len(losses)
    assert all(abs(v - w) <= 1e-3 * max(losses) for v, w in zip(shown_losses, losses, strict=True))
    assert len(loss["x"]) == len(losses)
    for chart in ("tensor", "sm", "power", "clock", "sync"):
        spec = specs[f"job-gpu-{chart}"]
        assert [s["label"] for s in spec["series"]] == [f"rank {r}" for r in range(8)]
        assert all(len(s["values"]) == len(spec["x"]) <= 600 for s in spec["series"])
    # The slow rank's GPU runs at a lower clock than the others (its throttle).
    clock = {s["label"]: s["values"] for s in specs["job-gpu-clock"]["series"]}
    recent = {k: [v for v in vals[-30:] if v is not None] for k, vals in clock.items()}
    slow_clock = sum(recent[f"rank {slow}"]) / len(recent[f"rank {slow}"])
    assert all(slow_clock < sum(v) / len(v) for k, v in recent.items() if k != f"rank {slow}")
    assert '<div class="chart" data-chart="job-loss"' in body
    assert "proof/charts.js" in body and "proof/job.js" in body

    # The log: the newest lines, those the parser recognised marked with what it read.
    shown = lines[-job_detail.LOG_SHOWN :]
    marked = re.findall(r'<tr class="parsed" data-kind="([a-z_]+)">', body)
    expected = [p.kind for p in parsed[-len(shown) :] if p is not None]
    assert marked == expected and tp.PROGRESS in marked
    last_progress = next(p for p in reversed(parsed) if p is not None and p.kind == tp.PROGRESS)
    assert f"· loss {last_progress.loss:.4g}" in body

    # The ranks' GPUs as their agents registered them.
    assert body.count(f"<td>{GPU_MODEL}</td>") == 8

    # The verdict, linked to its incident page.
    assert f'href="/incidents/{incident.public_id}/"' in body
    assert "slow_rank" in body

    # The real price of the job, as the pricing API computes it.
    price = real_price_for(a.principal(a.operator_admin), job_pk=pk)
    assert price.effective_price_per_productive_gpu_hour is not None
    assert f"${price.effective_price_per_productive_gpu_hour:,.2f} per productive GPU-hour" in body


@pytest.fixture
def raw_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Reads ingest's selectors make on a plain psycopg cursor on PostgreSQL (the sample
    blocks, the series identities), which Django's query counter does not see there."""
    seen: list[str] = []

    def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(
        "ingest.selectors.read_block_payloads", counting("blocks", read_block_payloads)
    )
    catalog = ingest_selectors._raw_fetchall
    monkeypatch.setattr(ingest_selectors, "_raw_fetchall", counting("catalog", catalog))
    return seen


def _by_vendor(counts: dict[str, int]) -> int:
    return counts[connection.vendor]


def test_job_page_queries_do_not_grow_with_ranks(
    client: Client,
    a: Tenant,
    django_assert_num_queries: Callable[..., Any],
    raw_reads: list[str],
) -> None:
    small, _ = _slow_rank_job(a, nodes=1, gpus_per_node=4)
    big, _ = _slow_rank_job(a, nodes=2, gpus_per_node=8, agent_id="big")
    _login(client, "alpha-op-admin")
    for job_id, ranks in ((small, 4), (big, 16)):
        ingest_selectors.clear_cache()  # the series identities' process cache: a cold read
        raw_reads.clear()
        with django_assert_num_queries(_by_vendor(JOB_PAGE_QUERIES)):
            body = client.get(f"/jobs/{job_id}/").content.decode()
        assert len(_lane_rows(body)) == ranks
        assert raw_reads == ["blocks", "catalog"]  # every node's samples in one read
        # Warm (series identities cached by the process): no identity, node or job lookups.
        raw_reads.clear()
        with django_assert_num_queries(_by_vendor(JOB_PAGE_QUERIES_WARM)):
            client.get(f"/jobs/{job_id}/")
        assert raw_reads == ["blocks"]


# Session, user, membership (in a savepoint); the tenant context's savepoint; the job; its
# activity, GPUs and log; the window's job metadata (2), the job's series (the job again, its
# ranks' GPUs, the series ids), on a cold series cache the series' nodes and job ids, the
# processes; incidents; usage and list prices: 18 reads. On PostgreSQL also the tenant
# settings (4 set_config statements), with the sample blocks and series identities read on
# a plain psycopg cursor (`raw_reads`: not counted there); on SQLite those two are counted.
JOB_PAGE_QUERIES = {"postgresql": 26, "sqlite": 24}
JOB_PAGE_QUERIES_WARM = {"postgresql": 24, "sqlite": 21}


def test_a_long_job_gets_hourly_charts_from_the_rollups(
    client: Client, a: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = a.operator.pk
    hour = int(time.time() // 3600) * 3600 - 3600
    sim = store_sim(op, "healthy_training", duration_s=240, seed=7, end_ts=hour + 100.0)
    for start in (hour - 3600, hour):
        ingest_services.build_rollups(op, start * 1000)
    # A job "longer than the recent window": the page adds the hourly means.
    monkeypatch.setattr(job_detail, "RECENT_S", 60.0)
    body = _login(client, "alpha-op-admin").get(f"/jobs/{sim.jobs[0]}/").content.decode()
    specs = _chart_specs(body)
    tensor = specs["job-hourly-tensor"]
    assert tensor["x"] == [hour - 3600.0, float(hour)]
    assert [s["label"] for s in tensor["series"]] == [f"rank {r}" for r in range(4)]
    for line in tensor["series"]:
        assert all(v is not None and 0 < v <= 100 for v in line["values"])
    assert "hourly rollups" in body


def test_a_job_without_data_or_verdicts_still_shows(client: Client, a: Tenant) -> None:
    op = a.operator.pk
    with tenant_context(op):
        now = datetime.now(UTC)
        Job.objects.create(
            operator_id=op,
            job_id="queue/waiting-1",
            kind="training",
            first_seen_at=now,
            last_seen_at=now,
        )
    body = _login(client, "alpha-op-admin").get("/jobs/queue/waiting-1/").content.decode()
    assert 'data-testid="job-id">queue/waiting-1<' in body
    assert 'data-testid="no-lanes"' in body and "no data stored for the job yet" in body
    assert 'data-testid="no-verdicts"' in body
    assert _chart_specs(body) == {}


# --- who sees which job ------------------------------------------------------------------------


def _job(op: int, job_id: str, customer: Customer | None = None, **fields: Any) -> Job:
    now = datetime.now(UTC)
    with tenant_context(op):
        return Job.objects.create(
            operator_id=op,
            job_id=job_id,
            customer=customer,
            kind=fields.pop("kind", "training"),
            first_seen_at=fields.pop("first_seen_at", now),
            last_seen_at=now,
            **fields,
        )


def test_job_page_is_404_across_operators_and_customers(
    client: Client, a: Tenant, b: Tenant
) -> None:
    sibling = tenant_services.do_create_customer(a.operator.pk, name="Sibling Team", slug="sib")
    _job(a.operator.pk, "own-1", a.customer, name="alpha-own-run")
    _job(a.operator.pk, "sib-1", sibling, name="sibling-run")
    _job(a.operator.pk, "loose-1", None, name="unattributed-run")
    _job(b.operator.pk, "bravo-1", b.customer, name="bravo-run")

    _login(client, "alpha-op-admin")
    for job_id in ("own-1", "sib-1", "loose-1"):
        assert client.get(f"/jobs/{job_id}/").status_code == 200
    assert client.get("/jobs/bravo-1/").status_code == 404
    listing = client.get("/jobs/").content.decode()
    assert all(n in listing for n in ("alpha-own-run", "sibling-run", "unattributed-run"))
    assert "bravo" not in listing

    client.logout()
    _login(client, "alpha-customer-viewer")
    assert client.get("/jobs/own-1/").status_code == 200
    for job_id in ("sib-1", "loose-1", "bravo-1"):
        assert client.get(f"/jobs/{job_id}/").status_code == 404, job_id
    listing = client.get("/jobs/").content.decode()
    assert "alpha-own-run" in listing
    for other in ("sibling-run", "unattributed-run", "bravo", "Sibling Team"):
        assert other not in listing
    # No customer column or filter for a customer user; another customer's id is refused.
    assert 'name="customer"' not in listing
    assert client.get(f"/jobs/?customer={sibling.pk}").status_code == 400
    assert client.get(f"/jobs/?customer={a.customer.pk}").status_code == 200

    client.logout()
    _login(client, "bravo-op-admin")
    assert client.get("/jobs/own-1/").status_code == 404
    assert "alpha" not in client.get("/jobs/").content.decode()


def test_job_page_of_a_customer_shows_its_run(client: Client, a: Tenant) -> None:
    job_id, pk = _slow_rank_job(a, nodes=1, gpus_per_node=4)
    with tenant_context(a.operator.pk):
        Job.objects.for_tenant(a.operator.pk).filter(pk=pk).update(customer=a.customer)
    body = _login(client, "alpha-customer-viewer").get(f"/jobs/{job_id}/").content.decode()
    assert len(_lane_rows(body)) == 4
    assert "job-loss" in _chart_specs(body)
    assert "Customer alpha-customer" not in body  # operators only: the customer field


# --- the list ------------------------------------------------------------------------------


def _many_jobs(
    t: Tenant, n: int, customer: Customer | None = None, prefix: str = "job"
) -> list[Job]:
    """n jobs with usage, activity and incidents, in a few bulk statements."""
    op = t.operator.pk
    start = datetime(2026, 1, 1, tzinfo=UTC)
    states = ["running", "completed", "failed"]
    with tenant_context(op):
        jobs = Job.objects.bulk_create(
            [
                Job(
                    operator_id=op,
                    job_id=f"{prefix}-{k:04d}",
                    name=f"run-{k % 7}",
                    customer=customer,
                    kind="inference" if k % 5 == 0 else "training",
                    state=states[k % 3],
                    world_size=8,
                    first_seen_at=start + timedelta(minutes=k),
                    last_seen_at=start + timedelta(minutes=k + 30),
                )
                for k in range(n)
            ]
        )
        JobGpuUsage.objects.bulk_create(
            [
                JobGpuUsage(
                    operator_id=op,
                    job=j,
                    gpu=f"GPU-{j.pk}-{g}",
                    gpu_model=GPU_MODEL,
                    gpu_seconds=3600.0,
                    compute_seconds=3600.0 * (0.3 + 0.6 * (k % 10) / 10),
                    wait_seconds=360.0,
                    idle_seconds=0.0,
                    method="engine+ebpf",
                )
                for k, j in enumerate(jobs)
                for g in range(2)
            ]
        )
        JobActivity.objects.bulk_create(
            [
                JobActivity(
                    operator_id=op,
                    job=j,
                    first_data_ts=1_000.0,
                    last_data_ts=1_000.0 + 60.0 * (k + 1),
                    received_at=start,
                )
                for k, j in enumerate(jobs)
            ]
        )
        Incident.objects.bulk_create(
            [
                Incident(
                    operator_id=op,
                    job=j,
                    family=f"family_{i}",
                    category="job",
                    confidence=0.8,
                    first_seen=start,
                    last_seen=start,
                    verdict={},
                    state="open" if i < 2 else "resolved",
                )
                for k, j in enumerate(jobs)
                for i in range(k % 4)
            ]
        )
    return jobs


def _job_ids(body: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)">', body)


def test_list_columns_search_filters_sort_and_pages(client: Client, a: Tenant, b: Tenant) -> None:
    op = a.operator.pk
    inv_services.set_list_price(
        a.principal(a.operator_admin), gpu_model=GPU_MODEL, price_per_gpu_hour=Decimal("2.49")
    )
    sibling = tenant_services.do_create_customer(op, name="Sibling Team", slug="sib")
    jobs = _many_jobs(a, 70, customer=a.customer)
    _many_jobs(a, 5, customer=sibling, prefix="sib")
    _many_jobs(b, 5, prefix="bravo")
    _login(client, "alpha-op-admin")

    body = client.get("/jobs/").content.decode()
    assert "75 jobs · page 1 of 2" in body
    ids = _job_ids(body)
    assert len(ids) == 50 and ids[0] == "job-0069" and not any(i.startswith("bravo") for i in ids)
    # One row's figures: GPUs, share and price as the pricing module computes them.
    row = body[body.index('<tr data-job="job-0069">') :]
    row = row[: row.index("</tr>")]
    share = 0.3 + 0.6 * 9 / 10
    assert f'data-testid="share">{round(share * 100)}%<' in row
    with tenant_context(op):
        usage = [
            UsageRow(u.gpu_model, u.gpu_seconds, u.compute_seconds, u.wait_seconds, 0.0, u.method)
            for u in JobGpuUsage.objects.for_tenant(op).filter(job=jobs[69])
        ]
    expected = real_price(usage, {GPU_MODEL: (Decimal("2.49"), "USD")})
    assert expected.effective_price_per_productive_gpu_hour is not None
    assert (
        f"$2.49 → <strong>${expected.effective_price_per_productive_gpu_hour:,.2f}</strong>" in row
    )
    assert 'data-testid="open-incidents"><span class="badge open">1</span>' in row  # 69 % 4 = 1
    assert ">Customer alpha-customer<" in row

    # Page 2, and a page past the last shows the last.
    assert len(_job_ids(client.get("/jobs/?page=2").content.decode())) == 25
    assert _job_ids(client.get("/jobs/?page=9").content.decode()) == _job_ids(
        client.get("/jobs/?page=2").content.decode()
    )
    # Search by id and by name.
    assert _job_ids(client.get("/jobs/?q=job-0012").content.decode()) == ["job-0012"]
    named = _job_ids(client.get("/jobs/?q=run-3&sort=job").content.decode())
    assert named == [*sorted(f"job-{k:04d}" for k in range(70) if k % 7 == 3), "sib-0003"]
    # Filters.
    failed = _job_ids(client.get("/jobs/?state=failed&sort=job").content.decode())
    assert failed[:3] == ["job-0002", "job-0005", "job-0008"]
    inference = _job_ids(
        client.get(f"/jobs/?kind=inference&customer={sibling.pk}").content.decode()
    )
    assert inference == ["sib-0000"]
    assert len(_job_ids(client.get(f"/jobs/?customer={sibling.pk}").content.decode())) == 5
    # Sorts, both directions; links keep the filters.
    by_share = _job_ids(client.get("/jobs/?sort=-share&state=running").content.decode())
    assert by_share[0] in {f"job-{k:04d}" for k in range(70) if k % 10 == 9 and k % 3 == 0}
    by_incidents = _job_ids(client.get("/jobs/?sort=-incidents").content.decode())
    assert all(int(i.split("-")[1]) % 4 >= 2 for i in by_incidents[:10])
    by_duration = _job_ids(client.get("/jobs/?sort=duration").content.decode())
    assert by_duration[:2] == ["job-0000", "sib-0000"]  # 60 s each; ties: the older first
    assert _job_ids(client.get("/jobs/?sort=job").content.decode())[0] == "job-0000"
    assert _job_ids(client.get("/jobs/?sort=-job").content.decode())[0] == "sib-0004"
    page = client.get("/jobs/?state=running&sort=share").content.decode()
    assert 'href="?state=running&amp;sort=-share"' in page
    assert 'href="?state=running&amp;sort=share&amp;page=2"' not in page  # one page only


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("sort=bogus", "sort"),
        ("sort=-", "sort"),
        ("page=0", "page"),
        ("page=abc", "page"),
        ("page=-1", "page"),
        ("state=exploded", "state"),
        ("kind=batch", "kind"),
        ("customer=abc", "customer"),
        ("customer=999999", "customer"),
        ("q=" + "x" * 300, "q"),
    ],
)
def test_list_bad_parameters_are_400_naming_them(
    client: Client, a: Tenant, query: str, name: str
) -> None:
    response = _login(client, "alpha-op-admin").get(f"/jobs/?{query}")
    assert response.status_code == 400
    assert f"Parameter <code>{name}</code>" in response.content.decode()


def test_list_refuses_another_operators_customer(client: Client, a: Tenant, b: Tenant) -> None:
    response = _login(client, "alpha-op-admin").get(f"/jobs/?customer={b.customer.pk}")
    assert response.status_code == 400


# Session, user, membership (in a savepoint); the tenant context's savepoint; the count, the
# page's rows with their figures, their usage, list prices and (for operators) the customers of
# the filter: 7 reads (6 for customers), 4 savepoint statements, on PostgreSQL 4 tenant
# settings.
LIST_QUERIES_OPERATOR = {"postgresql": 16, "sqlite": 12}
LIST_QUERIES_CUSTOMER = {"postgresql": 15, "sqlite": 11}


def test_list_queries_do_not_grow_with_rows(
    client: Client, a: Tenant, django_assert_num_queries: Callable[..., Any]
) -> None:
    _many_jobs(a, 1, customer=a.customer, prefix="one")
    _login(client, "alpha-op-admin")
    with django_assert_num_queries(_by_vendor(LIST_QUERIES_OPERATOR)):
        assert len(_job_ids(client.get("/jobs/").content.decode())) == 1
    _many_jobs(a, 120, customer=a.customer)
    with django_assert_num_queries(_by_vendor(LIST_QUERIES_OPERATOR)):
        assert len(_job_ids(client.get("/jobs/?page=2").content.decode())) == 50
    client.logout()
    _login(client, "alpha-customer-viewer")
    with django_assert_num_queries(_by_vendor(LIST_QUERIES_CUSTOMER)):
        assert len(_job_ids(client.get("/jobs/?sort=-share").content.decode())) == 50


def _lane(rank: int, compute: float) -> job_detail.LaneRow:
    return job_detail.LaneRow(rank, "n", "g", [compute] * 4, [False] * 4)


def test_a_large_job_shows_rank_0_and_the_ranks_furthest_from_the_median() -> None:
    """Of 256 ranks the page draws MAX_SHOWN_RANKS: rank 0, the slow and the waiting ranks
    first; the charts' lines likewise, with the median of all ranks."""
    ranks = list(range(256))
    compute = {r: 0.5 for r in ranks}
    compute.update({200: 0.99, 201: 0.95, 17: 0.05})  # two slow ranks, one that waits most
    lanes = job_detail.Lanes([_lane(r, compute[r]) for r in ranks], [0.0] * 4, 1, 1.0, None, "x")
    shown = job_detail.shown_ranks(lanes, ranks)
    assert shown is not None and len(shown) == job_detail.MAX_SHOWN_RANKS
    assert {0, 17, 200, 201} <= shown
    capped = dataclasses.replace(lanes, shown=shown)
    assert [row.rank for row in capped.shown_rows] == sorted(shown)
    assert len(capped.rows) == 256  # "slowest per step" stays of every rank
    values = np.tile(np.arange(3.0), (256, 1))
    values[200] = 100.0
    lines = job_detail._capped_lines([(r, f"rank {r}") for r in ranks], values, "%", shown)
    assert len(lines) == job_detail.MAX_SHOWN_RANKS + 1
    assert lines[-1][0] == "median of 256 ranks" and list(lines[-1][1]) == [0.0, 1.0, 2.0]
    # A job of at most MAX_SHOWN_RANKS ranks is drawn whole, without a median line.
    assert job_detail.shown_ranks(lanes, ranks[:64]) is None
    assert len(job_detail._capped_lines([(0, "rank 0")], values[:1], "%", None)) == 1
    # No lanes (no per-rank shares): the first ranks.
    assert job_detail.shown_ranks(None, ranks) == frozenset(range(64))


def test_a_large_job_reads_a_recent_window_bounded_by_gpu_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to 64 GPUs the lanes and charts read the last RECENT_S (or the last 60 steps); a
    larger job at most RECENT_GPU_S ÷ its GPUs, never under MIN_RECENT_S."""
    no_steps = parse_logs([])[0]
    assert job_detail.recent_seconds(no_steps) == job_detail.RECENT_S
    assert job_detail.recent_seconds(no_steps, 64) == job_detail.RECENT_S
    assert job_detail.recent_seconds(no_steps, 256) == job_detail.RECENT_GPU_S / 256 == 150.0
    assert job_detail.recent_seconds(no_steps, 10_000) == job_detail.MIN_RECENT_S
    monkeypatch.setattr(job_detail, "table_step_seconds", lambda _steps: 4.0)  # 60 steps: 300 s
    assert job_detail.recent_seconds(no_steps, 8) == 300.0
    assert job_detail.recent_seconds(no_steps, 256) == 150.0


def test_job_page_ranks_parameter_is_checked(client: Client, a: Tenant) -> None:
    op = a.operator.pk
    with tenant_context(op):
        now = datetime.now(UTC)
        Job.objects.create(
            operator_id=op, job_id="r-1", kind="training", first_seen_at=now, last_seen_at=now
        )
    client = _login(client, "alpha-op-admin")
    assert client.get("/jobs/r-1/?ranks=all").status_code == 200
    response = client.get("/jobs/r-1/?ranks=some")
    assert response.status_code == 400 and "<code>ranks</code>" in response.content.decode()
