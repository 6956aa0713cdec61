"""The settings pages admins of both kinds have: users and roles, API tokens. Operator admins
manage the operator's members and tokens; customer admins their own customer's only (operator
users, another customer's members or tokens: 404, never listed); another operator: 404."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from frontend.tests.settings_helpers import BASE_QUERIES, sign_in
from tenants import services
from tenants.context import system_context, tenant_context
from tenants.models import ApiToken, Customer, Membership, Role
from tenants.testing import TEST_PASSWORD, Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("alpha", "bravo")


def body_of(response: Any) -> str:
    text: str = response.content.decode()
    return text


def member_id(user: User) -> int:
    with system_context():
        return Membership.objects.get(user_id=user.pk).pk


def fresh(user: User) -> User:
    with system_context():
        return get_user_model().objects.get(pk=user.pk)


def secret_of(body: str) -> str:
    return body.split('<pre class="secret-value"><code>')[1].split("</code>")[0]


def sibling(t: Tenant) -> tuple[Customer, User]:
    """A second customer of the same operator, with one viewer."""
    customer = services.do_create_customer(t.operator.pk, name="Sibling Team", slug="sibling")
    membership = services.do_create_member(
        operator_id=t.operator.pk,
        username=f"{t.operator.slug}-sibling-viewer",
        email="",
        password=TEST_PASSWORD,
        role=Role.CUSTOMER_VIEWER,
        customer_id=customer.pk,
    )
    return customer, membership.user


# --- users: who sees whom ----------------------------------------------------------------------


def test_operator_admin_sees_every_member_of_the_operator_only(
    client: Client, a: Tenant, b: Tenant
) -> None:
    sibling(a)
    body = body_of(sign_in(client, a.operator_admin).get("/settings/users/"))
    for name in (
        "alpha-op-admin",
        "alpha-operator-support",
        "alpha-customer-admin",
        "alpha-sibling-viewer",
    ):
        assert f"<td>{name}" in body
    assert 'alpha-op-admin <span class="muted">(you)</span>' in body
    assert "bravo" not in body.lower()


def test_customer_admin_sees_its_own_customers_members_only(
    client: Client, a: Tenant, b: Tenant
) -> None:
    sibling(a)
    body = body_of(sign_in(client, a.customer_admin).get("/settings/users/"))
    assert "<td>alpha-customer-admin" in body and "<td>alpha-customer-viewer" in body
    for hidden in ("alpha-op-admin", "alpha-operator-support", "alpha-sibling-viewer", "bravo"):
        assert hidden not in body
    # Nor can it invite into operator roles: they are not offered.
    assert 'value="operator_admin"' not in body and 'value="customer_viewer"' in body


# --- invite and the one-time set-password link ---------------------------------------------------


def test_invite_shows_a_one_time_link_the_member_sets_a_password_with(
    client: Client, a: Tenant
) -> None:
    sign_in(client, a.operator_admin)
    data = {
        "username": "newbie",
        "email": "newbie@alpha.example",
        "role": "customer_viewer",
        "customer": str(a.customer.pk),
    }
    response = client.post("/settings/users/", data)
    assert (response.status_code, response["Location"]) == (302, "/settings/users/")
    page = client.get("/settings/users/")
    assert page["Cache-Control"] == "no-store"
    body = body_of(page)
    assert "newbie invited." in body and '<span class="badge open">invited</span>' in body
    link = secret_of(body)
    assert link.startswith("http://testserver/password/set/")
    assert link not in body_of(client.get("/settings/users/"))  # shown once
    # The member, signed out, follows it (Django moves the token into the session first).
    member = Client()
    form_url = member.get(link.removeprefix("http://testserver"))["Location"]
    assert "Choose your password" in body_of(member.get(form_url))
    response = member.post(
        form_url,
        {"new_password1": "a-fresh-long-passphrase", "new_password2": "a-fresh-long-passphrase"},
    )
    assert (response.status_code, response["Location"]) == (302, "/password/set/done/")
    assert member.login(username="newbie", password="a-fresh-long-passphrase")
    # Used once: the link no longer works.
    again = Client().get(link.removeprefix("http://testserver"))
    assert 'data-testid="invalid-link"' in body_of(again)
    with system_context():
        membership = Membership.objects.get(user__username="newbie")
    assert (membership.operator_id, membership.customer_id, membership.role) == (
        a.operator.pk,
        a.customer.pk,
        Role.CUSTOMER_VIEWER,
    )


def test_invalid_invites_rerender_with_errors_naming_the_field(
    client: Client, a: Tenant, b: Tenant
) -> None:
    sign_in(client, a.operator_admin)
    cases = [
        (
            {"username": "alpha-customer-viewer", "role": "operator_support"},
            "username",
            "Username: a user named",
        ),
        (
            {"username": "x1", "role": "customer_viewer"},
            "customer",
            "Customer: Customer viewer is a customer role: pick the customer",
        ),
        (
            {"username": "x2", "role": "operator_admin", "customer": str(a.customer.pk)},
            "customer",
            "Customer: Operator admin is an operator role",
        ),
        (
            {"username": "x3", "role": "customer_admin", "customer": str(b.customer.pk)},
            "customer",
            "Customer: Select a valid choice.",
        ),
        ({"username": "x4", "role": "root"}, "role", "Role: Select a valid choice."),
        (
            {"username": "x5", "email": "nope", "role": "operator_support"},
            "email",
            "Email: Enter a valid email address.",
        ),
        ({"username": "bad name!", "role": "operator_support"}, "username", "Username: username"),
    ]
    for data, field, error in cases:
        response = client.post("/settings/users/", data)
        assert response.status_code == 400, data
        assert f'data-testid="error-{field}"><li>{error}' in body_of(response).replace(
            "&#x27;", "'"
        ), data
    with system_context():
        assert (
            not get_user_model()
            .objects.filter(username__in=["x1", "x2", "x3", "x4", "x5", "bad name!"])
            .exists()
        )


def test_customer_admin_invites_into_its_customer_and_never_above_it(
    client: Client, a: Tenant
) -> None:
    other, _ = sibling(a)
    sign_in(client, a.customer_admin)
    response = client.post(
        "/settings/users/",
        {"username": "teammate", "role": "customer_admin", "customer": str(other.pk)},
    )
    assert response.status_code == 302  # the customer field is not its to choose: ignored
    with system_context():
        assert Membership.objects.get(user__username="teammate").customer_id == a.customer.pk
    response = client.post("/settings/users/", {"username": "boss", "role": "operator_admin"})
    assert response.status_code == 400 and "Role: Select a valid choice." in body_of(response)


# --- change role, deactivate, new link ---------------------------------------------------------


def test_operator_admin_changes_a_role(client: Client, a: Tenant) -> None:
    target = member_id(a.customer_viewer)
    sign_in(client, a.operator_admin)
    page = body_of(client.get(f"/settings/users/{target}/"))
    assert 'value="customer_viewer" selected' in page
    response = client.post(
        f"/settings/users/{target}/", {"role": "operator_support", "customer": ""}
    )
    assert (response.status_code, response["Location"]) == (302, "/settings/users/")
    assert "alpha-customer-viewer is now Operator support." in body_of(
        client.get("/settings/users/")
    )
    principal = a.principal(a.customer_viewer)
    assert (principal.role, principal.customer_id) == (Role.OPERATOR_SUPPORT, None)
    response = client.post(f"/settings/users/{target}/", {"role": "customer_admin", "customer": ""})
    assert response.status_code == 400
    assert (
        'data-testid="error-customer"><li>Customer: Customer admin is a customer role'
        in body_of(response)
    )


def test_customer_admin_changes_roles_in_its_customer_only(
    client: Client, a: Tenant, b: Tenant
) -> None:
    _, other_viewer = sibling(a)
    sign_in(client, a.customer_admin)
    target = member_id(a.customer_viewer)
    response = client.post(f"/settings/users/{target}/", {"role": "customer_admin"})
    assert response.status_code == 302
    assert a.principal(a.customer_viewer).role == Role.CUSTOMER_ADMIN
    for user in (a.operator_admin, a.operator_support, other_viewer, b.customer_viewer):
        mid = member_id(user)
        assert client.get(f"/settings/users/{mid}/").status_code == 404
        assert (
            client.post(f"/settings/users/{mid}/", {"role": "customer_viewer"}).status_code == 404
        )
        assert client.post(f"/settings/users/{mid}/active/", {"active": "0"}).status_code == 404
        assert client.post(f"/settings/users/{mid}/link/").status_code == 404
        assert fresh(user).is_active and fresh(user).has_usable_password()
    assert a.principal(a.operator_support).role == Role.OPERATOR_SUPPORT


def test_admins_cannot_change_or_deactivate_themselves(client: Client, a: Tenant) -> None:
    for user in (a.operator_admin, a.customer_admin):
        client = sign_in(Client(), user)
        own = member_id(user)
        assert "You cannot change your own role." in body_of(client.get(f"/settings/users/{own}/"))
        response = client.post(
            f"/settings/users/{own}/", {"role": "customer_viewer", "customer": str(a.customer.pk)}
        )
        assert response.status_code == 400 and "you cannot change the role of yourself" in body_of(
            response
        )
        response = client.post(f"/settings/users/{own}/active/", {"active": "0"})
        assert response.status_code == 302
        assert "Not changed: you cannot deactivate yourself." in body_of(
            client.get("/settings/users/")
        )
        assert fresh(user).is_active


def test_deactivate_and_reactivate(client: Client, a: Tenant, b: Tenant) -> None:
    token, _ = services.do_create_api_token(a.principal(a.customer_admin), name="ci", scope="read")
    target = member_id(a.customer_admin)
    their_session = sign_in(Client(), a.customer_admin)
    sign_in(client, a.operator_admin)
    response = client.post(f"/settings/users/{target}/active/", {"active": "0"})
    assert (response.status_code, response["Location"]) == (302, "/settings/users/")
    body = body_of(client.get("/settings/users/"))
    assert "alpha-customer-admin deactivated" in body and "deactivated</span>" in body
    assert not Client().login(username="alpha-customer-admin", password=TEST_PASSWORD)
    assert their_session.get("/settings/users/").status_code == 302  # signed out
    with tenant_context(a.operator.pk):
        assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert client.post(f"/settings/users/{target}/active/", {"active": "yes"}).status_code == 302
    assert "active: must be 0" in body_of(client.get("/settings/users/"))
    assert client.post(f"/settings/users/{target}/active/", {"active": "1"}).status_code == 302
    assert Client().login(username="alpha-customer-admin", password=TEST_PASSWORD)
    # Another operator's member: 404, untouched.
    assert (
        client.post(
            f"/settings/users/{member_id(b.customer_admin)}/active/", {"active": "0"}
        ).status_code
        == 404
    )
    assert fresh(b.customer_admin).is_active


def test_new_set_password_link_replaces_the_password(client: Client, a: Tenant) -> None:
    target = member_id(a.customer_viewer)
    their_session = sign_in(Client(), a.customer_viewer)
    sign_in(client, a.customer_admin)
    response = client.post(f"/settings/users/{target}/link/")
    assert response.status_code == 302
    body = body_of(client.get("/settings/users/"))
    assert "New set-password link for alpha-customer-viewer" in body
    assert secret_of(body).startswith("http://testserver/password/set/")
    assert not Client().login(username="alpha-customer-viewer", password=TEST_PASSWORD)
    assert their_session.get("/").status_code == 302  # their session ended with the password


@pytest.mark.parametrize("who", ["operator_support", "customer_viewer"])
def test_non_admins_cannot_write_members_or_tokens(client: Client, a: Tenant, who: str) -> None:
    token, _ = services.do_create_api_token(a.principal(a.operator_admin), name="t", scope="read")
    target = member_id(a.customer_viewer if who != "customer_viewer" else a.customer_admin)
    sign_in(client, getattr(a, who))
    writes = [
        (
            "/settings/users/",
            {"username": "nope", "role": "customer_viewer", "customer": str(a.customer.pk)},
        ),
        (f"/settings/users/{target}/", {"role": "customer_admin", "customer": str(a.customer.pk)}),
        (f"/settings/users/{target}/active/", {"active": "0"}),
        (f"/settings/users/{target}/link/", {}),
        ("/settings/api-tokens/", {"name": "x", "scope": "read"}),
        (f"/settings/api-tokens/{token.pk}/revoke/", {}),
    ]
    for url, data in writes:
        assert client.post(url, data).status_code == 404, url
    with tenant_context(a.operator.pk):
        assert ApiToken.objects.get(pk=token.pk).revoked_at is None
        assert not ApiToken.objects.filter(name="x").exists()
    with system_context():
        assert not get_user_model().objects.filter(username="nope").exists()


def test_member_writes_need_the_csrf_token(a: Tenant) -> None:
    client = sign_in(Client(enforce_csrf_checks=True), a.operator_admin)
    target = member_id(a.customer_viewer)
    for url in (
        "/settings/users/",
        f"/settings/users/{target}/",
        f"/settings/users/{target}/active/",
        f"/settings/users/{target}/link/",
        "/settings/api-tokens/",
    ):
        assert client.post(url, {"active": "0"}).status_code == 403, url
    assert fresh(a.customer_viewer).is_active


# --- API tokens --------------------------------------------------------------------------------


def test_operator_admin_sees_the_operators_tokens_customer_admin_its_customers(
    client: Client, a: Tenant, b: Tenant
) -> None:
    other, _ = sibling(a)
    services.do_create_api_token(a.principal(a.operator_admin), name="fleet-wide", scope="read")
    services.do_create_api_token(
        a.principal(a.operator_admin), name="for-sibling", scope="read", customer_id=other.pk
    )
    services.do_create_api_token(a.principal(a.customer_admin), name="team-ci", scope="read_write")
    services.do_create_api_token(b.principal(b.operator_admin), name="bravo-token", scope="read")
    body = body_of(sign_in(client, a.operator_admin).get("/settings/api-tokens/"))
    assert (
        "<td>fleet-wide</td>" in body
        and "<td>for-sibling</td>" in body
        and "<td>team-ci</td>" in body
    )
    assert "bravo" not in body.lower()
    client.logout()
    body = body_of(sign_in(client, a.customer_admin).get("/settings/api-tokens/"))
    assert "<td>team-ci</td>" in body
    for hidden in ("fleet-wide", "for-sibling", "bravo"):
        assert hidden not in body
    assert 'name="customer"' not in body  # its tokens are its customer's: nothing to choose


def test_create_api_token_shows_it_once_and_it_authenticates(
    client: Client, a: Tenant, b: Tenant
) -> None:
    sign_in(client, a.operator_admin)
    response = client.post(
        "/settings/api-tokens/", {"name": "grafana", "scope": "read", "customer": ""}
    )
    assert (response.status_code, response["Location"]) == (302, "/settings/api-tokens/")
    page = client.get("/settings/api-tokens/")
    assert page["Cache-Control"] == "no-store"
    plaintext = secret_of(body_of(page))
    principal = services.authenticate_api_token(plaintext)
    assert (principal.operator_id, principal.role, principal.can_write) == (
        a.operator.pk,
        Role.OPERATOR_ADMIN,
        False,
    )
    assert plaintext not in body_of(client.get("/settings/api-tokens/"))
    # Used once: "last used" now shows a time instead of "never".
    row = (
        body_of(client.get("/settings/api-tokens/")).split("<td>grafana</td>")[1].split("</tr>")[0]
    )
    assert "never" not in row
    # For one customer: acts as that customer's admin.
    client.post(
        "/settings/api-tokens/",
        {"name": "team", "scope": "read_write", "customer": str(a.customer.pk)},
    )
    principal = services.authenticate_api_token(
        secret_of(body_of(client.get("/settings/api-tokens/")))
    )
    assert (principal.customer_id, principal.role, principal.can_write) == (
        a.customer.pk,
        Role.CUSTOMER_ADMIN,
        True,
    )
    # Another operator's customer is not a choice.
    response = client.post(
        "/settings/api-tokens/", {"name": "x", "scope": "read", "customer": str(b.customer.pk)}
    )
    assert response.status_code == 400 and "Customer: Select a valid choice." in body_of(response)


def test_customer_admin_creates_tokens_for_its_customer(client: Client, a: Tenant) -> None:
    other, _ = sibling(a)
    sign_in(client, a.customer_admin)
    tomorrow = (timezone.now() + timedelta(days=2)).date().isoformat()
    response = client.post(
        "/settings/api-tokens/",
        {"name": "ci", "scope": "read_write", "customer": str(other.pk), "expires_on": tomorrow},
    )
    assert response.status_code == 302
    principal = services.authenticate_api_token(
        secret_of(body_of(client.get("/settings/api-tokens/")))
    )
    assert (principal.customer_id, principal.role) == (a.customer.pk, Role.CUSTOMER_ADMIN)


def test_invalid_api_tokens_rerender_with_errors_naming_the_field(
    client: Client, a: Tenant
) -> None:
    sign_in(client, a.operator_admin)
    yesterday = (timezone.now() - timedelta(days=1)).date().isoformat()
    response = client.post(
        "/settings/api-tokens/", {"name": "", "scope": "superuser", "expires_on": yesterday}
    )
    assert response.status_code == 400
    body = body_of(response)
    assert 'data-testid="error-name"><li>Name: This field is required.' in body
    assert 'data-testid="error-scope"><li>Scope: Select a valid choice.' in body
    assert 'data-testid="error-expires_on"><li>Expires on: must be a day after today' in body


def test_revoke_api_tokens_in_scope_only(client: Client, a: Tenant, b: Tenant) -> None:
    fleet_token, fleet_plain = services.do_create_api_token(
        a.principal(a.operator_admin), name="fleet", scope="read"
    )
    team_token, team_plain = services.do_create_api_token(
        a.principal(a.operator_admin), name="team", scope="read", customer_id=a.customer.pk
    )
    bravo_token, _ = services.do_create_api_token(
        b.principal(b.operator_admin), name="bravo", scope="read"
    )
    sign_in(client, a.customer_admin)
    assert client.post(f"/settings/api-tokens/{fleet_token.pk}/revoke/").status_code == 404
    assert client.post(f"/settings/api-tokens/{bravo_token.pk}/revoke/").status_code == 404
    response = client.post(f"/settings/api-tokens/{team_token.pk}/revoke/")
    assert (response.status_code, response["Location"]) == (302, "/settings/api-tokens/")
    assert "API token “team” revoked." in body_of(client.get("/settings/api-tokens/"))
    with pytest.raises(services.TokenRejected):
        services.authenticate_api_token(team_plain)
    assert services.authenticate_api_token(fleet_plain).operator_id == a.operator.pk
    with tenant_context(b.operator.pk):
        assert ApiToken.objects.get(pk=bravo_token.pk).revoked_at is None
    assert client.get(f"/settings/api-tokens/{team_token.pk}/revoke/").status_code == 405


def test_bad_page_is_400_naming_it(client: Client, a: Tenant) -> None:
    sign_in(client, a.operator_admin)
    for url in (
        "/settings/users/?page=-1",
        "/settings/api-tokens/?page=2",
        "/settings/customers/?page=1.5",
        "/settings/rules/?page=9",
    ):
        response = client.get(url)
        assert response.status_code == 400, url
        assert "The query parameter <code>page</code> is not valid" in body_of(response)


# --- queries per page --------------------------------------------------------------------------


def _fill(t: Tenant, n: int) -> None:
    admin = t.principal(t.operator_admin)
    for i in range(n):
        services.do_invite_member(
            admin,
            username=f"{t.operator.slug}-member-{i}",
            role=Role.CUSTOMER_VIEWER,
            customer_id=t.customer.pk,
        )
        services.do_create_api_token(
            admin, name=f"{t.operator.slug} token {i}", scope="read", customer_id=t.customer.pk
        )


# Past BASE_QUERIES: the customers for the form's choice (operator admins only), the count,
# the page (user, customer, creator joined).
PAGE_QUERIES = {"/settings/users/": 3, "/settings/api-tokens/": 3}


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("who", ["operator_admin", "customer_admin"])
@pytest.mark.parametrize("url", list(PAGE_QUERIES))
def test_query_counts_do_not_grow_with_rows(
    client: Client,
    a: Tenant,
    b: Tenant,
    django_assert_num_queries: Callable[..., Any],
    url: str,
    who: str,
    rows: int,
) -> None:
    _fill(a, rows)
    _fill(b, 2)
    sign_in(client, getattr(a, who))
    expected = BASE_QUERIES + PAGE_QUERIES[url] - (1 if who == "customer_admin" else 0)
    with django_assert_num_queries(expected):
        response = client.get(url)
    assert response.status_code == 200
    assert "bravo" not in body_of(response).lower()


def test_showing_a_secret_costs_the_session_write(
    client: Client, a: Tenant, django_assert_num_queries: Callable[..., Any]
) -> None:
    sign_in(client, a.operator_admin)
    client.post("/settings/api-tokens/", {"name": "t", "scope": "read", "customer": ""})
    # The secret leaves the session: savepoint, UPDATE of the session row, release.
    with django_assert_num_queries(BASE_QUERIES + PAGE_QUERIES["/settings/api-tokens/"] + 3):
        response = client.get("/settings/api-tokens/")
    assert 'data-testid="secret"' in body_of(response)
