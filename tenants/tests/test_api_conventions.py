"""The conventions every API endpoint shares (docs/api.md): the error shape, cursor pages,
ETag / 304, token scopes, per-token rates, the schema and Swagger UI served by Proof."""

from __future__ import annotations

import importlib
import re
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.contrib.staticfiles import finders
from django.db import connection
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from tenants import services
from tenants.context import system_context
from tenants.models import ApiToken, Customer, TokenScope
from tenants.testing import Tenant, tenant_fixtures
from tenants.tests.test_api import bearer, session

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("cva", "cvb")

# A module name that starts with a digit: not importable with an import statement.
admin_scope_migration = importlib.import_module(
    "tenants.migrations.0005_token_admin_scope_and_rate_limit"
)


def make_customers(tenant: Tenant, count: int, start: int = 0) -> list[int]:
    return [
        services.do_create_customer(tenant.operator.pk, name=f"C{i:03}", slug=f"c{i:03}").pk
        for i in range(start, start + count)
    ]


# --- the error shape ---------------------------------------------------------------------------


def test_every_error_is_one_shape_naming_status_code_and_message(a: Tenant) -> None:
    anonymous = APIClient().get("/api/v1/customers/")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"].startswith("Bearer")
    assert anonymous.json()["error"]["status"] == 401
    assert anonymous.json()["error"]["code"] == "not_authenticated"

    viewer = session(a.customer_viewer).get("/api/v1/agent-tokens/")
    assert viewer.json() == {
        "error": {
            "status": 403,
            "code": "permission_denied",
            "message": "Only operator admins may use this endpoint.",
        }
    }
    not_allowed = session(a.operator_admin).put("/api/v1/customers/", {}, format="json")
    assert (not_allowed.status_code, not_allowed.json()["error"]["code"]) == (
        405,
        "method_not_allowed",
    )
    bad = session(a.operator_admin).post("/api/v1/customers/", {"name": "X"}, format="json")
    assert bad.json() == {
        "error": {
            "status": 400,
            "code": "invalid",
            "message": "Invalid slug: This field is required.",
            "fields": {"slug": ["This field is required."]},
        }
    }


def test_404_on_another_operators_id_reads_exactly_like_a_missing_id(a: Tenant, b: Tenant) -> None:
    theirs = b.customer.pk
    with system_context():
        missing = max(Customer.objects.values_list("pk", flat=True)) + 1000
    client = bearer(a.api_token(a.operator_admin))
    foreign = client.get(f"/api/v1/customers/{theirs}/")
    absent = client.get(f"/api/v1/customers/{missing}/")
    assert foreign.status_code == absent.status_code == 404
    assert foreign.content == absent.content
    assert foreign.json() == {
        "error": {"status": 404, "code": "not_found", "message": "Not found."}
    }
    # And a customer of the same operator asking for a sibling customer's row.
    sibling = services.do_create_customer(a.operator.pk, name="Sibling", slug="sibling")
    refused = session(a.customer_admin).get(f"/api/v1/customers/{sibling.pk}/")
    assert refused.content == absent.content


def test_a_path_no_endpoint_has_is_a_404_in_the_error_shape(a: Tenant) -> None:
    client = session(a.operator_admin)
    for path in ("/api/v1/nope/", "/api/v1/customers/1/nope/", "/api/v1/customers/x/y/z"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json() == {
            "error": {"status": 404, "code": "not_found", "message": "Not found."}
        }
    # The trailing slash is still added for a path that has an endpoint with it.
    response = client.get("/api/v1/customers?page_size=2")
    assert (response.status_code, response["Location"]) == (301, "/api/v1/customers/?page_size=2")


# --- cursor pages ------------------------------------------------------------------------------


def test_lists_page_by_cursor_in_a_stable_order_and_name_a_bad_page_size(a: Tenant) -> None:
    make_customers(a, 5)
    client = session(a.operator_admin)
    page = client.get("/api/v1/customers/?page_size=2").json()
    assert set(page) == {"next", "previous", "results"} and len(page["results"]) == 2
    names = [row["name"] for row in page["results"]]
    while page["next"]:
        # A row added between pages neither shifts nor repeats a page.
        page = client.get(page["next"]).json()
        names += [row["name"] for row in page["results"]]
    with system_context():
        expected = sorted(Customer.objects.for_tenant(a.operator).values_list("name", flat=True))
    assert names == expected
    for bad in ("0", "501", "ten", "-1"):
        response = client.get(f"/api/v1/customers/?page_size={bad}")
        assert response.status_code == 400, bad
        assert list(response.json()["error"]["fields"]) == ["page_size"]
    response = client.get("/api/v1/customers/?cursor=not-a-cursor")
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["cursor"]
    assert client.get("/api/v1/customers/?page_size=500").status_code == 200


# --- ETag / If-None-Match ----------------------------------------------------------------------


def test_get_carries_a_weak_etag_and_answers_304_while_it_is_current(a: Tenant) -> None:
    client = bearer(a.api_token(a.operator_admin))
    for path in ("/api/v1/customers/", f"/api/v1/customers/{a.customer.pk}/"):
        first = client.get(path)
        etag = first["ETag"]
        assert re.fullmatch(r'W/"[0-9a-f]{32}"', etag), etag
        assert "Authorization" in first["Vary"]
        again = client.get(path, HTTP_IF_NONE_MATCH=etag)
        assert (again.status_code, again.content, again["ETag"]) == (304, b"", etag)
        # The strong form of the same tag and a list of tags match too (weak comparison).
        listed = client.get(path, HTTP_IF_NONE_MATCH=f'"x", {etag.removeprefix("W/")}')
        assert listed.status_code == 304
        assert client.get(path, HTTP_IF_NONE_MATCH='W/"stale"').status_code == 200
    before = client.get("/api/v1/customers/")["ETag"]
    services.do_create_customer(a.operator.pk, name="Zed", slug="zed")
    changed = client.get("/api/v1/customers/", HTTP_IF_NONE_MATCH=before)
    assert changed.status_code == 200 and changed["ETag"] != before


# --- scopes ------------------------------------------------------------------------------------


def test_scopes_read_write_admin(a: Tenant) -> None:
    read = bearer(a.api_token(a.operator_admin, scope="read"))
    write = bearer(a.api_token(a.operator_admin, scope="write"))
    admin = bearer(a.api_token(a.operator_admin, scope="admin"))
    body = {"name": "N", "slug": "n"}
    assert read.post("/api/v1/customers/", body, format="json").status_code == 403
    assert write.post("/api/v1/customers/", body, format="json").status_code == 201
    # Admin endpoints: readable with the role, changed only with the admin scope.
    for client, says in ((read, "may only read"), (write, "scope admin")):
        assert client.get("/api/v1/agent-tokens/").status_code == 200
        refused = client.post("/api/v1/agent-tokens/", {"name": "x"}, format="json")
        assert refused.status_code == 403
        assert says in refused.json()["error"]["message"]
        token = client.post("/api/v1/api-tokens/", {"name": "t"}, format="json")
        assert token.status_code == 403
    assert admin.post("/api/v1/agent-tokens/", {"name": "x"}, format="json").status_code == 201
    made = admin.post("/api/v1/api-tokens/", {"name": "w", "scope": "write"}, format="json")
    assert made.status_code == 201 and made.json()["scope"] == TokenScope.READ_WRITE
    # Only an admin acting with admin rights gives the admin scope.
    support = session(a.operator_support)
    refused = support.post("/api/v1/api-tokens/", {"name": "s", "scope": "admin"}, format="json")
    assert refused.status_code == 403
    bad = admin.post("/api/v1/api-tokens/", {"name": "s", "scope": "root"}, format="json")
    assert list(bad.json()["error"]["fields"]) == ["scope"]


def test_migration_keeps_existing_admin_read_write_tokens_working(a: Tenant) -> None:
    admin_token, _ = services.do_create_api_token(
        a.principal(a.operator_admin), name="old", scope="read_write"
    )
    support_token, _ = services.do_create_api_token(
        a.principal(a.operator_support), name="old", scope="read_write"
    )
    with system_context():
        # The real app registry stands in for the migration state's (same model).
        admin_scope_migration.keep_admin_tokens_working(
            apps, SimpleNamespace(connection=connection)
        )
        scopes = dict(
            ApiToken.objects.filter(pk__in=[admin_token.pk, support_token.pk]).values_list(
                "pk", "scope"
            )
        )
    assert scopes == {admin_token.pk: "admin", support_token.pk: "read_write"}


# --- per-token rates ---------------------------------------------------------------------------


def test_a_token_over_its_own_rate_gets_429_with_retry_after(a: Tenant) -> None:
    admin = session(a.operator_admin)
    made = admin.post(
        "/api/v1/api-tokens/", {"name": "slow", "scope": "read", "rate_limit": "3/min"}
    ).json()
    assert made["rate_limit"] == "3/min"
    slow = bearer(made["token"])
    other = bearer(a.api_token(a.operator_admin, scope="read"))
    assert [slow.get("/api/v1/customers/").status_code for _ in range(3)] == [200] * 3
    over = slow.get("/api/v1/customers/")
    assert over.status_code == 429
    assert 0 < int(over["Retry-After"]) <= 60
    assert over.json()["error"]["code"] == "throttled"
    assert other.get("/api/v1/customers/").status_code == 200
    bad = admin.post("/api/v1/api-tokens/", {"name": "x", "rate_limit": "lots"}, format="json")
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["rate_limit"]


# --- the schema and Swagger UI -----------------------------------------------------------------


def test_schema_and_docs_are_served_anonymously_from_proofs_own_static_files() -> None:
    schema = APIClient().get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    document: dict[str, Any] = schema.json()
    assert document["openapi"] == "3.1.0"
    assert "Error" in document["components"]["schemas"]
    assert document["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    listing = document["paths"]["/api/v1/customers/"]["get"]["responses"]
    assert {"200", "304", "400", "401", "403", "404", "429"} <= set(listing)

    docs = APIClient().get("/api/v1/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and not [url for url in assets if url.startswith(("http:", "https:", "//"))]
    static = [url for url in assets if url.startswith("/static/")]
    assert any(url.endswith("swagger-ui-bundle.js") for url in static), static
    for url in static:
        assert finders.find(url.removeprefix("/static/")), url


# --- the schema of this part's endpoints --------------------------------------------------------

# The operations this module's endpoints own (issue 13 part 1): tenancy, channels, share links.
OWN_PREFIXES = (
    "/api/v1/customers/",
    "/api/v1/api-tokens/",
    "/api/v1/agent-tokens/",
    "/api/v1/job-mapping-rules/",
    "/api/v1/notification-channels/",
    "/api/v1/share-links/",
)
OWN_SOURCES = ("tenants/api/", "notify/api/", "investigations/api/share_links.py")


def _generated() -> tuple[dict[str, Any], list[str]]:
    GENERATOR_STATS.reset()
    # drf-spectacular ships no type hints.
    generator = SchemaGenerator()  # type: ignore[no-untyped-call]
    document: dict[str, Any] = generator.get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
    problems = [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    GENERATOR_STATS.reset()
    return document, problems


def test_own_endpoints_generate_without_warnings_and_each_operation_has_an_example() -> None:
    document, problems = _generated()
    ours = [p for p in problems if any(source in p for source in OWN_SOURCES)]
    assert ours == []
    operations = [
        (path, method, operation)
        for path, item in document["paths"].items()
        if path.startswith(OWN_PREFIXES)
        for method, operation in item.items()
    ]
    assert len(operations) >= 25
    without = []
    for path, method, operation in operations:
        bodies = [
            *operation.get("requestBody", {}).get("content", {}).values(),
            *(
                media
                for code, response in operation["responses"].items()
                if code.startswith("2")
                for media in response.get("content", {}).values()
            ),
        ]
        if not any(body.get("examples") for body in bodies) and method != "delete":
            without.append(f"{method} {path}")
        assert operation.get("summary"), f"{method} {path}"
    assert without == []
