"""Test helpers any app may use: a whole tenant (operator, customer, one user per role) made
through the real services, and API clients authenticated as those users or as tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import User

from tenants import services
from tenants.access import Principal
from tenants.models import Customer, Operator, Role, TokenScope
from tenants.selectors import principal_for_user

TEST_PASSWORD = "correct-horse-battery-staple-42"  # noqa: S105 - the test users' password, for test databases only


@dataclass
class Tenant:
    operator: Operator
    customer: Customer
    operator_admin: User
    operator_support: User
    customer_admin: User
    customer_viewer: User

    def principal(self, user: User) -> Principal:
        principal = principal_for_user(user)
        if principal is None:
            raise ValueError(f"{user} has no principal (no operator or customer)")
        return principal

    def api_token(
        self, user: User, scope: str | None = None, customer_id: int | None = None
    ) -> str:
        """A token of `user`; by default of the widest scope their role may hold (admin for
        the admin roles, read_write for the others)."""
        principal = self.principal(user)
        if scope is None:
            scope = TokenScope.ADMIN if principal.can_admin else TokenScope.READ_WRITE
        _token, plaintext = services.do_create_api_token(
            principal,
            name=f"{user.username} token",
            scope=scope,
            customer_id=customer_id,
        )
        return plaintext


def make_tenant(slug: str, customer_slug: str | None = None) -> Tenant:
    """Operator `slug` with a customer and one user per role (usernames prefixed by slug)."""
    operator, admin = services.do_create_operator(
        name=f"Operator {slug}",
        slug=slug,
        admin_username=f"{slug}-op-admin",
        admin_email=f"admin@{slug}.example",
        admin_password=TEST_PASSWORD,
    )
    customer_slug = customer_slug or f"{slug}-customer"
    customer = services.do_create_customer(
        operator.pk, name=f"Customer {customer_slug}", slug=customer_slug
    )
    users = {}
    for role, customer_id in (
        (Role.OPERATOR_SUPPORT, None),
        (Role.CUSTOMER_ADMIN, customer.pk),
        (Role.CUSTOMER_VIEWER, customer.pk),
    ):
        membership = services.do_create_member(
            operator_id=operator.pk,
            username=f"{slug}-{role.value.replace('_', '-')}",
            email="",
            password=TEST_PASSWORD,
            role=role,
            customer_id=customer_id,
        )
        users[role] = membership.user
    return Tenant(
        operator=operator,
        customer=customer,
        operator_admin=admin,
        operator_support=users[Role.OPERATOR_SUPPORT],
        customer_admin=users[Role.CUSTOMER_ADMIN],
        customer_viewer=users[Role.CUSTOMER_VIEWER],
    )


def make_second_customer(
    tenant: Tenant, slug: str = "second", username: str | None = None
) -> tuple[Customer, User]:
    """Another customer of `tenant`'s operator, with its customer admin: what every endpoint
    and page test refuses beside another operator."""
    operator_id = tenant.operator.pk
    customer = services.do_create_customer(operator_id, name="Second", slug=slug)
    admin = services.do_create_member(
        operator_id=operator_id,
        username=username or f"{tenant.operator.slug}-second-admin",
        email="",
        password=TEST_PASSWORD,
        role=Role.CUSTOMER_ADMIN,
        customer_id=customer.pk,
    ).user
    return customer, admin


def tenant_fixtures(slug_a: str, slug_b: str) -> tuple[Callable[[], Tenant], Callable[[], Tenant]]:
    """The fixtures `a` and `b`, two operators that must never see each other's rows: in a
    test module, `a, b = tenant_fixtures("opa", "opb")`."""

    def fixture(name: str, slug: str) -> Callable[[], Tenant]:
        @pytest.fixture(name=name)
        def tenant() -> Tenant:
            return make_tenant(slug)

        return tenant

    return fixture("a", slug_a), fixture("b", slug_b)
