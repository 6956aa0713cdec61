"""Reads of tenancy data."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from tenants.access import Principal, role_can_write
from tenants.context import system_context, tenant_context
from tenants.models import Customer, Membership, Operator, Role


def principal_for_user(user: AbstractBaseUser | AnonymousUser) -> Principal | None:
    """The principal of a signed-in user, from their membership; None without one."""
    if not user.is_authenticated:
        return None
    # The membership is what tells us the tenant, so it is read before one is set.
    with system_context():
        membership = Membership.objects.filter(user_id=user.pk).first()
    if membership is None:
        return None
    role = Role(membership.role)
    return Principal(
        operator_id=membership.operator_id,
        customer_id=membership.customer_id,
        role=role,
        can_write=role_can_write(role),
        user_id=user.pk,
    )


def operator_of(principal: Principal) -> Operator:
    """The principal's operator (read in its own tenant context)."""
    with tenant_context(principal.operator_id):
        return Operator.objects.get(pk=principal.operator_id)


def customers_for(principal: Principal) -> list[Customer]:
    """The customers the principal may see: all of the operator's, or just its own."""
    with tenant_context(principal.operator_id):
        return list(Customer.objects.for_tenant(principal).order_by("name", "id"))


def customer_of(principal: Principal) -> Customer | None:
    if principal.customer_id is None:
        return None
    with tenant_context(principal.operator_id):
        return Customer.objects.for_tenant(principal).filter(pk=principal.customer_id).first()


def operator_ids() -> list[int]:
    """Every operator's id: fleet-wide periodic passes (metering) list them, then work in
    each one's tenant context. Cross-tenant on purpose, ids only."""
    with system_context():
        return list(Operator.objects.order_by("id").values_list("id", flat=True))


def operator_by_slug(slug: str) -> Operator | None:
    """The operator with this slug (commands name operators by slug); None if there is none."""
    with system_context():
        return Operator.objects.filter(slug=slug).first()


def customer_names(operator_id: int) -> dict[int, str]:
    """Customer id → name of the operator's customers."""
    with tenant_context(operator_id):
        return dict(Customer.objects.for_tenant(operator_id).values_list("id", "name"))


def operator_slugs() -> dict[int, str]:
    """Operator id → slug of every operator (commands print and take slugs). Cross-tenant."""
    with system_context():
        return dict(Operator.objects.order_by("id").values_list("id", "slug"))
