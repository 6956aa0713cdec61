"""GET /api/v1/verdict-metrics/ (Prometheus text) and /api/v1/grafana-annotations/ on incidents
merged by the live pipeline's service from jobs stored through ingest: counts by family and
category, the per-incident series with the verdict page's URL, annotations over a range.
Operators only; another operator's incidents are never counted; a customer of the same operator
is refused; bad ranges are 400 naming the parameter."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from investigations import services
from investigations.models import Incident
from investigations.tests.live_helpers import store_gpu_job, verdict
from tenants.context import tenant_context
from tenants.testing import Tenant, make_second_customer, make_tenant

pytestmark = pytest.mark.django_db


def client(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def open_incident(tenant: Tenant, job: str, family: str, category: str, agent: str) -> str:
    op = tenant.operator.pk
    pk = store_gpu_job(op, job, agent)
    with tenant_context(op):
        services.merge_verdicts(
            op, [verdict(family, category, job=job)], window_end=1_100, job_pk=pk
        )
        incident = Incident.objects.for_tenant(op).get(job_id=pk, family=family)
    return str(incident.public_id)


@dataclass
class World:
    a: Tenant
    b: Tenant
    ids: list[str]  # a's open incidents
    other: str  # b's


@pytest.fixture
def world() -> World:
    a, b = make_tenant("vm-a"), make_tenant("vm-b")
    ids = [
        open_incident(a, "job-1", "slow_rank", "infrastructure", "agent-a1"),
        open_incident(a, "job-2", "slow_rank", "infrastructure", "agent-a2"),
        open_incident(a, "job-3", "dataloader_stall", "job", "agent-a3"),
    ]
    other = open_incident(b, "job-b", "slow_rank", "infrastructure", "agent-b1")
    return World(a, b, ids, other)


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_open_incidents_as_prometheus_metrics(world: World) -> None:
    a = world.a
    # What Prometheus 3 sends as Accept.
    accept = (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
        "text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
    )
    resp = client(a.api_token(a.operator_support)).get(
        "/api/v1/verdict-metrics/", HTTP_ACCEPT=accept
    )
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain")
    m = families(resp.content.decode())
    counts = {(lb["family"], lb["category"]): v for lb, v in m["proof_open_incidents"]}
    assert counts == {("slow_rank", "infrastructure"): 2, ("dataloader_stall", "job"): 1}
    info = {lb["incident"]: lb for lb, _v in m["proof_open_incident_info"]}
    assert set(info) == set(world.ids)
    first = info[world.ids[0]]
    assert first["job"] == "job-1"
    assert first["url"] == f"{settings.PROOF_PUBLIC_URL.rstrip('/')}/incidents/{first['incident']}/"
    assert world.other not in info
    assert len(m["proof_open_incident_gpu_hours_lost"]) == 2

    # Resolved incidents leave the counts.
    op = a.operator.pk
    with tenant_context(op):
        Incident.objects.for_tenant(op).filter(public_id=world.ids[2]).update(
            state="resolved", resolved_at=datetime.now(tz=UTC)
        )
    again = families(
        client(a.api_token(a.operator_admin)).get("/api/v1/verdict-metrics/").content.decode()
    )
    assert {(lb["family"], v) for lb, v in again["proof_open_incidents"]} == {("slow_rank", 2)}


def test_other_operator_counts_only_its_own_and_customers_are_refused(
    world: World,
) -> None:
    a, b = world.a, world.b
    m = families(
        client(b.api_token(b.operator_admin)).get("/api/v1/verdict-metrics/").content.decode()
    )
    assert [v for _lb, v in m["proof_open_incidents"]] == [1]
    assert [lb["incident"] for lb, _v in m["proof_open_incident_info"]] == [world.other]
    _customer, second_admin = make_second_customer(a)
    for user in (a.customer_admin, second_admin):
        for path in ("/api/v1/verdict-metrics/", "/api/v1/grafana-annotations/?from=0&to=1"):
            resp = client(a.api_token(user)).get(path)
            assert resp.status_code == 403, (user.username, path)
    assert APIClient().get("/api/v1/verdict-metrics/").status_code in (401, 403)


def test_incidents_as_grafana_annotations(world: World) -> None:
    a, b = world.a, world.b
    op = a.operator.pk
    with tenant_context(op):
        seen = list(Incident.objects.for_tenant(op).values_list("first_seen", "last_seen"))
    start = min(f for f, _l in seen)
    end = max(last for _f, last in seen)
    lo, hi = int(start.timestamp() * 1000) - 1000, int(end.timestamp() * 1000) + 1000
    c = client(a.api_token(a.operator_support))
    resp = c.get(f"/api/v1/grafana-annotations/?from={lo}&to={hi}")
    assert resp.status_code == 200
    rows = resp.json()
    assert {r["id"] for r in rows} == set(world.ids)
    for r in rows:
        assert r["time"] <= r["timeEnd"]
        assert r["url"].endswith(f"/incidents/{r['id']}/")
        assert r["tags"][2] == "open"
    assert {tuple(r["tags"][:2]) for r in rows} == {
        ("slow_rank", "infrastructure"),
        ("dataloader_stall", "job"),
    }
    only = c.get(f"/api/v1/grafana-annotations/?from={lo}&to={hi}&family=dataloader_stall&limit=5")
    assert [r["tags"][0] for r in only.json()] == ["dataloader_stall"]
    # A range before everything: nothing. Another operator: only its own.
    assert c.get(f"/api/v1/grafana-annotations/?from=0&to={lo - 10_000}").json() == []
    theirs = client(b.api_token(b.operator_admin)).get(
        f"/api/v1/grafana-annotations/?from={lo}&to={hi}"
    )
    assert [r["id"] for r in theirs.json()] == [world.other]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("to=5", "from"),
        ("from=10&to=5", "to"),
        ("from=x&to=5", "from"),
        ("from=0&to=99999999999999", "to"),
        ("from=0&to=5&limit=0", "limit"),
        ("from=0&to=5&limit=abc", "limit"),
        ("from=-1&to=5", "from"),
        ("from=1e30&to=5", "from"),
        ("from=&to=", "from"),
        ("from=0&to=5&family=" + "x" * 65, "family"),
    ],
)
def test_bad_annotation_queries_name_the_parameter(world: World, query: str, field: str) -> None:
    a = world.a
    resp = client(a.api_token(a.operator_admin)).get(f"/api/v1/grafana-annotations/?{query}")
    assert resp.status_code == 400
    assert field in resp.content.decode()
