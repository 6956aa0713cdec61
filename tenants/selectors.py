"""Reads of tenancy data."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from tenants.access import Principal
from tenants.context import system_context
from tenants.models import OPERATOR_ROLES, Membership, Role


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
        can_write=role in OPERATOR_ROLES or role == Role.CUSTOMER_ADMIN,
        user_id=user.pk,
    )
