"""The audit log: changes made through the API and the services (API tokens, list prices,
notification channels, memberships) each leave one entry with who, what and when, in the
change's transaction; GET /api/v1/audit-log/ is for operator admins only, newest first,
cursor-paginated, filtered by action, actor and time; another operator's entries are never
listed; bad filters name the parameter; the query count does not grow with entries.

(Incident actions and share links write theirs in investigations' services: their entries are
checked in investigations/tests/test_api_incident_actions.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tenants import services
from tenants.context import tenant_context
from tenants.models import AuditEvent, Role, TokenScope
from tenants.testing import Tenant, make_tenant
from tenants.tokens import display_prefix

pytestmark = pytest.mark.django_db

URL = "/api/v1/audit-log/"


def session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def entries(client: APIClient, query: str = "") -> list[dict[str, Any]]:
    response = client.get(f"{URL}{query}")
    assert response.status_code == 200, response.content
    results: list[dict[str, Any]] = response.json()["results"]
    return results


@pytest.fixture
def a() -> Tenant:
    return make_tenant("aud-a")


@pytest.fixture
def b() -> Tenant:
    return make_tenant("aud-b")


def _changes(tenant: Tenant) -> str:
    """Changes through the API as the operator admin (session) and one of its tokens; the
    token's prefix."""
    admin = session(tenant.operator_admin)
    made = admin.post("/api/v1/api-tokens/", {"name": "ticketing", "scope": "read"}, format="json")
    assert made.status_code == 201, made.content
    assert admin.post(f"/api/v1/api-tokens/{made.json()['id']}/revoke/").status_code == 200
    token = tenant.api_token(tenant.operator_admin, scope=TokenScope.ADMIN)
    api = bearer(token)
    price = api.post(
        "/api/v1/gpu-prices/",
        {"gpu_model": "NVIDIA H100", "price_per_gpu_hour": "2.49"},
        format="json",
    )
    assert price.status_code == 201, price.content
    changed = api.patch(
        f"/api/v1/gpu-prices/{price.json()['id']}/", {"price_per_gpu_hour": "2.19"}, format="json"
    )
    assert changed.status_code == 200, changed.content
    assert api.delete(f"/api/v1/gpu-prices/{price.json()['id']}/").status_code == 204
    channel = admin.post(
        "/api/v1/notification-channels/",
        {"name": "Hook", "kind": "webhook", "target": "https://hooks.aud.example/p/abcdef12"},
        format="json",
    )
    assert channel.status_code == 201, channel.content
    assert admin.delete(f"/api/v1/notification-channels/{channel.json()['id']}/").status_code == 204
    prefix: str = display_prefix(token)
    return prefix


def test_each_change_leaves_one_entry_with_who_what_and_when(a: Tenant, b: Tenant) -> None:
    before = datetime.now(UTC)
    prefix = _changes(a)
    admin = session(a.operator_admin)
    listed = entries(admin)
    mine = [e for e in listed if e["action"] != "membership.create"]
    actions = [e["action"] for e in reversed(mine)]  # oldest first
    assert actions == [
        "api_token.create",
        "api_token.revoke",
        "api_token.create",  # the admin-scope token the test made through the service
        "gpu_price.create",
        "gpu_price.update",
        "gpu_price.delete",
        "channel.create",
        "channel.delete",
    ]
    by_action = {e["action"]: e for e in mine}
    assert by_action["gpu_price.update"]["actor"] == f"api-token:{prefix}"
    assert by_action["gpu_price.update"]["detail"]["price_per_gpu_hour"] == "2.1900"
    assert by_action["channel.delete"]["actor"] == a.operator_admin.username
    assert by_action["channel.delete"]["detail"] == {"name": "Hook", "kind": "webhook"}
    assert by_action["api_token.revoke"]["target_type"] == "api_token"
    for entry in mine:
        assert datetime.fromisoformat(entry["at"].replace("Z", "+00:00")) >= before
    # Newest first.
    assert listed == sorted(listed, key=lambda e: (e["at"], e["id"]), reverse=True)
    # Another operator's log holds none of it, and a's none of b's.
    assert all(e["action"] == "membership.create" for e in entries(session(b.operator_admin)))
    _changes(b)
    assert {e["id"] for e in entries(admin)} == {e["id"] for e in listed}


def test_membership_changes_are_audited(a: Tenant) -> None:
    admin = a.principal(a.operator_admin)
    invited, _link = services.do_invite_member(
        admin, username="aud-new", email="new@aud.example", role=Role.OPERATOR_SUPPORT
    )
    services.do_change_member_role(admin, invited.pk, role=Role.OPERATOR_ADMIN)
    services.do_set_member_active(admin, invited.pk, active=False)
    # A change that changes nothing records nothing.
    services.do_set_member_active(admin, invited.pk, active=False)
    log = entries(session(a.operator_admin), "?action=membership.")
    assert [e["action"] for e in reversed(log)][-3:] == [
        "membership.invite",
        "membership.role_change",
        "membership.deactivate",
    ]
    assert log[1]["detail"] == {"from": "operator_support", "to": "operator_admin"}
    assert {e["target_id"] for e in log[:3]} == {str(invited.pk)}
    # make_tenant's members were created by no one: the system.
    created = [e for e in log if e["action"] == "membership.create"]
    assert len(created) == 3 and {e["actor"] for e in created} == {"system"}


def test_a_refused_change_leaves_no_entry(a: Tenant, b: Tenant) -> None:
    foreign = b.principal(b.operator_admin)
    token, _ = services.do_create_api_token(foreign, name="b's", scope=TokenScope.READ)
    admin = session(a.operator_admin)
    assert admin.post(f"/api/v1/api-tokens/{token.pk}/revoke/").status_code == 404
    support = session(a.operator_support)
    assert (
        support.post(
            "/api/v1/gpu-prices/", {"gpu_model": "X", "price_per_gpu_hour": "1"}, format="json"
        ).status_code
        == 403
    )
    with tenant_context(a.operator.pk):
        actions = set(AuditEvent.objects.for_tenant(a.operator.pk).values_list("action", flat=True))
    assert actions == {"membership.create"}


def test_only_operator_admins_read_it(a: Tenant, b: Tenant) -> None:
    _changes(a)
    assert entries(bearer(a.api_token(a.operator_admin, scope=TokenScope.READ)))
    for user in (a.operator_support, a.customer_admin, a.customer_viewer):
        assert session(user).get(URL).status_code == 403, user
    assert bearer(a.api_token(a.customer_admin)).get(URL).status_code == 403
    assert APIClient().get(URL).status_code == 401
    # The customer's principal never reaches a row even past the permission (no customer path).
    with tenant_context(a.operator.pk):
        assert not AuditEvent.objects.for_tenant(a.principal(a.customer_admin)).exists()


def test_filters_and_bad_filters_name_the_parameter(a: Tenant) -> None:
    prefix = _changes(a)
    admin = session(a.operator_admin)
    assert {e["action"] for e in entries(admin, "?action=gpu_price.update")} == {"gpu_price.update"}
    assert {e["action"] for e in entries(admin, "?action=gpu_price.")} == {
        "gpu_price.create",
        "gpu_price.update",
        "gpu_price.delete",
    }
    by_token = entries(admin, f"?actor=api-token:{prefix}")
    assert {e["action"] for e in by_token} == {
        "gpu_price.create",
        "gpu_price.update",
        "gpu_price.delete",
    }
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert entries(admin, f"?since={future}") == []
    assert len(entries(admin, f"?until={future}")) == len(entries(admin))
    for query, name in (
        ("?since=yesterday", "since"),
        ("?until=2026-13-01T00:00:00", "until"),
        ("?since=2026-12-02T10:00:00&until=2026-12-02T09:00:00", "until"),
        ("?page_size=0", "page_size"),
        ("?cursor=garbage", "cursor"),
    ):
        response = admin.get(f"{URL}{query}")
        assert response.status_code == 400, query
        assert name in response.json()["error"]["fields"], query


def test_cursor_pages_and_a_fixed_query_count(a: Tenant) -> None:
    admin = session(a.operator_admin)
    principal = a.principal(a.operator_admin)

    def price_changes(n: int) -> None:
        for k in range(n):
            price = {"gpu_model": f"GPU-{n}-{k}", "price_per_gpu_hour": "1.5"}
            assert admin.post("/api/v1/gpu-prices/", price, format="json").status_code == 201

    price_changes(3)
    with CaptureQueriesContext(connection) as few:
        first = admin.get(f"{URL}?page_size=2")
    price_changes(20)
    with CaptureQueriesContext(connection) as many:
        again = admin.get(f"{URL}?page_size=2")
    assert len(first.json()["results"]) == len(again.json()["results"]) == 2
    assert len(many.captured_queries) == len(few.captured_queries)
    # Following `next` walks every entry once, newest first.
    seen: list[int] = []
    url: str | None = f"{URL}?page_size=7"
    while url:
        page = admin.get(url).json()
        seen += [e["id"] for e in page["results"]]
        url = page["next"]
    with tenant_context(a.operator.pk):
        expected = list(
            AuditEvent.objects.for_tenant(principal)
            .order_by("-at", "-id")
            .values_list("id", flat=True)
        )
    # 23 prices, and make_tenant's 3 members (its admin comes with the operator, unaudited).
    assert seen == expected and len(seen) == 23 + 3
