"""Console sign-in, sign-out, password change and the signed-in home page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tenants import services
from tenants.testing import TEST_PASSWORD, Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db


a, b = tenant_fixtures("alpha", "bravo")


def test_login_page_is_proofs_own(client: Client) -> None:
    response = client.get("/login/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Sign in to Proof" in body
    assert "proof/proof.css" in body
    assert "Django administration" not in body
    assert 'name="csrfmiddlewaretoken"' in body


def test_home_requires_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_wrong_password_is_refused(client: Client, a: Tenant) -> None:
    response = client.post("/login/", {"username": "alpha-op-admin", "password": "wrong"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()
    assert client.get("/").status_code == 302


def test_operator_admin_signs_in_and_sees_own_tenant_only(
    client: Client, a: Tenant, b: Tenant
) -> None:
    second = services.do_create_customer(a.operator.pk, name="Second Team", slug="second")
    response = client.post("/login/", {"username": "alpha-op-admin", "password": TEST_PASSWORD})
    assert (response.status_code, response["Location"]) == (302, "/")
    body = client.get("/").content.decode()
    assert 'data-testid="operator">Operator alpha<' in body
    assert 'data-testid="role">Operator admin<' in body
    assert "Customer alpha-customer" in body and second.name in body
    assert "bravo" not in body.lower()


def test_customer_viewer_sees_own_customer_only(client: Client, a: Tenant, b: Tenant) -> None:
    services.do_create_customer(a.operator.pk, name="Second Team", slug="second")
    assert client.login(username="alpha-customer-viewer", password=TEST_PASSWORD)
    body = client.get("/").content.decode()
    assert 'data-testid="operator">Operator alpha<' in body
    assert 'data-testid="customer">Customer alpha-customer<' in body
    assert 'data-testid="role">Customer viewer<' in body
    assert "Second Team" not in body  # a sibling customer of the same operator
    assert "bravo" not in body.lower()


def test_logout_and_password_change(client: Client, a: Tenant) -> None:
    assert client.login(username="alpha-operator-support", password=TEST_PASSWORD)
    page = client.get("/password/")
    assert page.status_code == 200 and "Change your password" in page.content.decode()
    response = client.post(
        "/password/",
        {
            "old_password": TEST_PASSWORD,
            "new_password1": "a-new-and-long-passphrase",
            "new_password2": "a-new-and-long-passphrase",
        },
    )
    assert (response.status_code, response["Location"]) == (302, "/password/done/")
    assert client.get("/").status_code == 200  # still signed in after the change
    response = client.post("/logout/")
    assert response.status_code == 302
    assert client.get("/").status_code == 302
    assert not client.login(username="alpha-operator-support", password=TEST_PASSWORD)
    assert client.login(username="alpha-operator-support", password="a-new-and-long-passphrase")


def test_user_without_membership_gets_a_clear_home(client: Client) -> None:
    get_user_model().objects.create_user(username="drifter", password=TEST_PASSWORD)
    assert client.login(username="drifter", password=TEST_PASSWORD)
    body = client.get("/").content.decode()
    assert "not a member of any operator or customer" in body
