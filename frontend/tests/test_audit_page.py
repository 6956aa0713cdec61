"""/settings/audit/ (issue 16): the operator's audit log on a console page, for operator admins.

Each kind of entry the issue names is made the way it happens — a sign-in through /login/, an
API token and an agent token through their services, a share link and its open through the
share page, a role change — and shown on the page; another operator's entries never are;
another operator's admin, a customer admin of the same operator, a customer viewer and
operator support get 404; the page's query count is pinned and does not grow with rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from investigations import services as investigation_services
from investigations import share_link_services
from investigations.models import Incident
from investigations.tests.live_helpers import job_pk, store_sim
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import Role
from tenants.testing import TEST_PASSWORD, Tenant, make_second_customer, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("audpa", "audpb")
URL = "/settings/audit/"


@dataclass
class World:
    a: Tenant
    b: Tenant
    incident: Incident
    share_token: str


def _incident(tenant: Tenant) -> Incident:
    op = tenant.operator.pk
    sim = store_sim(op, "slow_rank", seed=1, nodes=1, agent_id=f"{tenant.operator.slug}-aud")
    pk = job_pk(op, sim.jobs[0])
    investigation_services.evaluate_job(op, pk)
    with tenant_context(op):
        return Incident.objects.for_tenant(op).get(job_id=pk, family="slow_rank")


def _signed_in(tenant: Tenant, role: str = "operator_admin") -> Client:
    client = Client()
    user = getattr(tenant, role)
    response = client.post("/login/", {"username": user.username, "password": TEST_PASSWORD})
    assert response.status_code == 302, response.content[:300]
    return client


@pytest.fixture
def world(a: Tenant, b: Tenant) -> World:
    admin = a.principal(a.operator_admin)
    tenant_services.do_create_api_token(admin, name="ci-token", scope="read")
    tenant_services.do_create_agent_token(admin, name="rack-7")
    incident = _incident(a)
    _, token = share_link_services.do_create_share_link(
        admin, incident=incident.public_id, expires_in_s=3600
    )
    member = tenant_services.do_create_member(
        operator_id=a.operator.pk,
        username="audpa-promoted",
        email="",
        password=TEST_PASSWORD,
        role=Role.OPERATOR_SUPPORT,
    )
    tenant_services.do_change_member_role(admin, member.pk, role=Role.OPERATOR_ADMIN)
    # B's entries, which A's page must never show.
    b_admin = b.principal(b.operator_admin)
    tenant_services.do_create_api_token(b_admin, name="bravo-secret-token", scope="read")
    return World(a, b, incident, token)


def _actions(html: str) -> set[str]:
    return set(re.findall(r'data-action="([^"]+)"', html))


def test_the_operator_admin_sees_each_kind_of_entry(world: World) -> None:
    # A customer-page view: the share link's page opened by someone without an account.
    opened = Client(REMOTE_ADDR="198.51.100.7").get(
        f"/share/{world.share_token}/", HTTP_USER_AGENT="AuditTest/1.0"
    )
    assert opened.status_code == 200
    client = _signed_in(world.a)  # the sign-in itself is an entry
    response = client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert {
        "login.success",
        "api_token.create",
        "agent_token.create",
        "share_link.create",
        "membership.create",
        "membership.role_change",
    } <= _actions(html)
    assert 'data-testid="audit-views"' in html
    assert "198.51.100.7" in html and "AuditTest/1.0" in html
    assert "bravo-secret-token" not in html and "audpb" not in html
    # The tabs narrow it.
    signins = client.get(URL, {"kind": "sign-ins"}).content.decode()
    assert _actions(signins) == {"login.success"}
    tokens = client.get(URL, {"kind": "tokens"}).content.decode()
    assert _actions(tokens) == {"api_token.create", "agent_token.create"}
    views = client.get(URL, {"kind": "views"}).content.decode()
    assert "198.51.100.7" in views and not _actions(views)
    # The settings pages link it, for this role.
    assert f'href="{URL}"' in client.get("/settings/").content.decode()


def test_a_failed_sign_in_is_shown_too(world: World) -> None:
    Client().post("/login/", {"username": world.a.operator_admin.username, "password": "wrong"})
    html = _signed_in(world.a).get(URL, {"kind": "sign-ins"}).content.decode()
    assert {"login.failure", "login.success"} <= _actions(html)


def test_b_admin_sees_only_b(world: World) -> None:
    html = _signed_in(world.b).get(URL).content.decode()
    assert "bravo-secret-token" in html  # its own token's entry
    assert "api_token.create" in _actions(html)
    assert "share_link.create" not in _actions(html)
    assert "audpa-promoted" not in html and "198.51.100.7" not in html


@pytest.mark.parametrize("role", ["operator_support", "customer_admin", "customer_viewer"])
def test_non_operator_admins_get_404(world: World, role: str) -> None:
    assert _signed_in(world.a, role).get(URL).status_code == 404


def test_a_customer_admin_of_another_customer_of_the_operator_gets_404(world: World) -> None:
    _, second_admin = make_second_customer(world.a, slug="audpa-second")
    client = Client()
    assert client.login(username=second_admin.username, password=TEST_PASSWORD)
    assert client.get(URL).status_code == 404
    assert client.get(URL, {"kind": "views"}).status_code == 404


def test_signed_out_is_sent_to_sign_in_and_a_bad_kind_is_400(world: World) -> None:
    response = Client().get(URL)
    assert (response.status_code, response["Location"]) == (302, f"/login/?next={URL}")
    bad = _signed_in(world.a).get(URL, {"kind": "passwords"})
    assert bad.status_code == 400 and "kind" in bad.content.decode()


def test_the_query_count_is_pinned_and_does_not_grow_with_rows(world: World) -> None:
    client = _signed_in(world.a)
    client.get(URL)  # warm: session, caches

    def count(params: dict[str, str]) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(URL, params).status_code == 200
        return len(queries.captured_queries)

    before = {kind: count({"kind": kind}) for kind in ("all", "views")}
    admin = world.a.principal(world.a.operator_admin)
    for i in range(15):
        tenant_services.do_create_api_token(admin, name=f"more-{i}", scope="read")
        Client().get(f"/share/{world.share_token}/")
    after = {kind: count({"kind": kind}) for kind in ("all", "views")}
    assert after == before
    # Session and user (2); the membership, read in a system block (savepoint, grant, read,
    # grant restored, release: 5); the request's tenant block (savepoint, grant, restore,
    # release: 4; the selector's block of the same tenant joins it); then the page: count and
    # rows of the entries and the newest views (3), or count and rows of the views (2). In a
    # test every block is nested in the test's transaction; a real request has no savepoints.
    if connection.vendor == "postgresql":
        assert before == {"all": 14, "views": 13}, before
