"""Incident, verdict, list-price and real-price endpoints: who sees what; other tenants and
other customers are always refused."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from investigations import services
from investigations.models import Incident, JobGpuUsage
from investigations.tests.live_helpers import store_gpu_job, verdict
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Customer, MatchField, Role
from tenants.testing import TEST_PASSWORD, Tenant, make_tenant

pytestmark = pytest.mark.django_db


@dataclass
class World:
    a: Tenant
    b: Tenant
    other_customer: Customer
    other_viewer: User
    mine: Incident  # a's customer's job
    theirs: Incident  # a's other customer's job
    fleet: Incident  # gpu_degrading, operator-only
    b_incident: Incident


def session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _job(tenant: Tenant, job: str, agent: str) -> int:
    return store_gpu_job(tenant.operator.pk, job, agent)


def _incident(tenant: Tenant, v: dict[str, object], **scope: object) -> Incident:
    op = tenant.operator.pk
    with tenant_context(op):
        services.merge_verdicts(op, [v], window_end=1_100, **scope)  # type: ignore[arg-type]
        incident = Incident.objects.for_tenant(op).order_by("-id").first()
    assert incident is not None
    return incident


def _usage(tenant: Tenant, job_pk: int, gpu: str, compute: float) -> None:
    with tenant_context(tenant.operator.pk):
        JobGpuUsage.objects.create(
            operator_id=tenant.operator.pk,
            job_id=job_pk,
            gpu=gpu,
            gpu_model="H100",
            gpu_seconds=3600.0,
            compute_seconds=compute,
            wait_seconds=3600.0 - compute,
            idle_seconds=0.0,
            method="engine+ebpf",
        )


@pytest.fixture
def world() -> World:
    a, b = make_tenant("api-a"), make_tenant("api-b")
    admin = a.principal(a.operator_admin)
    other = tenant_services.do_create_customer(admin, name="Other", slug="other")
    other_viewer = tenant_services.do_create_member(
        operator_id=a.operator.pk,
        username="other-viewer",
        email="",
        password=TEST_PASSWORD,
        role=Role.CUSTOMER_VIEWER,
        customer_id=other.pk,
    ).user
    for prefix, customer in (("acme-", a.customer.pk), ("other-", other.pk)):
        tenant_services.do_create_mapping_rule(
            admin, match_field=MatchField.JOB_ID_PREFIX, value=prefix, customer_id=customer
        )
    mine_job = _job(a, "acme-1", "a1")
    theirs_job = _job(a, "other-1", "a2")
    _usage(a, mine_job, "GPU-a-0", 1800.0)
    _usage(a, theirs_job, "GPU-a-1", 3600.0)
    b_job = _job(b, "acme-1", "b1")
    _usage(b, b_job, "GPU-b-0", 900.0)
    return World(
        a=a,
        b=b,
        other_customer=other,
        other_viewer=other_viewer,
        mine=_incident(a, verdict(job="acme-1"), job_pk=mine_job),
        theirs=_incident(
            a, verdict("checkpoint_stall", "infrastructure", job="other-1"), job_pk=theirs_job
        ),
        fleet=_incident(
            a, verdict("gpu_degrading", "infrastructure", job=None, gpu="GPU-a-7"), gpu="GPU-a-7"
        ),
        b_incident=_incident(b, verdict(job="acme-1"), job_pk=b_job),
    )


class JsonResponse(Protocol):
    def json(self) -> Any: ...


def _ids(response: JsonResponse) -> set[str]:
    return {row["id"] for row in response.json()["results"]}


def test_incidents_operator_sees_all_customer_only_its_own(world: World) -> None:
    a = world.a
    everything = {str(i.public_id) for i in (world.mine, world.theirs, world.fleet)}
    for user in (a.operator_admin, a.operator_support):
        assert _ids(session(user).get("/api/v1/incidents/")) == everything
    assert _ids(session(a.customer_viewer).get("/api/v1/incidents/")) == {str(world.mine.public_id)}
    assert _ids(session(world.other_viewer).get("/api/v1/incidents/")) == {
        str(world.theirs.public_id)
    }
    # Filters.
    response = session(a.operator_admin).get("/api/v1/incidents/?category=infrastructure")
    assert _ids(response) == {str(world.theirs.public_id), str(world.fleet.public_id)}
    response = session(a.operator_admin).get("/api/v1/incidents/?job=acme-1")
    assert _ids(response) == {str(world.mine.public_id)}
    body = session(a.customer_viewer).get(f"/api/v1/incidents/{world.mine.public_id}/").json()
    assert body["job"] == "acme-1" and body["family"] == "sequence_imbalance"
    assert body["state"] == "open" and body["verdict"]["id"] == body["id"]


def test_incidents_other_customer_and_other_tenant_refused(world: World) -> None:
    a = world.a
    for url in (
        f"/api/v1/incidents/{world.theirs.public_id}/",
        f"/api/v1/incidents/{world.fleet.public_id}/",
        f"/api/v1/verdicts/{world.theirs.public_id}/",
        f"/api/v1/incidents/{world.theirs.public_id}/revisions/",
    ):
        assert session(a.customer_viewer).get(url).status_code == 404, url
    for user in (world.b.operator_admin, world.b.customer_viewer):
        client = session(user)
        assert client.get(f"/api/v1/incidents/{world.mine.public_id}/").status_code == 404
        assert client.get(f"/api/v1/verdicts/{world.mine.public_id}/").status_code == 404
        assert _ids(client.get("/api/v1/incidents/")) <= {str(world.b_incident.public_id)}
    assert APIClient().get("/api/v1/incidents/").status_code in (401, 403)
    # Read-only: nobody writes incidents through the API.
    response = session(a.operator_admin).post("/api/v1/incidents/", {}, format="json")
    assert response.status_code == 405


def test_verdicts_are_the_design_7_objects(world: World) -> None:
    response = session(world.a.customer_viewer).get("/api/v1/verdicts/")
    [v] = response.json()["results"]
    assert v["id"] == str(world.mine.public_id)
    assert set(v) >= {
        "id", "family", "category", "title", "summary", "recommendation", "confidence",
        "subject", "interval", "impact", "evidence", "cleared", "explanation",
    }  # fmt: skip
    revisions = session(world.a.customer_viewer).get(
        f"/api/v1/incidents/{world.mine.public_id}/revisions/"
    )
    assert [(r["number"], r["kind"]) for r in revisions.json()] == [(1, "created")]


def test_list_prices_admin_writes_support_reads_customers_and_other_tenants_refused(
    world: World,
) -> None:
    a, b = world.a, world.b
    admin = session(a.operator_admin)
    response = admin.post(
        "/api/v1/gpu-prices/",
        {"gpu_model": "NVIDIA H100 80GB HBM3", "price_per_gpu_hour": "2.49"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    price = response.json()
    assert (price["price_per_gpu_hour"], price["currency"]) == ("2.4900", "USD")
    response = admin.patch(
        f"/api/v1/gpu-prices/{price['id']}/", {"price_per_gpu_hour": "2.10"}, format="json"
    )
    assert response.status_code == 200 and response.json()["price_per_gpu_hour"] == "2.1000"
    for bad in ({"gpu_model": "X", "price_per_gpu_hour": "0"}, {"price_per_gpu_hour": "1"}):
        assert admin.post("/api/v1/gpu-prices/", bad, format="json").status_code == 400
    response = admin.post(
        "/api/v1/gpu-prices/",
        {"gpu_model": "X", "price_per_gpu_hour": "1", "currency": "$$"},
        format="json",
    )
    assert response.status_code == 400 and "currency" in response.json()["error"]["message"]
    support = session(a.operator_support)
    assert [p["id"] for p in support.get("/api/v1/gpu-prices/").json()["results"]] == [price["id"]]
    assert support.post("/api/v1/gpu-prices/", {}, format="json").status_code == 403
    assert session(a.customer_viewer).get("/api/v1/gpu-prices/").status_code == 403
    assert (
        session(a.customer_admin).post("/api/v1/gpu-prices/", {}, format="json").status_code == 403
    )
    other = session(b.operator_admin)
    assert other.get("/api/v1/gpu-prices/").json()["results"] == []
    assert other.get(f"/api/v1/gpu-prices/{price['id']}/").status_code == 404
    assert other.delete(f"/api/v1/gpu-prices/{price['id']}/").status_code == 404
    assert admin.delete(f"/api/v1/gpu-prices/{price['id']}/").status_code == 204


def test_real_price_per_job_customer_fleet(world: World) -> None:
    a = world.a
    services.set_list_price(
        a.principal(a.operator_admin),
        gpu_model="H100",
        price_per_gpu_hour=Decimal("3"),
    )
    admin = session(a.operator_admin)
    fleet = admin.get("/api/v1/real-price/").json()
    # Two GPU-hours, 1.5 of them computing: share 0.75, 6.00 of list cost → 4.00 per productive h.
    assert fleet["gpu_hours"] == 2.0 and fleet["productive_share"] == 0.75
    assert (fleet["list_cost"], fleet["effective_price_per_productive_gpu_hour"]) == (
        "6.0000",
        "4.0000",
    )
    job = admin.get("/api/v1/real-price/?job=acme-1").json()
    assert (
        job["productive_share"] == 0.5
        and job["effective_price_per_productive_gpu_hour"] == "6.0000"
    )
    per_customer = {
        r["customer"]: r["productive_share"]
        for r in admin.get("/api/v1/real-price/by-customer/").json()
    }
    assert per_customer == {a.customer.pk: 0.5, world.other_customer.pk: 1.0}
    # A customer: its own jobs only, whatever it asks for.
    mine = session(a.customer_viewer)
    assert mine.get("/api/v1/real-price/").json()["productive_share"] == 0.5
    assert mine.get("/api/v1/real-price/?job=other-1").status_code == 404
    assert mine.get(f"/api/v1/real-price/?customer={world.other_customer.pk}").status_code == 404
    assert mine.get("/api/v1/real-price/by-customer/").status_code == 403
    assert mine.get("/api/v1/real-price/?job=acme-1&customer=1").status_code == 400
    # Another tenant: its own usage only (its own job of the same name), a's never.
    b = session(world.b.operator_admin)
    assert b.get("/api/v1/real-price/").json()["productive_share"] == 0.25
    assert b.get(f"/api/v1/real-price/?customer={a.customer.pk}").status_code == 404
    assert b.get("/api/v1/real-price/?job=other-1").status_code == 404
