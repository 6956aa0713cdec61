from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.http import Http404
from django.utils import timezone

from tenants import services
from tenants.access import Principal
from tenants.context import current_operator_id, system_context, tenant_context, tenant_task
from tenants.models import AgentToken, ApiToken, Customer, JobMappingRule, Membership, Role
from tenants.testing import make_tenant
from tenants.tokens import hash_secret

pytestmark = pytest.mark.django_db


def test_create_operator_makes_operator_admin_and_refuses_duplicates() -> None:
    operator, user = services.do_create_operator(
        name="Acme GPU",
        slug="acme",
        admin_username="root",
        admin_email="r@a.example",
        admin_password="s3cret-pass-word",
    )
    assert user.check_password("s3cret-pass-word")
    with system_context():
        membership = Membership.objects.get(user=user)
    assert membership.operator_id == operator.pk
    assert membership.role == Role.OPERATOR_ADMIN
    with pytest.raises(services.TenancyError, match="slug 'acme' already exists"):
        services.do_create_operator(
            name="Other", slug="acme", admin_username="x", admin_email="", admin_password="p"
        )
    with pytest.raises(services.TenancyError, match="user named 'root' already exists"):
        services.do_create_operator(
            name="Other", slug="other", admin_username="root", admin_email="", admin_password="p"
        )
    with pytest.raises(services.TenancyError, match="slug 'not a slug' is not valid"):
        services.do_create_operator(
            name="Other", slug="not a slug", admin_username="y", admin_email="", admin_password="p"
        )
    # The failed attempt with a fresh slug left nothing behind (one transaction).
    with system_context():
        assert not get_user_model().objects.filter(username="x").exists()


@pytest.mark.parametrize(
    ("role", "customer_of", "refusal"),
    [
        (Role.CUSTOMER_VIEWER, None, "customer role and needs a customer"),
        (Role.OPERATOR_ADMIN, "own", "operator role and takes no customer"),
        (Role.CUSTOMER_VIEWER, "other", "does not belong to this operator"),
    ],
)
def test_membership_role_must_match_scope_and_customer_must_be_own(
    role: Role, customer_of: str | None, refusal: str
) -> None:
    a, b = make_tenant("ta"), make_tenant("tb")
    user = get_user_model().objects.create_user(username="loner", password="pw")
    customer_id = {None: None, "own": a.customer.pk, "other": b.customer.pk}[customer_of]
    with pytest.raises(services.TenancyError, match=refusal):
        services.do_add_membership(
            operator_id=a.operator.pk, user=user, role=role, customer_id=customer_id
        )


def test_api_token_is_stored_hashed_and_authenticates_to_its_principal() -> None:
    a = make_tenant("ta")
    principal = a.principal(a.operator_admin)
    token, plaintext = services.do_create_api_token(principal, name="ci", scope="read_write")
    assert plaintext.startswith(token.prefix)
    assert token.token_hash == hash_secret(plaintext)
    with system_context():
        stored = ApiToken.objects.get(pk=token.pk)
    assert plaintext not in {stored.token_hash, stored.prefix, stored.name}
    authed = services.authenticate_api_token(plaintext)
    assert authed == Principal(
        operator_id=a.operator.pk,
        customer_id=None,
        role=Role.OPERATOR_ADMIN,
        can_write=True,
        api_token_id=token.pk,
        # read_write: writes, but not the admin endpoints (those need scope admin).
        admin_scope=False,
    )


def test_api_token_write_needs_scope_and_role() -> None:
    a = make_tenant("ta")
    _t, read_only = services.do_create_api_token(
        a.principal(a.operator_admin), name="ro", scope="read"
    )
    assert services.authenticate_api_token(read_only).can_write is False
    # An operator creating a customer token: customer-scoped, never operator-wide.
    _t, for_customer = services.do_create_api_token(
        a.principal(a.operator_admin), name="c", scope="read_write", customer_id=a.customer.pk
    )
    principal = services.authenticate_api_token(for_customer)
    assert (principal.customer_id, principal.is_customer) == (a.customer.pk, True)
    # A viewer has no write access, so cannot mint tokens at all.
    with pytest.raises(services.NotAllowed):
        services.do_create_api_token(a.principal(a.customer_viewer), name="v", scope="read")
    # A customer admin cannot mint a token for someone else's customer.
    other = services.do_create_customer(a.operator.pk, name="Other", slug="other")
    with pytest.raises(services.NotAllowed):
        services.do_create_api_token(
            a.principal(a.customer_admin), name="x", scope="read", customer_id=other.pk
        )


def test_api_token_rejections_say_why_and_last_used_is_throttled() -> None:
    a = make_tenant("ta")
    principal = a.principal(a.operator_admin)
    with pytest.raises(services.TokenRejected, match="Invalid"):
        services.authenticate_api_token("prf_not-a-real-token")
    token, plaintext = services.do_create_api_token(principal, name="t", scope="read")
    services.authenticate_api_token(plaintext)
    with system_context():
        first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    services.authenticate_api_token(plaintext)
    with system_context():
        assert ApiToken.objects.get(pk=token.pk).last_used_at == first  # within the minute
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now())
    with pytest.raises(services.TokenRejected, match="expired"):
        services.authenticate_api_token(plaintext)
    with system_context():
        ApiToken.objects.filter(pk=token.pk).update(expires_at=None)
    services.do_revoke_api_token(principal, token.pk)
    with pytest.raises(services.TokenRejected, match="revoked"):
        services.authenticate_api_token(plaintext)
    with pytest.raises(services.TenancyError, match="future"):
        services.do_create_api_token(
            principal, name="t", scope="read", expires_at=timezone.now() - timedelta(seconds=1)
        )


def test_revoke_needs_admin_or_creator_and_is_tenant_scoped() -> None:
    a, b = make_tenant("ta"), make_tenant("tb")
    token, _ = services.do_create_api_token(a.principal(a.operator_admin), name="t", scope="read")
    with pytest.raises(services.NotAllowed):
        services.do_revoke_api_token(a.principal(a.operator_support), token.pk)
    with pytest.raises(Http404):
        services.do_revoke_api_token(b.principal(b.operator_admin), token.pk)
    own, _ = services.do_create_api_token(a.principal(a.operator_support), name="o", scope="read")
    assert services.do_revoke_api_token(a.principal(a.operator_support), own.pk).revoked_at


def test_agent_token_resolves_to_operator_until_revoked() -> None:
    a, b = make_tenant("ta"), make_tenant("tb")
    with pytest.raises(services.NotAllowed):
        services.do_create_agent_token(a.principal(a.operator_support), name="rack 1")
    token, plaintext = services.do_create_agent_token(a.principal(a.operator_admin), name="r1")
    assert services.resolve_agent_token(plaintext) == a.operator.pk
    assert services.resolve_agent_token(plaintext + "x") is None
    assert services.resolve_agent_token("") is None
    with system_context():
        assert AgentToken.objects.get(pk=token.pk).last_used_at is not None
    with pytest.raises(Http404):
        services.do_revoke_agent_token(b.principal(b.operator_admin), token.pk)
    assert services.resolve_agent_token(plaintext) == a.operator.pk
    services.do_revoke_agent_token(a.principal(a.operator_admin), token.pk)
    assert services.resolve_agent_token(plaintext) is None


def test_rule_matching_is_pure_and_ordered() -> None:
    rules = [
        ("job_id_prefix", "abc-", 1),
        ("slurm_partition", "gpu", 2),
        ("slurm_account", "team-a", 3),
    ]
    assert services.first_matching_customer_id(rules, {"job_id": "abc-123"}) == 1
    assert services.first_matching_customer_id(rules, {"slurm_partition": "debug,gpu"}) == 2
    assert services.first_matching_customer_id(rules, {"slurm_partition": "gpu2"}) is None
    assert services.first_matching_customer_id(rules, {"slurm_account": "team-a"}) == 3
    assert services.first_matching_customer_id(rules, {"slurm_account": "team-ab"}) is None
    assert services.first_matching_customer_id(rules, {}) is None
    assert services.rule_matches("k8s_namespace", "ns", {"k8s_namespace": "ns"})
    assert not services.rule_matches("slurm_user", "bob", {"slurm_user": ""})


def test_customer_for_job_uses_priority_and_own_rules_only() -> None:
    a, b = make_tenant("ta"), make_tenant("tb")
    admin = a.principal(a.operator_admin)
    second = services.do_create_customer(admin, name="Second", slug="second")
    services.do_create_mapping_rule(
        admin, match_field="slurm_account", value="ml", customer_id=a.customer.pk, priority=50
    )
    services.do_create_mapping_rule(
        admin, match_field="slurm_partition", value="h100", customer_id=second.pk, priority=10
    )
    job = {"slurm_account": "ml", "slurm_partition": "h100", "job_id": "77"}
    assert services.customer_for_job(a.operator, job) == second
    assert services.customer_for_job(a.operator.pk, {"slurm_account": "ml"}) == a.customer
    assert services.customer_for_job(a.operator, {"slurm_account": "nope"}) is None
    # Operator B has no rules: A's rules never map B's jobs.
    assert services.customer_for_job(b.operator, job) is None
    with pytest.raises(services.TenancyError, match="already exists"):
        services.do_create_mapping_rule(
            admin, match_field="slurm_account", value="ml", customer_id=second.pk
        )
    with pytest.raises(services.TenancyError, match="match_field 'gpu' must be one of"):
        services.do_create_mapping_rule(admin, match_field="gpu", value="x", customer_id=second.pk)
    with pytest.raises(services.TenancyError, match=f"customer {b.customer.pk} does not exist"):
        services.do_create_mapping_rule(
            admin, match_field="slurm_user", value="u", customer_id=b.customer.pk
        )
    with pytest.raises(services.NotAllowed):
        services.do_create_mapping_rule(
            a.principal(a.operator_support),
            match_field="slurm_user",
            value="u",
            customer_id=second.pk,
        )
    with tenant_context(a.operator.pk):
        assert JobMappingRule.objects.for_tenant(a.operator).count() == 2


def test_tenant_task_runs_body_as_the_given_operator() -> None:
    a, b = make_tenant("ta"), make_tenant("tb")

    @tenant_task
    def count_customers(operator_id: int, label: str) -> tuple[str, int | None, list[str]]:
        # Unscoped on purpose: on PostgreSQL, RLS alone limits this to the task's operator.
        names = sorted(Customer.objects.values_list("slug", flat=True))
        return label, current_operator_id(), names

    label, current, names = count_customers(a.operator.pk, "x")
    assert label == "x"
    if connection.vendor == "postgresql":
        assert current == a.operator.pk
        assert names == ["ta-customer"]
    else:
        assert names == ["ta-customer", "tb-customer"]
    assert current_operator_id() is None  # nothing leaks past the task
    with pytest.raises(TypeError, match="first argument must be the operator id"):
        count_customers("ta", "x")
    assert b.operator.pk != a.operator.pk
