"""The fleet's settings pages (/settings/, customers, job-mapping rules, agents, GPU list
prices): operator admins only; another operator's rows never listed and 404 by id; customer
admins, support and viewers 404; each write PRG with a message; query counts pinned."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from frontend.tests.settings_helpers import BASE_QUERIES, sign_in
from ingest import services as ingest_services
from investigations.models import GpuListPrice
from investigations.services import set_list_price
from tenants import services
from tenants.context import system_context, tenant_context
from tenants.models import AgentToken, Customer, JobMappingRule, Operator
from tenants.testing import Tenant, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("alpha", "bravo")

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"

OPERATOR_PAGES = [
    "/settings/customers/",
    "/settings/rules/",
    "/settings/agents/",
    "/settings/prices/",
]
ADMIN_PAGES = ["/settings/", "/settings/users/", "/settings/api-tokens/"]


def register_node(
    tenant: Tenant,
    hostname: str,
    *,
    gpus: int,
    version: str = "1.4.0",
    model: str = H100,
    token_id: int | None = None,
) -> None:
    """A node's agent registering its GPUs, through ingest's own registration."""
    ingest_services.register_agent(
        tenant.operator.pk,
        agent_id=f"agent-{hostname}",
        hostname=hostname,
        agent_version=version,
        gpus=[{"uuid": f"GPU-{hostname}-{i}", "index": i, "model": model} for i in range(gpus)],
        agent_token_id=token_id,
    )


def rule_of(tenant: Tenant, value: str, priority: int = 100) -> JobMappingRule:
    return services.do_create_mapping_rule(
        tenant.principal(tenant.operator_admin),
        match_field="slurm_account",
        value=value,
        customer_id=tenant.customer.pk,
        priority=priority,
    )


def body_of(response: Any) -> str:
    text: str = response.content.decode()
    return text


# --- who may open the pages ---------------------------------------------------------------------


def test_signed_out_users_are_sent_to_sign_in(client: Client) -> None:
    for url in OPERATOR_PAGES + ADMIN_PAGES:
        response = client.get(url)
        assert (response.status_code, response["Location"]) == (302, f"/login/?next={url}")


@pytest.mark.parametrize("who", ["operator_support", "customer_viewer"])
@pytest.mark.parametrize("url", OPERATOR_PAGES + ADMIN_PAGES)
def test_non_admins_get_404(client: Client, a: Tenant, who: str, url: str) -> None:
    sign_in(client, getattr(a, who))
    assert client.get(url).status_code == 404


@pytest.mark.parametrize("url", OPERATOR_PAGES)
def test_customer_admins_get_404_on_the_fleets_settings(
    client: Client, a: Tenant, url: str
) -> None:
    sign_in(client, a.customer_admin)
    assert client.get(url).status_code == 404


def test_index_links_the_pages_of_the_role(client: Client, a: Tenant) -> None:
    body = body_of(sign_in(client, a.operator_admin).get("/settings/"))
    for url in OPERATOR_PAGES + ADMIN_PAGES:
        assert f'href="{url}"' in body
    client.logout()
    body = body_of(sign_in(client, a.customer_admin).get("/settings/"))
    assert 'href="/settings/users/"' in body and 'href="/settings/api-tokens/"' in body
    for url in OPERATOR_PAGES:
        assert f'href="{url}"' not in body


def test_settings_nav_shows_for_admins_only(client: Client, a: Tenant) -> None:
    assert 'href="/settings/"' in body_of(sign_in(client, a.customer_admin).get("/"))
    client.logout()
    assert 'href="/settings/"' not in body_of(sign_in(client, a.customer_viewer).get("/"))


# Every write, as (URL, form data) once the tenant's objects exist.
def _writes(t: Tenant) -> list[tuple[str, dict[str, str]]]:
    rule = rule_of(t, "csrf-team")
    token, _ = services.do_create_agent_token(t.principal(t.operator_admin), name="rack")
    price = set_list_price(
        t.principal(t.operator_admin), gpu_model=A100, price_per_gpu_hour=Decimal(2)
    )
    return [
        ("/settings/customers/", {"name": "New", "slug": "new"}),
        (
            "/settings/rules/",
            {
                "match_field": "slurm_user",
                "value": "u",
                "customer": str(t.customer.pk),
                "priority": "5",
            },
        ),
        (
            f"/settings/rules/{rule.pk}/",
            {
                "match_field": "slurm_user",
                "value": "u2",
                "customer": str(t.customer.pk),
                "priority": "5",
            },
        ),
        (f"/settings/rules/{rule.pk}/delete/", {}),
        ("/settings/agents/", {"name": "rack 2"}),
        (f"/settings/agents/tokens/{token.pk}/revoke/", {}),
        ("/settings/prices/", {"gpu_model": H100, "price_per_gpu_hour": "3", "currency": "USD"}),
        (f"/settings/prices/{price.pk}/", {"price_per_gpu_hour": "4", "currency": "USD"}),
        (f"/settings/prices/{price.pk}/delete/", {}),
    ]


def _state(t: Tenant) -> tuple[Any, ...]:
    with tenant_context(t.operator.pk):
        return (
            sorted(Customer.objects.for_tenant(t.operator).values_list("slug", flat=True)),
            sorted(JobMappingRule.objects.for_tenant(t.operator).values_list("value", "priority")),
            sorted(AgentToken.objects.for_tenant(t.operator).values_list("name", "revoked_at")),
            sorted(
                GpuListPrice.objects.for_tenant(t.operator).values_list(
                    "gpu_model", "price_per_gpu_hour"
                )
            ),
        )


@pytest.mark.parametrize("who", ["customer_admin", "operator_support", "customer_viewer"])
def test_writes_refused_with_404_to_all_but_operator_admins(
    client: Client, a: Tenant, who: str
) -> None:
    writes = _writes(a)
    before = _state(a)
    sign_in(client, getattr(a, who))
    for url, data in writes:
        assert client.post(url, data).status_code == 404, url
    assert _state(a) == before


def test_writes_to_another_operators_objects_are_404(client: Client, a: Tenant, b: Tenant) -> None:
    writes = [w for w in _writes(b) if w[0].count("/") > 4]  # the ones naming one of b's ids
    before = _state(b)
    sign_in(client, a.operator_admin)
    for url, data in writes:
        assert client.post(url, data).status_code == 404, url
        if not url.endswith(("/delete/", "/revoke/")):
            assert client.get(url).status_code == 404, url
    assert _state(b) == before


def test_writes_need_the_csrf_token(a: Tenant) -> None:
    client = Client(enforce_csrf_checks=True)
    sign_in(client, a.operator_admin)
    writes = _writes(a)
    before = _state(a)
    for url, data in writes:
        assert client.post(url, data).status_code == 403, url
    assert _state(a) == before


@pytest.mark.parametrize(
    "url",
    [
        "/settings/rules/1/delete/",
        "/settings/agents/tokens/1/revoke/",
        "/settings/prices/1/delete/",
    ],
)
def test_action_urls_are_post_only(client: Client, a: Tenant, url: str) -> None:
    sign_in(client, a.operator_admin)
    assert client.get(url).status_code == 405


# --- customers ---------------------------------------------------------------------------------


def test_customers_list_with_counts_and_never_another_operators(
    client: Client, a: Tenant, b: Tenant
) -> None:
    rule_of(a, "team-a")
    rule_of(b, "team-b")
    body = body_of(sign_in(client, a.operator_admin).get("/settings/customers/"))
    assert "Customer alpha-customer" in body
    # Members: the customer admin and the viewer; one rule; no jobs yet.
    assert '<td class="num">2</td><td class="num">1</td><td class="num">0</td>' in body
    assert "bravo" not in body.lower()


def test_create_customer_redirects_with_a_message(client: Client, a: Tenant, b: Tenant) -> None:
    sign_in(client, a.operator_admin)
    response = client.post("/settings/customers/", {"name": "Vision Team", "slug": "vision"})
    assert (response.status_code, response["Location"]) == (302, "/settings/customers/")
    body = body_of(client.get("/settings/customers/"))
    assert "Customer “Vision Team” created." in body
    assert "<code>vision</code>" in body
    # b may use the same slug: slugs are unique per operator.
    b_client = sign_in(Client(), b.operator_admin)
    assert b_client.post("/settings/customers/", {"name": "V", "slug": "vision"}).status_code == 302


def _masks(t: Tenant) -> bool:
    with system_context():
        return bool(Operator.objects.get(pk=t.operator.pk).mask_node_names)


def test_masking_node_names_for_customers_is_the_operator_admins_and_this_operators_only(
    client: Client, a: Tenant, b: Tenant
) -> None:
    sign_in(client, a.operator_admin)
    response = client.post("/settings/customers/masking/", {"mask_node_names": "on"})
    assert (response.status_code, response["Location"]) == (302, "/settings/customers/")
    body = body_of(client.get("/settings/customers/"))
    assert "now show aliases" in body
    assert 'name="mask_node_names" checked data-testid="mask-node-names"' in body
    assert (_masks(a), _masks(b)) == (True, False)
    client.post("/settings/customers/masking/", {})  # unchecked: names as stored again
    assert not _masks(a)
    for who in ("customer_admin", "operator_support"):
        other = sign_in(Client(), getattr(a, who))
        assert (
            other.post("/settings/customers/masking/", {"mask_node_names": "on"}).status_code == 404
        )
    assert not _masks(a)
    assert client.get("/settings/customers/masking/").status_code == 405


def test_invalid_customer_rerenders_with_errors_naming_the_field(client: Client, a: Tenant) -> None:
    sign_in(client, a.operator_admin)
    response = client.post("/settings/customers/", {"name": "", "slug": "not a slug"})
    assert response.status_code == 400
    body = body_of(response)
    assert 'data-testid="error-name"><li>Name: This field is required.' in body
    assert 'data-testid="error-slug"><li>Slug: Enter a valid “slug”' in body
    # The service's refusal (a slug already used) lands on the slug field too.
    response = client.post("/settings/customers/", {"name": "Again", "slug": "alpha-customer"})
    assert response.status_code == 400
    assert (
        "Slug: this operator already has a customer with slug &#x27;alpha-customer&#x27;"
        in body_of(response)
    )


# --- job-mapping rules -------------------------------------------------------------------------


def test_rules_listed_in_the_order_they_apply_never_another_operators(
    client: Client, a: Tenant, b: Tenant
) -> None:
    rule_of(a, "late", priority=200)
    rule_of(a, "early", priority=10)
    rule_of(b, "bravo-rule", priority=1)
    body = body_of(sign_in(client, a.operator_admin).get("/settings/rules/"))
    assert body.index("<code>early</code>") < body.index("<code>late</code>")
    assert "bravo" not in body.lower()


def test_create_rule_and_the_rule_attributes_new_jobs(client: Client, a: Tenant, b: Tenant) -> None:
    sign_in(client, a.operator_admin)
    data = {
        "match_field": "k8s_namespace",
        "value": "team-x",
        "customer": str(a.customer.pk),
        "priority": "50",
    }
    response = client.post("/settings/rules/", data)
    assert (response.status_code, response["Location"]) == (302, "/settings/rules/")
    assert "Rule k8s_namespace=team-x created." in body_of(client.get("/settings/rules/"))
    found = services.customer_for_job(a.operator.pk, {"k8s_namespace": "team-x", "job_id": "j1"})
    assert found is not None and found.pk == a.customer.pk
    # The same match again, another operator's customer, a bad priority: errors on the fields.
    response = client.post("/settings/rules/", data)
    assert response.status_code == 400
    assert 'data-testid="error-value"><li>Value: a rule matching k8s_namespace=' in body_of(
        response
    )
    response = client.post(
        "/settings/rules/", {**data, "value": "y", "customer": str(b.customer.pk)}
    )
    assert response.status_code == 400
    assert 'data-testid="error-customer"><li>Customer: Select a valid choice.' in body_of(response)
    response = client.post("/settings/rules/", {**data, "value": "y", "priority": "soon"})
    assert response.status_code == 400
    assert 'data-testid="error-priority"><li>Priority: Enter a whole number.' in body_of(response)
    # b's customer is not even offered.
    assert f'value="{b.customer.pk}"' not in body_of(client.get("/settings/rules/"))


def test_edit_and_delete_rule(client: Client, a: Tenant) -> None:
    rule = rule_of(a, "old-value")
    sign_in(client, a.operator_admin)
    page = body_of(client.get(f"/settings/rules/{rule.pk}/"))
    assert 'value="old-value"' in page and 'value="100"' in page
    data = {
        "match_field": "slurm_partition",
        "value": "gpu",
        "customer": str(a.customer.pk),
        "priority": "7",
    }
    response = client.post(f"/settings/rules/{rule.pk}/", data)
    assert (response.status_code, response["Location"]) == (302, "/settings/rules/")
    with tenant_context(a.operator.pk):
        rule.refresh_from_db()
    assert (rule.match_field, rule.value, rule.priority) == ("slurm_partition", "gpu", 7)
    response = client.post(f"/settings/rules/{rule.pk}/", {**data, "value": ""})
    assert response.status_code == 400 and "Value: This field is required." in body_of(response)
    response = client.post(f"/settings/rules/{rule.pk}/delete/")
    assert (response.status_code, response["Location"]) == (302, "/settings/rules/")
    assert "Rule slurm_partition=gpu deleted" in body_of(client.get("/settings/rules/"))
    with tenant_context(a.operator.pk):
        assert not JobMappingRule.objects.filter(pk=rule.pk).exists()
    assert client.get(f"/settings/rules/{rule.pk}/").status_code == 404


# --- agents ------------------------------------------------------------------------------------


def test_agents_page_lists_tokens_versions_and_agents_of_this_operator_only(
    client: Client, a: Tenant, b: Tenant
) -> None:
    rack, plaintext = services.do_create_agent_token(a.principal(a.operator_admin), name="rack 12")
    bravo_rack, _ = services.do_create_agent_token(b.principal(b.operator_admin), name="bravo rack")
    register_node(a, "alpha-n1", gpus=8, version="1.4.0", token_id=rack.pk)
    register_node(a, "alpha-n2", gpus=4, version="1.3.2")
    register_node(a, "alpha-n3", gpus=8, version="1.4.0", token_id=rack.pk)
    register_node(b, "bravo-n1", gpus=8, version="9.9.9", token_id=bravo_rack.pk)
    assert services.resolve_agent_token(plaintext) == a.operator.pk  # an agent connecting
    body = body_of(sign_in(client, a.operator_admin).get("/settings/agents/"))
    assert "rack 12" in body and "never" not in body.split('data-testid="agent-versions"')[0]
    # the nodes whose agent registered with the token (alpha-n2's registered without one)
    assert '<td class="num" data-testid="token-nodes">2</td>' in body
    versions = body.split('data-testid="agent-versions"')[1].split("</table>")[0]
    assert '<code>1.4.0</code></td><td class="num">2</td><td class="num">0</td>' in versions
    assert '<code>1.3.2</code></td><td class="num">1</td>' in versions
    agents = body.split('data-testid="agents"')[1].split("</table>")[0]
    assert (
        '<td>alpha-n2</td><td><code>agent-alpha-n2</code></td><td>1.3.2</td><td class="num">4</td>'
        in agents
    )
    assert "bravo" not in body.lower() and "9.9.9" not in body


def test_create_agent_token_shows_the_plaintext_once(client: Client, a: Tenant) -> None:
    sign_in(client, a.operator_admin)
    response = client.post("/settings/agents/", {"name": "rack 7"})
    assert (response.status_code, response["Location"]) == (302, "/settings/agents/")
    page = client.get("/settings/agents/")
    assert page["Cache-Control"] == "no-store"
    body = body_of(page)
    assert "Agent token “rack 7” created." in body
    plaintext = body.split('<pre class="secret-value"><code>')[1].split("</code>")[0]
    assert plaintext.startswith("prfa_")
    assert services.resolve_agent_token(plaintext) == a.operator.pk
    again = client.get("/settings/agents/")
    assert plaintext not in body_of(again) and "no-store" not in again.get("Cache-Control", "")
    response = client.post("/settings/agents/", {"name": ""})
    assert response.status_code == 400
    assert 'data-testid="error-name"><li>Name: This field is required.' in body_of(response)


def test_revoke_agent_token(client: Client, a: Tenant) -> None:
    token, plaintext = services.do_create_agent_token(a.principal(a.operator_admin), name="old")
    sign_in(client, a.operator_admin)
    response = client.post(f"/settings/agents/tokens/{token.pk}/revoke/")
    assert (response.status_code, response["Location"]) == (302, "/settings/agents/")
    assert services.resolve_agent_token(plaintext) is None
    body = body_of(client.get("/settings/agents/"))
    assert "Agent token “old” revoked" in body and "revoked 20" in body


@pytest.mark.parametrize(
    ("query", "parameter"),
    [("page=0", "page"), ("page=x", "page"), ("page=3", "page"), ("sort=version;drop", "sort")],
)
def test_bad_agents_parameters_are_400_naming_them(
    client: Client, a: Tenant, query: str, parameter: str
) -> None:
    register_node(a, "alpha-n1", gpus=1)
    response = sign_in(client, a.operator_admin).get(f"/settings/agents/?{query}")
    assert response.status_code == 400
    assert f"The query parameter <code>{parameter}</code> is not valid" in body_of(response)


def test_agents_are_paginated_and_sorted(client: Client, a: Tenant) -> None:
    for i in range(55):
        register_node(a, f"alpha-n{i:02d}", gpus=0, version="1.4.0" if i % 2 else "1.3.0")
    sign_in(client, a.operator_admin)
    first = body_of(client.get("/settings/agents/"))
    assert "alpha-n00" in first and "alpha-n49" in first and "alpha-n50" not in first
    assert "Page 1 of 2 · 55 in all" in first and 'href="?sort=hostname&amp;page=2"' in first
    second = body_of(client.get("/settings/agents/?sort=hostname&page=2"))
    assert "alpha-n54" in second and "alpha-n49" not in second
    newest = body_of(client.get("/settings/agents/?sort=-hostname"))
    assert newest.index("alpha-n54") < newest.index("alpha-n53")


# --- GPU list prices ---------------------------------------------------------------------------


def test_prices_list_the_fleets_models_with_and_without_a_price(
    client: Client, a: Tenant, b: Tenant
) -> None:
    register_node(a, "alpha-n1", gpus=8, model=H100)
    register_node(b, "bravo-n1", gpus=8, model=A100)
    set_list_price(b.principal(b.operator_admin), gpu_model=A100, price_per_gpu_hour=Decimal("1.5"))
    body = body_of(sign_in(client, a.operator_admin).get("/settings/prices/"))
    assert f'<td>{H100}</td><td class="num">8</td>' in body and "not set" in body
    assert A100 not in body and "bravo" not in body.lower()


def test_set_edit_and_delete_a_list_price(client: Client, a: Tenant) -> None:
    register_node(a, "alpha-n1", gpus=8, model=H100)
    sign_in(client, a.operator_admin)
    data = {"gpu_model": H100, "price_per_gpu_hour": "2.49", "currency": "usd"}
    response = client.post("/settings/prices/", data)
    assert (response.status_code, response["Location"]) == (302, "/settings/prices/")
    body = body_of(client.get("/settings/prices/"))
    assert f"{H100}: 2.49 USD per GPU-hour." in body and "$2.49" in body
    with tenant_context(a.operator.pk):
        price = GpuListPrice.objects.for_tenant(a.operator).get(gpu_model=H100)
    assert price.price_per_gpu_hour == Decimal("2.49")
    response = client.post(
        f"/settings/prices/{price.pk}/", {"price_per_gpu_hour": "3", "currency": "EUR"}
    )
    assert response.status_code == 302
    assert "€3.00" in body_of(client.get("/settings/prices/"))
    response = client.post(f"/settings/prices/{price.pk}/delete/")
    assert response.status_code == 302
    body = body_of(client.get("/settings/prices/"))
    assert f"List price of {H100} deleted" in body and "not set" in body


def test_invalid_price_rerenders_with_errors_naming_the_field(client: Client, a: Tenant) -> None:
    sign_in(client, a.operator_admin)
    response = client.post(
        "/settings/prices/", {"gpu_model": "", "price_per_gpu_hour": "-1", "currency": "U5D"}
    )
    assert response.status_code == 400
    body = body_of(response)
    assert "GPU model: This field is required." in body
    assert "Price per GPU-hour: Ensure this value is greater than or equal to 0.0001." in body
    assert "Currency: must be three letters, e.g. USD" in body


# --- queries per page: fixed, whatever the number of rows ----------------------------------------


def _fill(t: Tenant, n: int) -> None:
    """n rows of everything the fleet's settings pages list, named after the operator."""
    admin, name = t.principal(t.operator_admin), t.operator.slug
    for i in range(n):
        customer = services.do_create_customer(admin, name=f"{name} team {i}", slug=f"team-{i}")
        services.do_create_mapping_rule(
            admin,
            match_field="slurm_account",
            value=f"{name}-acct-{i}",
            customer_id=customer.pk,
            priority=i,
        )
        services.do_create_agent_token(admin, name=f"{name} rack {i}")
        register_node(t, f"{name}-q{i}", gpus=2, version=f"1.{i}.{name}", model=f"{name} GPU {i}")
        set_list_price(admin, gpu_model=f"{name} GPU {i}", price_per_gpu_hour=Decimal(i + 1))


# The page's own queries past the BASE_QUERIES every signed-in page makes.
PAGE_QUERIES = {
    "/settings/": 0,
    "/settings/customers/": 6,  # count, the page, its members, rules and jobs (a GROUP BY each),
    # the operator's masking setting
    "/settings/rules/": 3,  # the form's customers, count, the page (customer joined)
    "/settings/agents/": 6,  # tokens, nodes per token and versions (a GROUP BY each), count,
    # the page, its GPUs
    "/settings/prices/": 2,  # the prices, the fleet's models (one GROUP BY)
}


@pytest.mark.parametrize("rows", [1, 6])
@pytest.mark.parametrize("url", list(PAGE_QUERIES))
def test_query_counts_do_not_grow_with_rows(
    client: Client,
    a: Tenant,
    b: Tenant,
    django_assert_num_queries: Callable[..., Any],
    url: str,
    rows: int,
) -> None:
    _fill(a, rows)
    _fill(b, 2)
    sign_in(client, a.operator_admin)
    with django_assert_num_queries(BASE_QUERIES + PAGE_QUERIES[url]):
        response = client.get(url)
    assert response.status_code == 200
    assert "bravo" not in body_of(response).lower()
