"""Members managed by admins (the console's users settings): invite with a one-time
set-password link, change role, deactivate; each refused outside the admin's scope."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.http import Http404
from django.test import Client
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode

from tenants import services
from tenants.context import system_context
from tenants.models import ApiToken, Membership, Role
from tenants.testing import TEST_PASSWORD, Tenant, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def a() -> Tenant:
    return make_tenant("memops-a")


@pytest.fixture
def b() -> Tenant:
    return make_tenant("memops-b")


def _membership(user_pk: int) -> Membership:
    with system_context():
        return Membership.objects.select_related("user").get(user_id=user_pk)


def test_invite_creates_member_without_password_and_a_working_one_time_link(a: Tenant) -> None:
    admin = a.principal(a.operator_admin)
    membership, link = services.do_invite_member(
        admin, username="newbie", email="newbie@a.example", role=Role.OPERATOR_SUPPORT
    )
    user = membership.user
    assert (membership.role, membership.customer_id) == (Role.OPERATOR_SUPPORT, None)
    assert membership.operator_id == a.operator.pk
    assert not user.has_usable_password()
    assert force_str(urlsafe_base64_decode(link.uidb64)) == str(user.pk)
    assert default_token_generator.check_token(user, link.token)
    user.set_password("a-long-new-passphrase")
    user.save()
    assert not default_token_generator.check_token(user, link.token)  # used once


def test_invite_refuses_bad_input_and_leaves_nothing_behind(a: Tenant, b: Tenant) -> None:
    admin = a.principal(a.operator_admin)
    with pytest.raises(services.TenancyError, match="user named 'memops-a-op-admin'"):
        services.do_invite_member(
            admin,
            username="memops-a-op-admin",
            role=Role.CUSTOMER_VIEWER,
            customer_id=a.customer.pk,
        )
    with pytest.raises(services.TenancyError, match="needs a customer"):
        services.do_invite_member(admin, username="x1", role=Role.CUSTOMER_VIEWER)
    with pytest.raises(services.TenancyError, match="takes no customer"):
        services.do_invite_member(
            admin, username="x2", role=Role.OPERATOR_ADMIN, customer_id=a.customer.pk
        )
    with pytest.raises(services.TenancyError, match="does not exist"):
        services.do_invite_member(
            admin, username="x3", role=Role.CUSTOMER_ADMIN, customer_id=b.customer.pk
        )
    with pytest.raises(services.TenancyError, match="must be one of"):
        services.do_invite_member(admin, username="x4", role="superuser")
    with pytest.raises(services.TenancyError, match="email address"):
        services.do_invite_member(
            admin, username="x5", email="not-mail", role=Role.OPERATOR_SUPPORT
        )
    with system_context():
        assert (
            not get_user_model()
            .objects.filter(username__in=["x1", "x2", "x3", "x4", "x5"])
            .exists()
        )


def test_customer_admin_invites_into_own_customer_only(a: Tenant) -> None:
    customer_admin = a.principal(a.customer_admin)
    membership, _ = services.do_invite_member(
        customer_admin, username="teammate", role=Role.CUSTOMER_VIEWER
    )
    assert membership.customer_id == a.customer.pk
    other = services.do_create_customer(a.operator.pk, name="Other", slug="other")
    with pytest.raises(services.NotAllowed, match="own customer"):
        services.do_invite_member(
            customer_admin, username="t2", role=Role.CUSTOMER_VIEWER, customer_id=other.pk
        )
    for role in (Role.OPERATOR_ADMIN, Role.OPERATOR_SUPPORT):  # never above its own scope
        with pytest.raises(services.NotAllowed, match="customer roles only"):
            services.do_invite_member(customer_admin, username="t3", role=role)


@pytest.mark.parametrize("who", ["operator_support", "customer_viewer"])
def test_non_admins_cannot_manage_members(a: Tenant, who: str) -> None:
    principal = a.principal(getattr(a, who))
    target = _membership(a.customer_viewer.pk if who != "customer_viewer" else a.customer_admin.pk)
    with pytest.raises(services.NotAllowed):
        services.do_invite_member(
            principal, username="nope", role=Role.CUSTOMER_VIEWER, customer_id=a.customer.pk
        )
    with pytest.raises(services.NotAllowed):
        services.do_change_member_role(
            principal, target.pk, role=Role.CUSTOMER_ADMIN, customer_id=a.customer.pk
        )
    with pytest.raises(services.NotAllowed):
        services.do_set_member_active(principal, target.pk, active=False)
    with pytest.raises(services.NotAllowed):
        services.do_issue_password_link(principal, target.pk)


def test_customer_admin_cannot_touch_operator_users_or_other_customers_or_tenants(
    a: Tenant, b: Tenant
) -> None:
    customer_admin = a.principal(a.customer_admin)
    other = services.do_create_customer(a.operator.pk, name="Other", slug="other")
    other_member = services.do_create_member(
        operator_id=a.operator.pk,
        username="other-viewer",
        email="",
        password=TEST_PASSWORD,
        role=Role.CUSTOMER_VIEWER,
        customer_id=other.pk,
    )
    targets = [
        _membership(a.operator_admin.pk),
        _membership(a.operator_support.pk),
        other_member,
        _membership(b.customer_viewer.pk),
    ]
    for target in targets:
        with pytest.raises(Http404):
            services.do_change_member_role(customer_admin, target.pk, role=Role.CUSTOMER_VIEWER)
        with pytest.raises(Http404):
            services.do_set_member_active(customer_admin, target.pk, active=False)
        with pytest.raises(Http404):
            services.do_issue_password_link(customer_admin, target.pk)
    with system_context():
        assert get_user_model().objects.get(pk=a.operator_admin.pk).is_active


def test_operator_admin_cannot_touch_another_operators_members(a: Tenant, b: Tenant) -> None:
    admin = a.principal(a.operator_admin)
    target = _membership(b.customer_viewer.pk)
    with pytest.raises(Http404):
        services.do_change_member_role(
            admin, target.pk, role=Role.CUSTOMER_ADMIN, customer_id=a.customer.pk
        )
    with pytest.raises(Http404):
        services.do_set_member_active(admin, target.pk, active=False)
    with pytest.raises(Http404):
        services.do_issue_password_link(admin, target.pk)


def test_admins_cannot_change_or_deactivate_themselves(a: Tenant) -> None:
    for user in (a.operator_admin, a.customer_admin):
        principal = a.principal(user)
        own = _membership(user.pk)
        with pytest.raises(services.NotAllowed, match="yourself"):
            services.do_set_member_active(principal, own.pk, active=False)
        with pytest.raises(services.NotAllowed, match="yourself"):
            services.do_change_member_role(
                principal, own.pk, role=Role.CUSTOMER_VIEWER, customer_id=a.customer.pk
            )
        with pytest.raises(services.NotAllowed, match="yourself"):
            services.do_issue_password_link(principal, own.pk)


def test_change_role_moves_scope_and_revokes_tokens_the_new_role_could_not_make(a: Tenant) -> None:
    admin = a.principal(a.operator_admin)
    support = _membership(a.operator_support.pk)
    kept, _ = services.do_create_api_token(
        a.principal(a.operator_support), name="kept", scope="read"
    )
    # A raise within the operator scope keeps the member's tokens.
    services.do_change_member_role(admin, support.pk, role=Role.OPERATOR_ADMIN)
    with system_context():
        kept.refresh_from_db()
    assert kept.revoked_at is None
    # A move down to a customer role revokes them: the token still acts as an operator role.
    changed = services.do_change_member_role(
        admin, support.pk, role=Role.CUSTOMER_VIEWER, customer_id=a.customer.pk
    )
    assert (changed.role, changed.customer_id) == (Role.CUSTOMER_VIEWER, a.customer.pk)
    with system_context():
        kept.refresh_from_db()
    assert kept.revoked_at is not None
    assert a.principal(a.operator_support).is_customer


def test_customer_admin_changes_roles_within_own_customer(a: Tenant) -> None:
    customer_admin = a.principal(a.customer_admin)
    viewer = _membership(a.customer_viewer.pk)
    changed = services.do_change_member_role(customer_admin, viewer.pk, role=Role.CUSTOMER_ADMIN)
    assert (changed.role, changed.customer_id) == (Role.CUSTOMER_ADMIN, a.customer.pk)
    with pytest.raises(services.NotAllowed, match="customer roles only"):
        services.do_change_member_role(customer_admin, viewer.pk, role=Role.OPERATOR_ADMIN)


def test_deactivate_stops_sign_in_and_revokes_tokens_reactivate_restores_sign_in(
    a: Tenant,
) -> None:
    admin = a.principal(a.operator_admin)
    target = _membership(a.customer_admin.pk)
    token, _ = services.do_create_api_token(a.principal(a.customer_admin), name="ci", scope="read")
    services.do_set_member_active(admin, target.pk, active=False)
    with system_context():
        assert not get_user_model().objects.get(pk=a.customer_admin.pk).is_active
        assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert not Client().login(username=a.customer_admin.username, password=TEST_PASSWORD)
    with pytest.raises(services.TenancyError, match="deactivated"):
        services.do_issue_password_link(admin, target.pk)
    services.do_set_member_active(admin, target.pk, active=True)
    assert Client().login(username=a.customer_admin.username, password=TEST_PASSWORD)
    with system_context():
        assert ApiToken.objects.get(pk=token.pk).revoked_at is not None  # stays revoked


def test_issue_password_link_resets_the_password_and_ends_old_links(a: Tenant) -> None:
    admin = a.principal(a.operator_admin)
    target = _membership(a.customer_viewer.pk)
    _, first = services.do_issue_password_link(admin, target.pk)
    _, second = services.do_issue_password_link(admin, target.pk)
    with system_context():
        user = get_user_model().objects.get(pk=a.customer_viewer.pk)
    assert not user.has_usable_password()
    assert not default_token_generator.check_token(user, first.token)
    assert default_token_generator.check_token(user, second.token)
