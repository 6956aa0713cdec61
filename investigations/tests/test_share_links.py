"""Share links over the API, on incidents the live pipeline wrote from simulated runs: create
(with an API token), open without signing in, each open logged, revoke (the URL 410 and the
API 404 from the next request), expiry, who may create and see links, bad input."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from ingest import services as ingest_services
from ingest.models import Job
from investigations import services, window_cache
from investigations.models import Incident, ShareLink, ShareLinkOpen
from investigations.tests.live_helpers import job_pk, store_sim
from tenants.context import tenant_context
from tenants.models import Customer, TokenScope
from tenants.testing import Tenant, make_second_customer, make_tenant

pytestmark = pytest.mark.django_db

DAY = 24 * 3600


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    # On SQLite a rolled-back test's row ids are given out again: no cached identity may be
    # another test's.
    ingest_services.clear_caches()
    window_cache.CACHE.clear()


@dataclass
class World:
    a: Tenant
    b: Tenant
    second: Customer  # a's other customer
    second_admin: Any
    mine: Incident  # a's customer's job (slow_rank)
    theirs: Incident  # a's second customer's job (hardware_fault)
    other: Incident  # b's


def _evaluate(tenant: Tenant, scenario: str, customer: Customer, seed: int = 1) -> Incident:
    op = tenant.operator.pk
    sim = store_sim(op, scenario, seed=seed, agent_id=f"{tenant.operator.slug}-{scenario}")
    with tenant_context(op):
        Job.objects.for_tenant(op).filter(job_id=sim.jobs[0]).update(customer=customer)
    pk = job_pk(op, sim.jobs[0])
    services.evaluate_job(op, pk)
    with tenant_context(op):
        return Incident.objects.for_tenant(op).get(job_id=pk, family=scenario)


@pytest.fixture
def world() -> World:
    a, b = make_tenant("sha"), make_tenant("shb")
    second, second_admin = make_second_customer(a, "second", "sha-second-admin")
    return World(
        a=a,
        b=b,
        second=second,
        second_admin=second_admin,
        mine=_evaluate(a, "slow_rank", a.customer),
        theirs=_evaluate(a, "hardware_fault", second),
        other=_evaluate(b, "slow_rank", b.customer, seed=2),
    )


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _create(client: APIClient, incident: Incident, expires_in_s: int = DAY) -> Any:
    return client.post(
        "/api/v1/share-links/",
        {"incident": str(incident.public_id), "expires_in_s": expires_in_s},
        format="json",
    )


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


def test_share_flow_end_to_end(world: World) -> None:
    api = bearer(world.a.api_token(world.a.operator_admin))
    created = _create(api, world.mine)
    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body) == {"id", "url", "expires_at"}
    assert "/share/prfs_" in body["url"]
    token = _path(body["url"]).split("/")[2]
    # Only the token's hash is stored.
    with tenant_context(world.a.operator.pk):
        link = ShareLink.objects.for_tenant(world.a.operator.pk).get(pk=body["id"])
    assert token not in link.token_hash and len(link.token_hash) == 64

    anonymous = Client()
    page = anonymous.get(
        _path(body["url"]), REMOTE_ADDR="203.0.113.7", HTTP_USER_AGENT="Mozilla/5.0 (share test)"
    )
    assert page.status_code == 200
    html = page.content.decode()
    assert world.mine.verdict["recommendation"] in html
    assert world.mine.verdict["summary"].split("[")[0].strip() in html
    assert "Operator sha" in html
    assert html.count('data-testid="evidence-chart"') == len(world.mine.verdict["evidence"])
    assert page["Cache-Control"] == "no-store, private"
    assert "noindex" in page["X-Robots-Tag"]
    assert page["Referrer-Policy"] == "no-referrer"

    opens = api.get(f"/api/v1/share-links/{body['id']}/opens/")
    assert opens.status_code == 200
    rows = opens.json()["results"]
    assert len(rows) == 1
    assert rows[0]["address"] == "203.0.113.7"
    assert rows[0]["user_agent"] == "Mozilla/5.0 (share test)"
    listed = api.get("/api/v1/share-links/").json()["results"]
    assert [(r["id"], r["incident"], r["opens"]) for r in listed] == [
        (body["id"], str(world.mine.public_id), 1)
    ]

    assert api.delete(f"/api/v1/share-links/{body['id']}/").status_code == 204
    gone = anonymous.get(_path(body["url"]))
    assert gone.status_code == 410
    assert world.mine.verdict["recommendation"] not in gone.content.decode()
    assert api.get(f"/api/v1/share-links/{body['id']}/").status_code == 404
    assert api.get(f"/api/v1/share-links/{body['id']}/opens/").status_code == 404
    assert api.delete(f"/api/v1/share-links/{body['id']}/").status_code == 404
    assert api.get("/api/v1/share-links/").json()["results"] == []
    # The refused open is not logged as an open.
    with tenant_context(world.a.operator.pk):
        assert ShareLinkOpen.objects.for_tenant(world.a.operator.pk).count() == 1


def test_unknown_and_malformed_tokens_are_404(world: World) -> None:
    anonymous = Client()
    for token in ("prfs_" + "x" * 43, "nothing", "prf_" + "y" * 43):
        response = anonymous.get(f"/share/{token}/")
        assert response.status_code == 404
        assert response["X-Robots-Tag"].startswith("noindex")


def test_expiry_is_honoured(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    api = session(world.a.operator_admin)
    body = _create(api, world.mine, expires_in_s=60).json()
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert timedelta(seconds=55) < expires - timezone.now() <= timedelta(seconds=60)
    anonymous = Client()
    assert anonymous.get(_path(body["url"])).status_code == 200
    later = timezone.now() + timedelta(seconds=61)
    monkeypatch.setattr("investigations.share_link_services.timezone.now", lambda: later)
    response = anonymous.get(_path(body["url"]))
    assert response.status_code == 410
    assert "expired" in response.content.decode()


BAD_INPUT: list[tuple[dict[str, Any], str]] = [
    ({"expires_in_s": 59}, "expires_in_s"),
    ({"expires_in_s": 30 * DAY + 1}, "expires_in_s"),
    ({"expires_in_s": "soon"}, "expires_in_s"),
    ({"expires_in_s": None}, "expires_in_s"),
    ({"incident": "not-a-uuid"}, "incident"),
    ({"incident": None}, "incident"),
]


def test_bad_input_is_400_naming_the_field(world: World) -> None:
    api = session(world.a.operator_admin)
    for payload, field in BAD_INPUT:
        data = {"incident": str(world.mine.public_id), "expires_in_s": DAY, **payload}
        response = api.post("/api/v1/share-links/", data, format="json")
        assert response.status_code == 400, payload
        assert field in response.json()["error"]["fields"], (payload, response.json())
    assert api.post("/api/v1/share-links/", {}, format="json").json()["error"]["fields"].keys() == {
        "incident",
        "expires_in_s",
    }
    with tenant_context(world.a.operator.pk):
        assert not ShareLink.objects.for_tenant(world.a.operator.pk).exists()


def test_who_may_create(world: World) -> None:
    a = world.a
    # Operator roles with write access: any incident of theirs.
    assert _create(session(a.operator_support), world.theirs).status_code == 201
    # A read-only token cannot, whoever made it; nor can customer viewers.
    read_only = bearer(a.api_token(a.operator_admin, scope=TokenScope.READ))
    assert _create(read_only, world.mine).status_code == 403
    viewer = session(a.customer_viewer)
    assert _create(viewer, world.mine).status_code == 403
    assert viewer.get("/api/v1/share-links/").status_code == 403
    assert Client().get("/api/v1/share-links/").status_code in (401, 403)
    # Customer admins: their own jobs' incidents only.
    customer = session(a.customer_admin)
    assert _create(customer, world.mine).status_code == 201
    assert _create(customer, world.theirs).status_code == 404
    # Another operator's incident does not exist for this operator.
    assert _create(session(a.operator_admin), world.other).status_code == 404
    assert _create(session(world.b.operator_admin), world.mine).status_code == 404


def test_tenancy_of_links_and_their_opens(world: World) -> None:
    a = world.a
    operator = session(a.operator_admin)
    mine = _create(operator, world.mine).json()
    theirs = _create(operator, world.theirs).json()
    b_link = _create(session(world.b.operator_admin), world.other).json()
    Client().get(_path(theirs["url"]), HTTP_USER_AGENT="second's browser")

    def ids(client: APIClient) -> set[int]:
        return {r["id"] for r in client.get("/api/v1/share-links/").json()["results"]}

    assert ids(operator) == {mine["id"], theirs["id"]}
    one = operator.get(f"/api/v1/share-links/?incident={world.theirs.public_id}").json()
    assert [r["id"] for r in one["results"]] == [theirs["id"]]
    bad = operator.get("/api/v1/share-links/?incident=nope")
    assert bad.status_code == 400 and "incident" in bad.json()["error"]["fields"]
    customer = session(a.customer_admin)
    assert ids(customer) == {mine["id"]}
    second = session(world.second_admin)
    assert ids(second) == {theirs["id"]}
    b = session(world.b.operator_admin)
    assert ids(b) == {b_link["id"]}
    # Another customer's or another operator's link: 404 for reading, its opens and revoking.
    for client, link in ((customer, theirs), (b, mine), (b, theirs), (operator, b_link)):
        assert client.get(f"/api/v1/share-links/{link['id']}/").status_code == 404
        assert client.get(f"/api/v1/share-links/{link['id']}/opens/").status_code == 404
        assert client.delete(f"/api/v1/share-links/{link['id']}/").status_code == 404
    opens = second.get(f"/api/v1/share-links/{theirs['id']}/opens/").json()["results"]
    assert [o["user_agent"] for o in opens] == ["second's browser"]
    # Nothing was revoked by the refused deletes.
    assert Client().get(_path(mine["url"])).status_code == 200
    assert Client().get(_path(b_link["url"])).status_code == 200
