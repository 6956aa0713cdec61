"""Sign-in throttling and lockout (issue 16, "Web"): the reproduction (30 wrong passwords, then
the right one, all accepted) now ends locked out; per account and per address; a success resets
the account's count; the lockout expires; each failure, lockout and success is an audit entry in
the user's own operator's log (another operator's log and a customer's principal see none);
/admin/login/ shares the throttle and /admin/ stays staff-only.

The counts live in the cache (the shared Redis under CI); the root conftest gives each test its
own key prefix."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.context import tenant_context
from tenants.login_throttle import do_unlock
from tenants.models import AuditEvent
from tenants.testing import TEST_PASSWORD, Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("thr-a", "thr-b")
_addresses = (f"198.51.100.{n}" for n in itertools.count(10))


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.PROOF_LOGIN_MAX_FAILURES = 5
    settings.PROOF_LOGIN_MAX_ADDRESS_FAILURES = 20
    settings.PROOF_LOGIN_WINDOW_S = 900
    settings.PROOF_LOGIN_LOCKOUT_S = 900


def client_at() -> tuple[Client, str]:
    """A client from a fresh address (the root conftest gives each test its own cache keys)."""
    address = next(_addresses)
    return Client(REMOTE_ADDR=address), address


def sign_in(client: Client, username: str, password: str, url: str = "/login/") -> int:
    return int(client.post(url, {"username": username, "password": password}).status_code)


def audit(tenant: Tenant, action: str) -> list[AuditEvent]:
    with tenant_context(tenant.operator.pk):
        return list(
            AuditEvent.objects.for_tenant(tenant.operator.pk).filter(action=action).order_by("id")
        )


def test_thirty_wrong_passwords_then_the_right_one_is_refused(a: Tenant) -> None:
    user = a.operator_admin.username
    client, _ = client_at()
    statuses = [sign_in(client, user, f"guess-{n}") for n in range(30)]
    assert statuses[:4] == [200] * 4  # the form again, "Please enter a correct..."
    assert statuses[4:] == [429] * 26  # the fifth failure locks the account
    response = client.post("/login/", {"username": user, "password": TEST_PASSWORD})
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 900
    body = response.content.decode()
    assert "Too many failed sign-ins for this account" in body and "15 minutes" in body
    assert client.get("/").status_code == 302  # not signed in


def test_account_lockout_holds_across_addresses(a: Tenant, b: Tenant) -> None:
    user = a.operator_admin.username
    for n in range(5):
        client, _ = client_at()
        assert sign_in(client, user, f"guess-{n}") == (429 if n == 4 else 200)
    fresh, _ = client_at()
    assert sign_in(fresh, user, TEST_PASSWORD) == 429
    # Only that account: another operator's user from the same address gets in.
    assert sign_in(fresh, b.operator_admin.username, TEST_PASSWORD) == 302


def test_address_lockout_covers_every_account_from_it(a: Tenant) -> None:
    user = a.operator_admin.username
    names = [f"nobody-{n}" for n in range(20)]
    client, _ = client_at()
    statuses = [sign_in(client, name, "guess") for name in names]
    assert statuses == [200] * 19 + [429]
    response = client.post("/login/", {"username": user, "password": TEST_PASSWORD})
    assert response.status_code == 429
    assert "Too many failed sign-ins for your address" in response.content.decode()
    # The same account from another address is not locked: its own count is 0.
    elsewhere, _ = client_at()
    assert sign_in(elsewhere, user, TEST_PASSWORD) == 302


def test_success_resets_the_accounts_count(a: Tenant) -> None:
    user = a.customer_viewer.username
    client, _ = client_at()
    assert [sign_in(client, user, "guess") for _ in range(4)] == [200] * 4
    assert sign_in(client, user, TEST_PASSWORD) == 302
    client.post("/logout/")
    assert [sign_in(client, user, "guess") for _ in range(4)] == [200] * 4
    assert sign_in(client, user, TEST_PASSWORD) == 302


def test_lockout_expires(a: Tenant, settings: Any) -> None:
    settings.PROOF_LOGIN_MAX_FAILURES = 2
    settings.PROOF_LOGIN_LOCKOUT_S = 1
    user = a.operator_support.username
    client, _ = client_at()
    assert [sign_in(client, user, "guess") for _ in range(3)] == [200, 429, 429]
    assert sign_in(client, user, TEST_PASSWORD) == 429
    time.sleep(1.2)  # the lockout's own expiry, not a speed target
    assert sign_in(client, user, TEST_PASSWORD) == 302


def test_failures_lockout_and_success_are_audited_in_own_operator_only(
    a: Tenant, b: Tenant
) -> None:
    user = a.customer_admin.username
    client, address = client_at()
    assert sign_in(client, user, "guess") == 200
    assert sign_in(client, user, TEST_PASSWORD) == 302
    client.post("/logout/")
    assert [sign_in(client, user, "guess") for _ in range(5)] == [200] * 4 + [429]
    assert sign_in(client, "nobody-at-all", "guess") == 200  # no membership: no entry anywhere

    failures = audit(a, "login.failure")
    assert len(failures) == 6
    assert {(e.actor, e.actor_user_id) for e in failures} == {(user, a.customer_admin.pk)}
    assert failures[0].detail == {"address": address, "where": "console", "username": user}
    assert failures[0].customer_id == a.customer.pk
    (success,) = audit(a, "login.success")
    assert success.detail == {"address": address, "where": "console"}
    (lockout,) = audit(a, "login.lockout")
    assert (lockout.detail["scope"], lockout.detail["address"]) == ("account", address)
    with tenant_context(b.operator.pk):
        assert (
            not AuditEvent.objects.for_tenant(b.operator.pk)
            .filter(action__startswith="login.")
            .exists()
        )
    # The audit log is for operator admins: the customer's own principal sees none of it.
    with tenant_context(a.operator.pk):
        assert not AuditEvent.objects.for_tenant(a.principal(a.customer_admin)).exists()


@pytest.fixture
def staff() -> str:
    get_user_model().objects.create_user(
        username="thr-staff", password=TEST_PASSWORD, is_staff=True, is_superuser=True
    )
    return "thr-staff"


def test_admin_login_is_behind_the_same_throttle(staff: str) -> None:
    client, _ = client_at()
    statuses = [sign_in(client, staff, f"guess-{n}", "/admin/login/") for n in range(6)]
    assert statuses == [200] * 4 + [429, 429]
    response = client.post("/admin/login/", {"username": staff, "password": TEST_PASSWORD})
    assert response.status_code == 429
    assert "Too many failed sign-ins" in response.content.decode()
    assert client.get("/admin/").status_code == 302
    # The lockout is the account's, whichever page counted it: the console refuses it too.
    assert sign_in(client, staff, TEST_PASSWORD) == 429
    elsewhere, _ = client_at()
    assert sign_in(elsewhere, staff, TEST_PASSWORD, "/admin/login/") == 429


def test_admin_refuses_members_and_counts_their_attempts(a: Tenant, staff: str) -> None:
    for user in (a.operator_admin, a.customer_admin):
        client, _ = client_at()
        # The right password of a non-staff member is refused by the admin, and counted.
        statuses = [
            sign_in(client, user.username, TEST_PASSWORD, "/admin/login/") for _ in range(5)
        ]
        assert statuses == [200] * 4 + [429]
        assert client.get("/admin/").status_code == 302
    admin_failures = [e for e in audit(a, "login.failure") if e.detail["where"] == "admin"]
    assert len(admin_failures) == 10
    # Signed in to the console, a member still cannot see any admin page.
    member = Client()
    member.force_login(a.operator_admin)
    for path in ("/admin/", "/admin/tenants/operator/", "/admin/auth/user/"):
        response = member.get(path)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], path
    # Staff get in.
    client, _ = client_at()
    assert sign_in(client, staff, TEST_PASSWORD, "/admin/login/") == 302
    assert client.get("/admin/").status_code == 200


def test_unlock_lets_a_verified_person_back_in(a: Tenant) -> None:
    user = a.operator_admin.username
    client, _ = client_at()
    assert [sign_in(client, user, "guess") for _ in range(5)] == [200] * 4 + [429]
    do_unlock(username=user)
    assert sign_in(client, user, TEST_PASSWORD) == 302
