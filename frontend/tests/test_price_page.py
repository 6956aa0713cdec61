"""/price/: the real price per job, per customer and for the fleet, from GPU time the live
pipeline accounted over simulated runs stored through ingest; the money the open verdicts'
causes cost; the calculator; who sees what; bad parameters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from frontend.tests.fleet_world import by_vendor, clear_process_caches, same_money
from ingest.models import Job
from investigations import selectors as investigation_selectors
from investigations import services
from investigations.models import Incident, IncidentState
from investigations.tests.live_helpers import GPU_MODEL, job_pk, store_sim
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Customer
from tenants.testing import TEST_PASSWORD, Tenant, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    clear_process_caches()


PRICE = Decimal("2.50")


@dataclass
class World:
    a: Tenant
    b: Tenant
    other: Customer  # a second customer of a
    straggler: str  # a's customer's job: a sequence imbalance (open verdict, impact stated)
    healthy: str  # the other customer's job: no verdict
    b_job: str


def _assign(tenant: Tenant, job_id: str, customer: Customer) -> None:
    # Attribution is the mapping rules' business (tenants/services.py), tested there; the
    # simulator's Slurm ids are drawn per seed, so the test attributes the stored jobs itself.
    with tenant_context(tenant.operator.pk):
        Job.objects.for_tenant(tenant.operator.pk).filter(job_id=job_id).update(customer=customer)


def _store(tenant: Tenant, scenario: str, seed: int, agent: str) -> list[str]:
    sim = store_sim(tenant.operator.pk, scenario, seed=seed, agent_id=agent)
    for job in sim.jobs:
        services.evaluate_job(tenant.operator.pk, job_pk(tenant.operator.pk, job))
    return sim.jobs


@pytest.fixture
def world() -> World:
    a, b = make_tenant("price-a"), make_tenant("price-b")
    admin = a.principal(a.operator_admin)
    other = tenant_services.do_create_customer(admin, name="Other Team", slug="other")
    services.set_list_price(admin, gpu_model=GPU_MODEL, price_per_gpu_hour=PRICE)
    services.set_list_price(
        b.principal(b.operator_admin), gpu_model=GPU_MODEL, price_per_gpu_hour=Decimal("9.99")
    )
    straggler, *rest = _store(a, "sequence_imbalance", 1, "agent-a1")
    healthy = _store(a, "healthy_training", 7, "agent-a2")[0]
    _assign(a, straggler, a.customer)
    for job in rest:
        _assign(a, job, a.customer)
    _assign(a, healthy, other)
    b_job = _store(b, "healthy_training", 5, "agent-b1")[0]
    return World(a, b, other, straggler, healthy, b_job)


def _client(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def _open_loss(tenant: Tenant, job_id: str) -> tuple[int, float]:
    with tenant_context(tenant.operator.pk):
        rows = Incident.objects.for_tenant(tenant.operator.pk).filter(
            job__job_id=job_id, state=IncidentState.OPEN
        )
        lost = [float((i.verdict.get("impact") or {}).get("gpu_hours_lost") or 0) for i in rows]
    return len(lost), sum(lost)


def test_operator_sees_fleet_customers_and_jobs_priced(world: World) -> None:
    a = world.a
    admin = a.principal(a.operator_admin)
    response = _client(a.operator_admin).get("/price/")
    assert response.status_code == 200
    body = response.content.decode()
    data = response.context["data"]
    # The fleet's numbers are the real-price API's (investigations.selectors.real_price_for).
    fleet = investigation_selectors.real_price_for(admin)
    assert fleet.gpu_hours > 0 and fleet.list_cost is not None
    assert data.fleet.gpu_hours == pytest.approx(fleet.gpu_hours)
    assert data.fleet.productive_share == pytest.approx(fleet.productive_share)
    assert same_money(data.fleet.list_cost, fleet.list_cost)
    assert same_money(
        data.fleet.effective_price_per_productive_gpu_hour,
        fleet.effective_price_per_productive_gpu_hour,
    )
    assert f"${data.fleet.list_cost:,.2f}" in body
    assert f"${data.fleet.effective_price_per_productive_gpu_hour:,.2f}" in body
    # Per job, the same as the API's per-job price.
    by_job = {j.job_id: j for j in data.jobs}
    assert {world.straggler, world.healthy} <= set(by_job)
    straggler_pk = job_pk(a.operator.pk, world.straggler)
    expected = investigation_selectors.real_price_for(admin, job_pk=straggler_pk)
    assert same_money(by_job[world.straggler].price.list_cost, expected.list_cost)
    assert by_job[world.straggler].price.productive_share == pytest.approx(
        expected.productive_share
    )
    # The straggler's open verdict states the GPU-hours its cause cost: at the list price,
    # what a fix would save.
    count, lost = _open_loss(a, world.straggler)
    assert count >= 1 and lost > 0
    loss = by_job[world.straggler].loss
    assert loss is not None and loss.incidents == count
    assert loss.gpu_hours == pytest.approx(lost)
    assert loss.money == (Decimal(str(lost)) * PRICE).quantize(Decimal("0.01"))
    assert by_job[world.healthy].loss is None
    assert data.fleet_loss.money == loss.money
    assert f"${loss.money:,.2f}" in body
    # Per customer: each customer's jobs, and their sum is the fleet.
    customers = {c.name: c for c in data.customers}
    assert set(customers) == {a.customer.name, "Other Team"}
    other = customers["Other Team"].price
    healthy_pk = job_pk(a.operator.pk, world.healthy)
    assert other.gpu_hours == pytest.approx(
        investigation_selectors.real_price_for(admin, job_pk=healthy_pk).gpu_hours
    )
    assert sum(c.price.gpu_hours for c in data.customers) == pytest.approx(fleet.gpu_hours)
    assert customers[a.customer.name].loss is not None
    # Another operator's job and price never appear.
    assert world.b_job not in body and "9.99" not in body and "price-b" not in body


def test_customer_sees_only_its_own_jobs(world: World) -> None:
    a = world.a
    response = _client(a.customer_viewer).get("/price/")
    assert response.status_code == 200
    body = response.content.decode()
    data = response.context["data"]
    jobs = {j.job_id for j in data.jobs}
    assert world.straggler in jobs
    assert world.healthy not in jobs and world.healthy not in body  # a sibling customer's
    assert world.b_job not in body
    assert data.customers == [] and 'data-testid="customers"' not in body
    mine = investigation_selectors.real_price_for(a.principal(a.customer_viewer))
    assert data.fleet.gpu_hours == pytest.approx(mine.gpu_hours)
    assert same_money(data.fleet.list_cost, mine.list_cost)
    assert "Other Team" not in body


def test_period_outside_the_data_is_empty_and_a_straddling_row_is_pro_rata(world: World) -> None:
    client = _client(world.a.operator_admin)
    response = client.get("/price/?from=2020-01-01&to=2020-01-07")
    assert response.status_code == 200
    assert response.context["data"].fleet.gpu_hours == 0
    assert response.context["data"].jobs == []
    # A period ending before today's data but starting before it includes nothing of it.
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    response = client.get(f"/price/?from={yesterday - timedelta(days=3)}&to={yesterday}")
    data = response.context["data"]
    assert data.fleet.gpu_hours == pytest.approx(0, abs=0.02)  # at most a run crossing midnight


def test_calculator(world: World) -> None:
    client = _client(world.a.operator_admin)
    response = client.get("/price/?list_price=2.50&share=50")
    assert response.status_code == 200
    calc = response.context["calculator"]
    data = response.context["data"]
    assert calc.effective == Decimal("5.0000")
    lost = data.fleet_loss.gpu_hours / data.fleet.gpu_hours
    assert 0 < calc.lost_share == pytest.approx(lost)
    after = min(1.0, 0.5 / (1 - lost))
    assert float(calc.share_after) == pytest.approx(after, abs=1e-4)
    assert float(calc.effective_after) == pytest.approx(2.5 / after, abs=1e-3)
    body = response.content.decode()
    assert "$5.00" in body and f"${2.5 / after:,.2f}" in body
    # Without inputs, it starts from the period's own list price and share.
    calc = client.get("/price/").context["calculator"]
    assert calc.list_price == PRICE  # one GPU model, one price
    assert float(calc.share) == pytest.approx(round(data.fleet.productive_share * 100, 1) / 100)


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("from=2026-13-01", "from"),
        ("to=yesterday", "to"),
        ("from=2026-02-10&to=2026-02-01", "to"),
        ("from=2020-01-01&to=2026-01-01", "to"),
        ("sort=price", "sort"),
        ("page=0", "page"),
        ("page=x", "page"),
        ("list_price=-1", "list_price"),
        ("list_price=abc", "list_price"),
        ("share=0", "share"),
        ("share=150", "share"),
        ("share=nan", "share"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(client: Client, query: str, name: str) -> None:
    a = make_tenant("price-bad")
    assert client.login(username=a.customer_viewer.username, password=TEST_PASSWORD)
    response = client.get(f"/price/?{query}")
    assert response.status_code == 400
    assert f"<code>{name}</code>" in response.content.decode()


def test_sorting_and_pages(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from frontend.selectors import price as price_selectors

    client = _client(world.a.operator_admin)

    def jobs(query: str) -> list[Any]:
        response = client.get(f"/price/?{query}")
        assert response.status_code == 200
        return list(response.context["data"].jobs)

    hours = [j.price.gpu_hours for j in jobs("sort=-gpu_hours")]
    assert len(hours) == 2 and hours == sorted(hours, reverse=True)
    assert [j.price.gpu_hours for j in jobs("sort=gpu_hours")] == sorted(hours)
    costs = [j.price.list_cost for j in jobs("sort=-cost")]
    assert costs == sorted(costs, reverse=True)
    shares = [j.price.productive_share for j in jobs("sort=share")]
    assert shares == sorted(shares)
    ids = [j.job_id for j in jobs("sort=job")]
    assert ids == sorted(ids) and [j.job_id for j in jobs("sort=-job")] == ids[::-1]
    # 50 a page; with 1 a page the pages split the same order.
    monkeypatch.setattr(price_selectors, "PAGE_SIZE", 1)
    first, second = jobs("sort=job&page=1"), jobs("sort=job&page=2")
    assert [j.job_id for j in first + second] == ids
    assert client.get("/price/?sort=job").context["data"].pages == len(ids)
    assert jobs("page=99") == []


def test_query_count_does_not_grow_with_jobs(django_assert_num_queries: Any, world: World) -> None:
    client = _client(world.a.operator_admin)
    client.get("/price/")  # session and caches warm
    with django_assert_num_queries(by_vendor(QUERIES)):
        client.get("/price/")
    more = _store(world.a, "healthy_training", 11, "agent-a3")
    for job in more:
        _assign(world.a, job, world.other)
    assert len(client.get("/price/").context["data"].jobs) > 3
    with django_assert_num_queries(by_vendor(QUERIES)):
        client.get("/price/")
    viewer = _client(world.a.customer_viewer)
    viewer.get("/price/")
    with django_assert_num_queries(by_vendor(QUERIES_CUSTOMER)):
        viewer.get("/price/")


# Signing in (session, user, the membership in the system context) and the request's tenant
# context: 11 on PostgreSQL, 7 on SQLite (see test_fleet_page). Then the page: list prices,
# the usage per job × GPU model × method, the open verdicts' loss per job, customer names
# (operators only), the names of the jobs shown: 5 (a customer: 4).
QUERIES = {"postgresql": 16, "sqlite": 12}
QUERIES_CUSTOMER = {"postgresql": 15, "sqlite": 11}
