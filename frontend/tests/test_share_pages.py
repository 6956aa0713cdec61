"""The customer-facing verdict page and the page a share link opens, over real detector
output (simulated runs stored through ingest, evaluated by the live pipeline): what they
show, node-name masking on and off, who may open them, the shared page's headers and its
pinned query count."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.http import Http404
from django.test import Client

from frontend.selectors import incidents as incident_selectors
from frontend.selectors import share as selectors
from ingest import services as ingest_services
from ingest.models import Gpu, Job, Node
from investigations import services, window_cache
from investigations.models import Incident
from investigations.tests.live_helpers import job_pk, store_sim
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Customer
from tenants.services import NotAllowed
from tenants.testing import TEST_PASSWORD, Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("shpalpha", "shpbravo")


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    ingest_services.clear_caches()
    window_cache.CACHE.clear()


@dataclass
class World:
    a: Tenant
    b: Tenant
    second: Customer
    slow: Incident  # a's customer's job, 2 nodes
    fault: Incident  # a's second customer's job
    other: Incident  # b's


def _evaluate(
    tenant: Tenant, scenario: str, customer: Customer, seed: int = 1, nodes: int = 1
) -> Incident:
    op = tenant.operator.pk
    sim = store_sim(
        op, scenario, seed=seed, nodes=nodes, agent_id=f"{tenant.operator.slug}-{scenario}"
    )
    with tenant_context(op):
        Job.objects.for_tenant(op).filter(job_id=sim.jobs[0]).update(customer=customer)
    pk = job_pk(op, sim.jobs[0])
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
    slow = _evaluate(a, "slow_rank", a.customer, nodes=2)
    fault = _evaluate(a, "hardware_fault", second)
    other = _evaluate(b, "slow_rank", b.customer, seed=2)
    return World(a, b, second, slow, fault, other)


def _login(client: Client, username: str) -> Client:
    assert client.login(username=username, password=TEST_PASSWORD)
    return client


def _charts(body: str) -> list[dict[str, Any]]:
    """The evidence charts' specs in row order, each with its div."""
    found = dict(
        re.findall(r'<script id="([^"]+)" type="application/json">(.*?)</script>', body, re.S)
    )
    ids = re.findall(r'<div class="chart small" data-chart="([^"]+)"', body)
    assert set(ids) <= set(found)
    return [json.loads(found[i]) for i in ids]


def _share(tenant: Tenant, incident: Incident) -> str:
    _link, token = services.do_create_share_link(
        tenant.principal(tenant.operator_admin), incident=incident.public_id, expires_in_s=3600
    )
    return f"/share/{token}/"


def _names(tenant: Tenant) -> tuple[set[str], set[str]]:
    op = tenant.operator.pk
    with tenant_context(op):
        nodes = set(Node.objects.for_tenant(op).values_list("hostname", flat=True))
        gpus = set(Gpu.objects.for_tenant(op).values_list("uuid", flat=True))
    return nodes, gpus


def test_summary_page_shows_the_verdict_for_the_customer(client: Client, world: World) -> None:
    _login(client, "shpalpha-customer-viewer")
    response = client.get(f"/incidents/{world.slow.public_id}/summary/")
    assert response.status_code == 200
    body = response.content.decode()
    v = world.slow.verdict
    assert 'data-testid="operator">from Operator shpalpha<' in body
    assert "The cause is in Operator shpalpha&#x27;s infrastructure, not in the job." in body
    assert v["recommendation"] in body
    assert v["summary"].split("[")[0].strip() in body
    money = Decimal(str(v["impact"]["gpu_hours_lost"])) * Decimal("2.49")
    assert f'data-testid="money-lost">${money.quantize(Decimal("0.01"))}<' in body
    # What was checked and cleared: the verdict's own checks.
    for entry in v["cleared"]:
        label = "cleared" if entry["result"] == "clear" else entry["result"]
        assert re.search(rf'data-testid="cleared-{entry["check"]}">.*?{label}', body, re.S)
    # The evidence charts are the verdict page's own (the same specs).
    client.logout()
    _login(client, "shpalpha-customer-viewer")
    full = client.get(f"/incidents/{world.slow.public_id}/").content.decode()
    assert _charts(body) == _charts(full) and len(_charts(body)) == len(v["evidence"])
    # No fleet links on the customer's page, and nothing of another tenant.
    assert "/fleet/" not in body.split("<main", 1)[1]
    assert str(world.other.public_id) not in body
    assert world.other.verdict["subject"]["job"] not in body


def test_summary_page_refuses_other_customers_and_operators(client: Client, world: World) -> None:
    _login(client, "shpalpha-customer-viewer")
    assert client.get(f"/incidents/{world.fault.public_id}/summary/").status_code == 404
    assert client.get(f"/incidents/{world.other.public_id}/summary/").status_code == 404
    client.logout()
    _login(client, "shpalpha-op-admin")
    assert client.get(f"/incidents/{world.fault.public_id}/summary/").status_code == 200
    assert client.get(f"/incidents/{world.other.public_id}/summary/").status_code == 404
    client.logout()
    _login(client, "shpbravo-op-admin")
    assert client.get(f"/incidents/{world.slow.public_id}/summary/").status_code == 404
    client.logout()
    assert client.get(f"/incidents/{world.slow.public_id}/summary/").status_code == 302  # sign in


def test_masking_off_shows_names(client: Client, world: World) -> None:
    body = Client().get(_share(world.a, world.slow)).content.decode()
    assert world.slow.verdict["subject"]["node"] in body
    assert 'data-testid="masked"' not in body


def test_masking_replaces_every_node_name_and_gpu_uuid(client: Client, world: World) -> None:
    with pytest.raises(NotAllowed):
        tenant_services.do_set_mask_node_names(
            world.a.principal(world.a.operator_support), mask=True
        )
    tenant_services.do_set_mask_node_names(world.a.principal(world.a.operator_admin), mask=True)
    nodes, gpus = _names(world.a)
    assert len(nodes) >= 3 and gpus
    shared = Client().get(_share(world.a, world.slow)).content.decode()
    _login(client, "shpalpha-customer-admin")
    summary = client.get(f"/incidents/{world.slow.public_id}/summary/").content.decode()
    for body in (shared, summary):
        assert 'data-testid="masked"' in body
        leaked = {n for n in nodes | gpus if n in body} | set(
            re.findall(r"GPU-[0-9a-f]{8}-[0-9a-f-]{27}", body)
        )
        assert not leaked
        assert "node-1" in body
    # The aliases are the same in both pages, and consistent within one: each original name
    # has one alias everywhere (evidence rows, notes, chart labels).
    assert _charts(shared) == _charts(summary)
    with tenant_context(world.a.operator.pk):
        principal = world.a.principal(world.a.customer_viewer)
        cv = selectors.customer_verdict(principal, world.slow.public_id)
        detail = incident_selectors.incident_detail(principal, world.slow.public_id)
    masker = selectors._masker(world.a.operator.pk, detail)
    aliases = {k: v for k, v in masker.aliases.items() if k in nodes or k in gpus}
    assert len(set(aliases.values())) == len(aliases)  # distinct names, distinct aliases
    assert [r.chart for r in cv.evidence] == [masker.value(r.chart) for r in detail.evidence]
    for raw, masked in zip(detail.evidence, cv.evidence, strict=True):
        if raw.evidence.get("node"):
            assert masked.evidence["node"] == masker.aliases[raw.evidence["node"]]
        if raw.evidence.get("gpu"):
            assert masked.evidence["gpu"] == masker.aliases[raw.evidence["gpu"]]
    subject = world.slow.verdict["subject"]
    assert masker.aliases[subject["node"]] == "node-1"  # the subject is named first
    labels = [s["label"] for spec in _charts(shared) for s in spec["series"]]
    assert any(re.fullmatch(r"GPU \d+ · node-\d+", label) for label in labels)


def test_shared_page_is_standalone_and_private(world: World) -> None:
    client = Client()
    response = client.get(_share(world.a, world.fault))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-testid="shared-by">Shared by Operator shpalpha' in body
    assert 'nav class="console"' not in body and "Sign in" not in body
    assert not re.search(r'href="/(fleet|jobs|incidents|health|price|settings|login)', body)
    assert '<meta name="robots" content="noindex, nofollow">' in body
    assert response["Cache-Control"] == "no-store, private"
    assert response["X-Robots-Tag"] == "noindex, nofollow, noarchive"
    assert response["Referrer-Policy"] == "no-referrer"
    # Only that incident: nothing of the same operator's other customer's incident.
    assert str(world.slow.public_id) not in body
    assert world.slow.verdict["subject"]["job"] not in body
    assert len(_charts(body)) == len(world.fault.verdict["evidence"])
    # A signed-in user opening a share link gets the same standalone page.
    _login(client, "shpalpha-op-admin")
    signed_in = client.get(_share(world.a, world.fault)).content.decode()
    assert 'nav class="console"' not in signed_in


def _shared_page_queries() -> int:
    """The link resolved in the system context, its open logged in the tenant context, the
    verdict page's reads as the job's customer (the incident with its job, its revisions, the
    job's list price, the job's span, its GPUs and nodes, the series catalog, the events),
    and the masking's one read of the job's nodes; on PostgreSQL the tenant settings'
    set_config statements around each context; on SQLite the block read and the savepoints."""
    return {"postgresql": 21, "sqlite": 16}[connection.vendor]


@pytest.mark.parametrize("mask", [False, True])
def test_shared_page_queries_are_pinned(
    world: World, django_assert_num_queries: Any, mask: bool
) -> None:
    tenant_services.do_set_mask_node_names(world.a.principal(world.a.operator_admin), mask=mask)
    client = Client()
    url = _share(world.a, world.slow)
    with django_assert_num_queries(_shared_page_queries() + mask):
        assert client.get(url).status_code == 200
    # A verdict citing three times the evidence: the same count.
    evidence = world.slow.verdict["evidence"]
    tripled = [
        dict(row, id=f"e{k * len(evidence) + i + 1}")
        for k in range(3)
        for i, row in enumerate(evidence)
    ]
    with tenant_context(world.a.operator.pk):
        Incident.objects.for_tenant(world.a.operator.pk).filter(pk=world.slow.pk).update(
            verdict=dict(world.slow.verdict, evidence=tripled)
        )
    with django_assert_num_queries(_shared_page_queries() + mask):
        body = client.get(url).content.decode()
    assert len(_charts(body)) == 3 * len(evidence)


def test_summary_page_queries_are_pinned(
    client: Client, world: World, django_assert_num_queries: Any
) -> None:
    """The signed-in request's own statements (session, user, membership, the tenant context:
    11 on PostgreSQL, 7 on SQLite), the operator row, the verdict page's reads as a customer
    user (incident, revisions, list price, the job's data span, its GPUs and nodes, series
    catalog, events; the block read too on SQLite), and, when masking, the job's nodes."""
    request = {"postgresql": 11, "sqlite": 7}[connection.vendor]
    expected = request + 1 + 7 + (connection.vendor == "sqlite")
    _login(client, "shpalpha-customer-viewer")
    url = f"/incidents/{world.slow.public_id}/summary/"
    with django_assert_num_queries(expected):
        assert client.get(url).status_code == 200
    tenant_services.do_set_mask_node_names(world.a.principal(world.a.operator_admin), mask=True)
    with django_assert_num_queries(expected + 1):
        assert client.get(url).status_code == 200


def test_fleet_health_verdict_shared_by_the_operator(a: Tenant) -> None:
    """A verdict without a job (a GPU's health) is read as the operator, read-only: the GPU's
    own charts; masked, its UUID never appears. Customers cannot share it."""
    from investigations.tasks import evaluate_fleet_health

    op = a.operator.pk
    sim = store_sim(op, "gpu_degrading", duration_s=300, agent_id="shpalpha-degrading")
    for gpu in sim.offline_gpu_families:
        assert evaluate_fleet_health(op, gpu) == "evaluated"
    with tenant_context(op):
        incident = Incident.objects.for_tenant(op).get(job__isnull=True)
    with pytest.raises(Http404):
        services.do_create_share_link(
            a.principal(a.customer_admin), incident=incident.public_id, expires_in_s=3600
        )
    tenant_services.do_set_mask_node_names(a.principal(a.operator_admin), mask=True)
    response = Client().get(_share(a, incident))
    assert response.status_code == 200
    body = response.content.decode()
    assert "none (a GPU's health)" in body
    assert len(_charts(body)) == len(incident.verdict["evidence"])
    assert incident.subject_gpu not in body and incident.subject_gpu[:12] not in body
    assert incident.subject_node not in body and "gpu-1" in body


def test_summary_page_makes_lists_and_revokes_share_links(client: Client, world: World) -> None:
    _login(client, "shpalpha-customer-admin")
    summary = f"/incidents/{world.slow.public_id}/summary/"
    create = f"/incidents/{world.slow.public_id}/share-links/"
    assert client.post(create, {"expires_in_s": "59"}).status_code == 400
    assert b"expires_in_s" in client.post(create, {"expires_in_s": "forever"}).content
    made = client.post(create, {"expires_in_s": "3600"})
    assert made.status_code == 302 and made["Location"] == summary
    page = client.get(summary)
    assert page["Cache-Control"] == "no-store"
    [url] = re.findall(
        r'data-testid="new-share-link">[^<]*<code>([^<]+)</code>', page.content.decode()
    )
    assert 'data-testid="new-share-link"' not in client.get(summary).content.decode()  # once
    path = "/" + url.split("://", 1)[1].split("/", 1)[1]
    assert Client().get(path).status_code == 200
    body = client.get(summary).content.decode()
    assert body.count('data-testid="share-link"') == 1
    assert re.search(r'data-testid="share-link">.*?<td class="num">1</td>', body, re.S)
    [revoke] = re.findall(r'action="(/incidents/[^"]+/revoke/)"', body)
    assert client.post(revoke).status_code == 302
    assert Client().get(path).status_code == 410
    assert client.post(revoke).status_code == 404  # already revoked
    # Another customer's incident, another operator's; viewers cannot share at all.
    assert (
        client.post(
            f"/incidents/{world.fault.public_id}/share-links/", {"expires_in_s": "3600"}
        ).status_code
        == 404
    )
    assert (
        client.post(
            f"/incidents/{world.other.public_id}/share-links/", {"expires_in_s": "3600"}
        ).status_code
        == 404
    )
    client.logout()
    _login(client, "shpalpha-customer-viewer")
    assert 'data-testid="share-links"' not in client.get(summary).content.decode()
    assert client.post(create, {"expires_in_s": "3600"}).status_code == 404
    client.logout()
    _login(client, "shpbravo-op-admin")
    assert client.post(revoke).status_code == 404
