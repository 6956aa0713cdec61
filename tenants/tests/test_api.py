"""Every tenancy endpoint: what each role may do, and another tenant always refused."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Protocol

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.context import system_context
from tenants.models import ApiToken
from tenants.testing import Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db


a, b = tenant_fixtures("opa", "opb")


def session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


class JsonResponse(Protocol):
    def json(self) -> Any: ...


def ids(response: JsonResponse) -> set[int]:
    data = response.json()
    return {row["id"] for row in data["results"]}


# --- authentication ---------------------------------------------------------------------------


def test_missing_unknown_expired_revoked_tokens_get_401_with_reason(a: Tenant) -> None:
    response = APIClient().get("/api/v1/customers/")
    assert response.status_code == 401
    response = bearer("prf_nope").get("/api/v1/customers/")
    assert response.status_code == 401
    assert response.json()["error"] == {
        "status": 401,
        "code": "authentication_failed",
        "message": "Invalid API token.",
    }
    response = APIClient().get("/api/v1/customers/", HTTP_AUTHORIZATION="Bearer two parts")
    assert response.status_code == 401
    assert "Malformed Authorization header" in response.json()["error"]["message"]

    plaintext = a.api_token(a.operator_admin)
    assert bearer(plaintext).get("/api/v1/customers/").status_code == 200
    with system_context():
        ApiToken.objects.filter(prefix=plaintext[:12]).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    response = bearer(plaintext).get("/api/v1/customers/")
    assert (response.status_code, response.json()["error"]["message"]) == (
        401,
        "This API token has expired.",
    )
    plaintext = a.api_token(a.operator_admin)
    token_id = services.authenticate_api_token(plaintext).api_token_id
    assert (
        session(a.operator_admin).post(f"/api/v1/api-tokens/{token_id}/revoke/").status_code == 200
    )
    response = bearer(plaintext).get("/api/v1/customers/")
    assert (response.status_code, response.json()["error"]["message"]) == (
        401,
        "This API token has been revoked.",
    )


# --- customers --------------------------------------------------------------------------------


def test_customers_scoped_by_tenant_and_role(a: Tenant, b: Tenant) -> None:
    second = services.do_create_customer(a.operator.pk, name="Second", slug="second")
    for client in (session(a.operator_admin), bearer(a.api_token(a.operator_support))):
        response = client.get("/api/v1/customers/")
        assert response.status_code == 200
        assert ids(response) == {a.customer.pk, second.pk}  # B's absent
        assert client.get(f"/api/v1/customers/{b.customer.pk}/").status_code == 404
    for client in (session(a.customer_viewer), bearer(a.api_token(a.customer_admin))):
        assert ids(client.get("/api/v1/customers/")) == {a.customer.pk}
        assert client.get(f"/api/v1/customers/{second.pk}/").status_code == 404
        assert client.get(f"/api/v1/customers/{a.customer.pk}/").json()["slug"] == "opa-customer"


def test_customer_create_operator_roles_only(a: Tenant, b: Tenant) -> None:
    admin = session(a.operator_admin)
    response = admin.post("/api/v1/customers/", {"name": "New", "slug": "new"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["slug"] == "new"
    assert response.json()["id"] in ids(admin.get("/api/v1/customers/"))
    assert response.json()["id"] not in ids(session(b.operator_admin).get("/api/v1/customers/"))
    response = admin.post("/api/v1/customers/", {"name": "Dup", "slug": "new"}, format="json")
    assert response.status_code == 400
    assert "already has a customer with slug 'new'" in response.json()["error"]["message"]
    response = admin.post("/api/v1/customers/", {"name": "Bad", "slug": "a b"}, format="json")
    assert response.status_code == 400
    # The same slug at another operator is fine: slugs are per operator.
    response = session(b.operator_admin).post(
        "/api/v1/customers/", {"name": "New", "slug": "new"}, format="json"
    )
    assert response.status_code == 201
    for client in (session(a.customer_admin), bearer(a.api_token(a.customer_admin))):
        response = client.post("/api/v1/customers/", {"name": "X", "slug": "x"}, format="json")
        assert response.status_code == 403
    read_only = bearer(a.api_token(a.operator_admin, scope="read"))
    assert read_only.get("/api/v1/customers/").status_code == 200
    response = read_only.post("/api/v1/customers/", {"name": "X", "slug": "x"}, format="json")
    assert response.status_code == 403


# --- API tokens -------------------------------------------------------------------------------


def test_api_token_plaintext_shown_once_and_listing_shows_prefix(a: Tenant, b: Tenant) -> None:
    admin = session(a.operator_admin)
    response = admin.post(
        "/api/v1/api-tokens/", {"name": "ticketing", "scope": "read"}, format="json"
    )
    assert response.status_code == 201, response.content
    created = response.json()
    plaintext = created["token"]
    assert plaintext.startswith(created["prefix"]) and len(plaintext) > 40
    listed = admin.get("/api/v1/api-tokens/").json()["results"]
    row = next(r for r in listed if r["id"] == created["id"])
    assert row["prefix"] == created["prefix"] and "token" not in row
    assert plaintext not in admin.get(f"/api/v1/api-tokens/{created['id']}/").content.decode()
    # The new token works, is read-only, and is invisible to another tenant.
    assert bearer(plaintext).get("/api/v1/customers/").status_code == 200
    assert (
        bearer(plaintext).post("/api/v1/api-tokens/", {"name": "x"}, format="json").status_code
        == 403
    )
    other = session(b.operator_admin)
    assert created["id"] not in ids(other.get("/api/v1/api-tokens/"))
    assert other.get(f"/api/v1/api-tokens/{created['id']}/").status_code == 404
    assert other.post(f"/api/v1/api-tokens/{created['id']}/revoke/").status_code == 404
    assert bearer(plaintext).get("/api/v1/customers/").status_code == 200


def test_api_tokens_customer_roles_see_own_customer_only(a: Tenant, b: Tenant) -> None:
    operator_token = session(a.operator_admin).post(
        "/api/v1/api-tokens/", {"name": "fleet", "scope": "read"}, format="json"
    )
    customer_admin = session(a.customer_admin)
    response = customer_admin.post(
        "/api/v1/api-tokens/", {"name": "mine", "scope": "read_write"}, format="json"
    )
    assert response.status_code == 201
    mine = response.json()
    assert mine["customer"] == a.customer.pk and mine["role"] == "customer_admin"
    assert ids(customer_admin.get("/api/v1/api-tokens/")) == {mine["id"]}
    op_id = operator_token.json()["id"]
    assert customer_admin.get(f"/api/v1/api-tokens/{op_id}/").status_code == 404
    assert customer_admin.post(f"/api/v1/api-tokens/{op_id}/revoke/").status_code == 404
    # Customer admins cannot mint tokens for another customer, here or at another operator.
    response = customer_admin.post(
        "/api/v1/api-tokens/",
        {"name": "x", "scope": "read", "customer": b.customer.pk},
        format="json",
    )
    assert response.status_code == 403
    # Viewers are read-only: no token minting.
    viewer = session(a.customer_viewer)
    assert viewer.get("/api/v1/api-tokens/").status_code == 200
    assert viewer.post("/api/v1/api-tokens/", {"name": "v"}, format="json").status_code == 403
    # An operator cannot mint a token for another operator's customer.
    response = session(a.operator_admin).post(
        "/api/v1/api-tokens/",
        {"name": "x", "scope": "read", "customer": b.customer.pk},
        format="json",
    )
    assert response.status_code == 400
    assert f"customer {b.customer.pk} does not exist" in response.json()["error"]["message"]


def test_revoke_api_token_via_api(a: Tenant) -> None:
    plaintext = a.api_token(a.customer_admin)
    token_id = services.authenticate_api_token(plaintext).api_token_id
    assert (
        session(a.customer_viewer).post(f"/api/v1/api-tokens/{token_id}/revoke/").status_code == 403
    )
    response = bearer(plaintext).post(f"/api/v1/api-tokens/{token_id}/revoke/")
    assert response.status_code == 200  # a customer admin token may revoke its own customer's
    assert response.json()["revoked_at"] is not None
    assert bearer(plaintext).get("/api/v1/customers/").status_code == 401


# --- agent tokens -----------------------------------------------------------------------------


def test_agent_tokens_operator_admin_only(a: Tenant, b: Tenant) -> None:
    admin = session(a.operator_admin)
    response = admin.post("/api/v1/agent-tokens/", {"name": "rack-7"}, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert services.resolve_agent_token(created["token"]) == a.operator.pk
    row = admin.get(f"/api/v1/agent-tokens/{created['id']}/").json()
    assert row["prefix"] == created["prefix"] and "token" not in row
    for refused in (
        session(a.operator_support),
        session(a.customer_admin),
        bearer(a.api_token(a.customer_admin)),
    ):
        assert refused.get("/api/v1/agent-tokens/").status_code == 403
        assert (
            refused.post("/api/v1/agent-tokens/", {"name": "x"}, format="json").status_code == 403
        )
    other = session(b.operator_admin)
    assert created["id"] not in ids(other.get("/api/v1/agent-tokens/"))
    assert other.get(f"/api/v1/agent-tokens/{created['id']}/").status_code == 404
    assert other.post(f"/api/v1/agent-tokens/{created['id']}/revoke/").status_code == 404
    read_only = bearer(a.api_token(a.operator_admin, scope="read"))
    assert ids(read_only.get("/api/v1/agent-tokens/")) == {created["id"]}
    assert read_only.post(f"/api/v1/agent-tokens/{created['id']}/revoke/").status_code == 403
    assert services.resolve_agent_token(created["token"]) == a.operator.pk
    response = admin.post(f"/api/v1/agent-tokens/{created['id']}/revoke/")
    assert response.status_code == 200 and response.json()["revoked_at"]
    assert services.resolve_agent_token(created["token"]) is None


# --- job mapping rules ------------------------------------------------------------------------


def test_job_mapping_rules_crud_operator_admin_only(a: Tenant, b: Tenant) -> None:
    admin = session(a.operator_admin)
    body = {"match_field": "slurm_account", "value": "ml-team", "customer": a.customer.pk}
    response = admin.post("/api/v1/job-mapping-rules/", body, format="json")
    assert response.status_code == 201, response.content
    rule = response.json()
    assert rule["priority"] == 100
    assert services.customer_for_job(a.operator, {"slurm_account": "ml-team"}) == a.customer
    response = admin.patch(
        f"/api/v1/job-mapping-rules/{rule['id']}/", {"value": "ml"}, format="json"
    )
    assert response.status_code == 200 and response.json()["value"] == "ml"
    assert response.json()["customer"] == a.customer.pk
    response = admin.post(
        "/api/v1/job-mapping-rules/",
        {"match_field": "k8s_namespace", "value": "x", "customer": b.customer.pk},
        format="json",
    )
    assert response.status_code == 400
    response = admin.post(
        "/api/v1/job-mapping-rules/",
        {"match_field": "hostname", "value": "x", "customer": a.customer.pk},
        format="json",
    )
    assert response.status_code == 400 and "match_field" in response.json()["error"]["fields"]
    for refused in (
        session(a.operator_support),
        session(a.customer_admin),
        bearer(a.api_token(a.customer_admin)),
    ):
        assert refused.get("/api/v1/job-mapping-rules/").status_code == 403
        assert refused.post("/api/v1/job-mapping-rules/", body, format="json").status_code == 403
    read_only = bearer(a.api_token(a.operator_admin, scope="read"))
    assert ids(read_only.get("/api/v1/job-mapping-rules/")) == {rule["id"]}
    assert read_only.delete(f"/api/v1/job-mapping-rules/{rule['id']}/").status_code == 403
    other = session(b.operator_admin)
    assert rule["id"] not in ids(other.get("/api/v1/job-mapping-rules/"))
    assert other.get(f"/api/v1/job-mapping-rules/{rule['id']}/").status_code == 404
    assert other.delete(f"/api/v1/job-mapping-rules/{rule['id']}/").status_code == 404
    assert (
        other.patch(
            f"/api/v1/job-mapping-rules/{rule['id']}/", {"value": "y"}, format="json"
        ).status_code
        == 404
    )
    assert admin.delete(f"/api/v1/job-mapping-rules/{rule['id']}/").status_code == 204
    assert services.customer_for_job(a.operator, {"slurm_account": "ml"}) is None
