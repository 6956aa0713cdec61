"""The incidents list and the verdict page, over real detector output: simulated runs stored
through ingest (investigations/tests/live_helpers.store_sim) and evaluated by the live
pipeline (investigations.services.evaluate_job), so every incident, evidence row and chart
comes from what the detectors wrote and what ingest stored."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test import Client

from frontend.selectors import incident_charts
from frontend.selectors import incidents as selectors
from ingest import services as ingest_services
from ingest.models import Job
from investigations import services, window_cache
from investigations.models import Incident, IncidentState
from investigations.tests.live_helpers import job_pk, store_sim
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Customer
from tenants.testing import TEST_PASSWORD, Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("incalpha", "incbravo")


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    """Ingest's and the live pipeline's process caches start empty: on SQLite a rolled-back
    test's row ids are given out again, and a cached identity or window would be another
    test's."""
    ingest_services.clear_caches()
    window_cache.CACHE.clear()


@dataclass
class World:
    a: Tenant
    b: Tenant
    second: Customer  # a's other customer
    slow: Incident  # a's, its customer's job: slow_rank (INFRASTRUCTURE)
    fault: Incident  # a's, the second customer's job: hardware_fault
    other: Incident  # b's


def _attribute(tenant: Tenant, job_id: str, customer: Customer) -> int:
    """The job's customer, as ingest's mapping rules would have set it (the simulated job ids
    are random, so no rule can be written before the run)."""
    with tenant_context(tenant.operator.pk):
        Job.objects.for_tenant(tenant.operator.pk).filter(job_id=job_id).update(customer=customer)
    return job_pk(tenant.operator.pk, job_id)


def _evaluate(tenant: Tenant, scenario: str, customer: Customer, seed: int = 1) -> Incident:
    op = tenant.operator.pk
    sim = store_sim(op, scenario, seed=seed, agent_id=f"{tenant.operator.slug}-{scenario}")
    pk = _attribute(tenant, sim.jobs[0], customer)
    services.evaluate_job(op, pk)
    with tenant_context(op):
        return Incident.objects.for_tenant(op).get(job_id=pk, family=scenario)


@pytest.fixture
def world(a: Tenant, b: Tenant) -> World:
    second = tenant_services.do_create_customer(a.operator.pk, name="Second Team", slug="second")
    services.set_list_price(
        a.principal(a.operator_admin),
        gpu_model="NVIDIA H100 80GB HBM3",
        price_per_gpu_hour=Decimal("2.49"),
    )
    slow = _evaluate(a, "slow_rank", a.customer)
    fault = _evaluate(a, "hardware_fault", second)
    other = _evaluate(b, "slow_rank", b.customer, seed=2)
    return World(a, b, second, slow, fault, other)


@pytest.fixture
def block_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts ingest's block reads: on PostgreSQL they run on a plain psycopg cursor (binary
    results), which Django's query counter does not see."""
    from ingest import selectors as ingest_selectors

    calls: list[int] = []
    real = ingest_selectors.read_block_payloads  # type: ignore[attr-defined]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest_selectors, "read_block_payloads", counted)
    return calls


def _login(client: Client, username: str) -> Client:
    assert client.login(username=username, password=TEST_PASSWORD)
    return client


def _charts(body: str) -> dict[str, dict[str, Any]]:
    """Every json_script chart spec on the page, by id."""
    found = re.findall(r'<script id="([^"]+)" type="application/json">(.*?)</script>', body, re.S)
    return {i: json.loads(text) for i, text in found}


def _evidence_charts(body: str) -> list[dict[str, Any]]:
    """The evidence table's chart specs in row order, each checked to have its div."""
    charts = _charts(body)
    ids = re.findall(r'<div class="chart small" data-chart="([^"]+)"', body)
    assert ids and set(ids) <= set(charts)
    return [charts[i] for i in ids]


def _values(spec: dict[str, Any], line: int = 0) -> list[float]:
    return [v for v in spec["series"][line]["values"] if v is not None]


def _covers(spec: dict[str, Any], start: float, end: float) -> bool:
    return bool(spec["x"][0] <= start and spec["x"][-1] >= end and spec["interval"] == [start, end])


def _interval(row: dict[str, Any]) -> tuple[float, float]:
    return (row["interval"]["start"], row["interval"]["end"])


def test_verdict_page_slow_rank(client: Client, world: World, block_reads: list[int]) -> None:
    # A second, material evaluation result (confidence moved): a kept revision.
    verdict = dict(world.slow.verdict, confidence=round(world.slow.confidence - 0.2, 2))
    end = world.slow.last_seen.timestamp()
    with tenant_context(world.a.operator.pk):
        services.merge_verdicts(
            world.a.operator.pk, [verdict], window_end=end + 5, job_pk=world.slow.job_id
        )
    _login(client, "incalpha-op-admin")
    response = client.get(f"/incidents/{world.slow.public_id}/")
    assert response.status_code == 200
    body = response.content.decode()
    v = world.slow.verdict
    assert 'data-testid="category-badge">INFRASTRUCTURE<' in body
    assert v["title"] in body and v["recommendation"] in body
    assert v["summary"].split("[")[0].strip() in body
    assert f'data-testid="slowdown">{v["impact"]["slowdown_pct"]:.1f}%<' in body
    assert f'data-testid="gpu-hours-lost">{v["impact"]["gpu_hours_lost"]:.3f}<' in body
    # Money lost: GPU-hours lost at the job's list price (2.49 USD per H100 GPU-hour).
    money = Decimal(str(v["impact"]["gpu_hours_lost"])) * Decimal("2.49")
    assert f'data-testid="money-lost">${money.quantize(Decimal("0.01"))}<' in body
    assert f'href="/jobs/{v["subject"]["job"]}/"' in body
    assert f'href="/fleet/?node={v["subject"]["node"]}"' in body  # operators: to the fleet
    assert f'href="/incidents/{world.slow.public_id}/summary/"' in body  # the customer's view
    # Every evidence row has its chart: x covers the row's interval, and a baseline is drawn.
    rows = v["evidence"]
    charts = _evidence_charts(body)
    assert len(charts) == len(rows) == body.count('data-testid="evidence-row"')
    for row, spec in zip(rows, charts, strict=True):
        assert _covers(spec, *_interval(row)), row["id"]
        if row["baseline"] is not None:
            assert spec["baseline"] is not None, row["id"]
        assert len(spec["x"]) <= incident_charts.MAX_POINTS
        assert all(len(s["values"]) == len(spec["x"]) for s in spec["series"])
    by_signal = {row["signal"]: (row, spec) for row, spec in zip(rows, charts, strict=True)}
    # The slow rank's sync time, against the other ranks' median (its stated baseline is of
    # the lead, not of the sync time).
    row, spec = by_signal["cuda.sync_ms lead over the median rank"]
    assert (
        spec["series"][0]["label"].startswith("GPU ")
        and "others' median" in spec["series"][1]["label"]
    )
    assert spec["baseline"] == pytest.approx(
        sorted(_values(spec, 1))[len(_values(spec, 1)) // 2], rel=0.5
    )
    # The slow GPU's NVLink CRC counter: rising over the interval from its pre-existing value.
    nvlink = [
        (r, s)
        for r, s in zip(rows, charts, strict=True)
        if r["signal"] == "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" and r["gpu"]
    ]
    [(row, spec)] = nvlink
    values = _values(spec)
    assert values[-1] - values[0] >= 0.5 * row["observed"]
    # Job-wide clearance counters: the sum over the job's GPUs, starting at the stated
    # pre-existing sum.
    row, spec = by_signal["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]
    assert spec["series"][0]["label"] == "sum of 4"
    assert spec["baseline"] == row["baseline"] == _values(spec)[0]
    # The checks: hardware implicated (the NVLink errors), fabric clear, the others not made.
    assert re.search(r'data-testid="cleared-hardware">.*?implicated', body, re.S)
    assert re.search(r'data-testid="cleared-fabric">.*?clear<', body, re.S)
    assert re.search(r'data-testid="cleared-storage">.*?not checked', body, re.S)
    hardware = next(c for c in v["cleared"] if c["check"] == "hardware")
    assert all(f'href="#ev-{e}"' in body for e in hardware["evidence"])
    # Revisions: created, then the confidence change.
    assert body.count('data-testid="revision"') == 2
    assert "Created" in body and "Updated" in body and "(-0.20)" in body
    # All series rows' samples came from one block read.
    assert len(block_reads) == 1
    # Another tenant's data never appears.
    assert world.other.verdict["subject"]["job"] not in body
    assert str(world.other.public_id) not in body


def test_verdict_page_hardware_fault(client: Client, world: World) -> None:
    _login(client, "incalpha-operator-support")
    body = client.get(f"/incidents/{world.fault.public_id}/").content.decode()
    rows = world.fault.verdict["evidence"]
    charts = _evidence_charts(body)
    assert len(charts) == len(rows)
    for row, spec in zip(rows, charts, strict=True):
        assert _covers(spec, *_interval(row)), row["id"]
    # The XID on the faulty GPU: the count of XID events steps up at its instant
    [(row, spec)] = [
        (r, s)
        for r, s in zip(rows, charts, strict=True)
        if r["signal"] == "event: xid" and r["gpu"]
    ]
    # (the GPU's XIDs: the baseline drawn is how many came before this one).
    counts = _values(spec)
    start, _ = _interval(row)
    before = [c for t, c in zip(spec["x"], spec["series"][0]["values"], strict=True) if t < start]
    assert counts[0] == 0 and spec["baseline"] == before[-1] and counts[-1] > before[-1]
    # The error line from the job's log, counted the same way.
    [(row, spec)] = [
        (r, s) for r, s in zip(rows, charts, strict=True) if r["signal"] == "log: error"
    ]
    assert _values(spec)[-1] >= 1
    assert re.search(r'data-testid="cleared-hardware">.*?implicated', body, re.S)
    assert 'data-testid="category-badge">INFRASTRUCTURE<' in body


def test_customer_sees_own_incidents_only(client: Client, world: World) -> None:
    _login(client, "incalpha-customer-viewer")
    listing = client.get("/incidents/").content.decode()
    assert str(world.slow.public_id) in listing
    assert str(world.fault.public_id) not in listing  # the second customer's job
    assert str(world.other.public_id) not in listing  # another operator's
    assert listing.count('data-testid="incident-row"') == 1
    response = client.get(f"/incidents/{world.slow.public_id}/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "/fleet/" not in body  # no fleet page for customers: node names as text
    assert world.slow.verdict["subject"]["node"] in body
    # The customer's charts stay within its job's data (another job may have run on the same
    # GPUs before or after).
    with tenant_context(world.a.operator.pk):
        from investigations.models import JobActivity

        span = JobActivity.objects.get(job=world.slow.job)
    for row, spec in zip(world.slow.verdict["evidence"], _evidence_charts(body), strict=True):
        start, end = _interval(row)
        assert spec["window"][0] >= min(span.first_data_ts, start) - 1e-3
        assert spec["window"][1] <= max(span.last_data_ts, end) + 1e-3
        assert _covers(spec, start, end)
    for refused in (world.fault, world.other):
        assert client.get(f"/incidents/{refused.public_id}/").status_code == 404
    assert client.get("/incidents/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert (
        client.get(f"/incidents/?job={world.fault.verdict['subject']['job']}")
        .content.decode()
        .count('data-testid="incident-row"')
        == 0
    )


def test_another_operator_is_refused(client: Client, world: World) -> None:
    _login(client, "incbravo-op-admin")
    for refused in (world.slow, world.fault):
        assert client.get(f"/incidents/{refused.public_id}/").status_code == 404
    listing = client.get("/incidents/").content.decode()
    assert str(world.other.public_id) in listing
    assert str(world.slow.public_id) not in listing and str(world.fault.public_id) not in listing
    assert "incalpha" not in listing.lower()


def _clone(source: Incident, n: int, **fields: Any) -> None:
    """n resolved copies of a real incident (its verdict as the detectors wrote it), each seen
    a minute before the last, with confidences spread over 0.30-0.89."""
    base = source.last_seen
    copies = []
    for i in range(n):
        values: dict[str, Any] = {
            "operator_id": source.operator_id,
            "job_id": source.job_id,
            "family": source.family,
            "category": source.category,
            "confidence": round(0.30 + (i * 7 % 60) / 100, 2),
            "title": f"{source.title} (copy {i})",
            "subject_node": source.subject_node,
            "subject_gpu": source.subject_gpu,
            "subject_rank": source.subject_rank,
            "state": IncidentState.RESOLVED,
            "first_seen": base - timedelta(minutes=i + 2),
            "last_seen": base - timedelta(minutes=i + 1),
            "verdict": source.verdict,
        }
        values.update({k: v(i) if callable(v) else v for k, v in fields.items()})
        copies.append(Incident(**values))
    with tenant_context(source.operator_id):
        Incident.objects.bulk_create(copies)


def _rows(body: str) -> list[str]:
    """The list's rows' incident links, in order."""
    return re.findall(r'<tr data-testid="incident-row">.*?href="/incidents/([^/]+)/"', body, re.S)


def test_list_open_first_filters_sort_and_pages(client: Client, world: World) -> None:
    _clone(world.slow, 50)
    _clone(world.slow, 12, family="sequence_imbalance", category="job")
    _login(client, "incalpha-op-admin")
    body = client.get("/incidents/").content.decode()
    assert "64 incidents" in body and "page 1 of 2" in body
    rows = _rows(body)
    assert len(rows) == selectors.PAGE_SIZE
    # Open first (the two real ones, newest first), then the resolved, newest first.
    newest_open = max((world.slow, world.fault), key=lambda i: i.last_seen)
    assert rows[0] == str(newest_open.public_id)
    assert set(rows[:2]) == {str(world.slow.public_id), str(world.fault.public_id)}
    assert 'data-testid="category-badge">INFRASTRUCTURE<' in body
    assert f'href="/jobs/{world.slow.verdict["subject"]["job"]}/"' in body
    assert len(_rows(client.get("/incidents/?page=2").content.decode())) == 14
    assert 'rel="next"' in body and "?page=2" in body

    def count(query: str) -> int:
        response = client.get(f"/incidents/?{query}")
        assert response.status_code == 200, query
        return len(_rows(response.content.decode()))

    assert count("state=open") == 2
    assert count("state=resolved&category=job") == 12
    assert count("family=hardware_fault") == 1
    assert count(f"job={world.fault.verdict['subject']['job']}") == 1
    assert count(f"node={world.fault.subject_node}") == 1
    assert count("node=no-such-node") == 0
    # Sorting by confidence, both ways, across the filtered set.
    for query, reverse in (("sort=confidence", False), ("sort=-confidence", True)):
        page = client.get(f"/incidents/?state=resolved&{query}").content.decode()
        shown = [int(c) for c in re.findall(r'<td class="num">(\d+)%</td>', page)]
        assert len(shown) == 50 and shown == sorted(shown, reverse=reverse)
    # The sort survives paging and filtering links.
    page = client.get("/incidents/?state=resolved&sort=-confidence").content.decode()
    assert "?state=resolved&amp;sort=-confidence&amp;page=2" in page


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("sort=cost", "sort"),
        ("page=0", "page"),
        ("page=two", "page"),
        ("page=3", "page"),  # past the last page
        ("state=closed", "state"),
        ("category=customer", "category"),
        ("family=gremlins", "family"),
        ("job=" + "j" * 300, "job"),
        ("node=" + "n" * 300, "node"),
    ],
)
def test_list_bad_parameters_are_400_naming_them(
    client: Client, a: Tenant, query: str, parameter: str
) -> None:
    _login(client, "incalpha-op-admin")
    response = client.get(f"/incidents/?{query}")
    assert response.status_code == 400
    assert f"The parameter <code>{parameter}</code>" in response.content.decode()


def _request_queries() -> int:
    """The signed-in request's own statements: session, user, the membership resolved in the
    system context (with its savepoint), the tenant context opened and closed — on PostgreSQL
    with the tenant settings' set_config statements: 11, on SQLite 7."""
    return {"postgresql": 11, "sqlite": 7}[connection.vendor]


def _list_queries() -> int:
    return _request_queries() + 4  # count, page rows, their impacts, their jobs' prices


def _verdict_page_queries() -> int:
    """The incident with its job, its revisions, the job's list price, the job's GPUs and
    nodes, the series catalog, the events; the block read too on SQLite (on PostgreSQL it runs
    on a plain psycopg cursor Django does not count: `block_reads` counts it)."""
    return _request_queries() + 6 + (connection.vendor == "sqlite")


def test_list_queries_do_not_grow_with_rows(
    client: Client, world: World, django_assert_num_queries: Any
) -> None:
    _login(client, "incalpha-op-admin")
    with django_assert_num_queries(_list_queries()):
        few = client.get("/incidents/")
    assert len(_rows(few.content.decode())) == 2
    _clone(world.slow, 70)
    with django_assert_num_queries(_list_queries()):
        many = client.get("/incidents/")
    assert len(_rows(many.content.decode())) == 50
    client.logout()
    _login(client, "incalpha-customer-viewer")
    with django_assert_num_queries(_list_queries()):
        mine = client.get("/incidents/")
    assert len(_rows(mine.content.decode())) == 50  # the slow rank's copies: its customer's job


def test_verdict_page_queries_do_not_grow_with_evidence_rows(
    client: Client, world: World, django_assert_num_queries: Any, block_reads: list[int]
) -> None:
    _login(client, "incalpha-op-admin")
    with django_assert_num_queries(_verdict_page_queries()):
        client.get(f"/incidents/{world.slow.public_id}/")
    assert len(block_reads) == 1
    # The same verdict citing three times the evidence (every row again, twice).
    evidence = world.slow.verdict["evidence"]
    tripled = [
        dict(row, id=f"e{k * len(evidence) + i + 1}")
        for k in range(3)
        for i, row in enumerate(evidence)
    ]
    _clone(world.slow, 1, verdict=dict(world.slow.verdict, evidence=tripled))
    with tenant_context(world.a.operator.pk):
        big = Incident.objects.for_tenant(world.a.operator.pk).get(title__endswith="(copy 0)")
    block_reads.clear()
    with django_assert_num_queries(_verdict_page_queries()):
        response = client.get(f"/incidents/{big.public_id}/")
    assert len(_evidence_charts(response.content.decode())) == 3 * len(evidence)
    assert len(block_reads) == 1
    client.logout()
    _login(client, "incalpha-customer-viewer")
    block_reads.clear()
    with django_assert_num_queries(_verdict_page_queries() + 1):  # + the job's data span
        response = client.get(f"/incidents/{big.public_id}/")
    assert len(_evidence_charts(response.content.decode())) == 3 * len(evidence)
    assert len(block_reads) == 1


def test_gpu_health_verdict_page(client: Client, a: Tenant, block_reads: list[int]) -> None:
    """A fleet-health verdict has no job: its page charts the GPU's own counters; customers
    never see it."""
    from investigations.tasks import evaluate_fleet_health

    op = a.operator.pk
    sim = store_sim(op, "gpu_degrading", duration_s=300, agent_id="incalpha-degrading")
    for gpu in sim.offline_gpu_families:
        assert evaluate_fleet_health(op, gpu) == "evaluated"
    with tenant_context(op):
        incident = Incident.objects.for_tenant(op).get(job__isnull=True)
    _login(client, "incalpha-op-admin")
    block_reads.clear()
    body = client.get(f"/incidents/{incident.public_id}/").content.decode()
    assert "none (a GPU's health)" in body
    rows = incident.verdict["evidence"]
    charts = _evidence_charts(body)
    assert len(charts) == len(rows) and len(block_reads) == 1
    for row, spec in zip(rows, charts, strict=True):
        assert _covers(spec, *_interval(row)), row["id"]
        if row["signal"].startswith("DCGM_FI_") and row["gpu"]:
            assert _values(spec), row["id"]  # the GPU's own samples, read without a job
    assert f"gpu={incident.subject_gpu}" in body
    client.logout()
    _login(client, "incalpha-customer-viewer")
    assert client.get(f"/incidents/{incident.public_id}/").status_code == 404
    assert str(incident.public_id) not in client.get("/incidents/").content.decode()


def test_sparkline_downsampling_keeps_spikes() -> None:
    """A day of 1 s samples in a 260 px sparkline: ≤ MAX_POINTS buckets, and a one-sample spike
    (up or down) is still drawn at its full height (bucket means would flatten it ~600-fold)."""
    ts = np.arange(0.0, 86_400.0)
    values = np.full(ts.shape, 10.0)
    values[40_000], values[70_000] = 500.0, -300.0
    x, width = incident_charts._grid((0.0, 86_400.0), (1.0,))
    drawn = incident_charts._bucket(ts, values, 0.0, width, len(x), "extreme")
    assert len(x) <= incident_charts.MAX_POINTS and len(drawn) == len(x)
    assert drawn.max() == 500.0 and drawn.min() == -300.0
    assert np.count_nonzero(drawn != 10.0) == 2  # the flat stretches stay flat
    means = incident_charts._bucket(ts, values, 0.0, width, len(x), "mean")
    assert means.max() < 20.0  # what the mean would have drawn
