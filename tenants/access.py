"""Who is asking: the principal every read and write is scoped by.

A principal is resolved once per request (session user or API token) or per task (the
operator id the task was given), and is the only thing `for_tenant()` accepts besides an
operator. Fetch-by-id helpers here return 404 across tenants, never 403, so ids of other
tenants' objects are not confirmed to exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from django.http import Http404

from tenants.roles import CUSTOMER_ROLES, OPERATOR_ROLES, Role

if TYPE_CHECKING:
    from tenants.models import TenantOwned

M = TypeVar("M", bound="TenantOwned")


@dataclass(frozen=True)
class Principal:
    operator_id: int
    customer_id: int | None
    role: Role
    can_write: bool
    user_id: int | None = None
    api_token_id: int | None = None
    # False only for an API token without the admin scope: its admin role may then read and
    # write, but not use admin endpoints (tokens, channels, prices, members).
    admin_scope: bool = True
    # An API token's own request rate ("600/min"); None: the settings' default.
    rate_limit: str | None = None

    @property
    def is_operator(self) -> bool:
        return self.role in OPERATOR_ROLES

    @property
    def is_customer(self) -> bool:
        return self.role in CUSTOMER_ROLES

    @property
    def is_admin(self) -> bool:
        return self.role in (Role.OPERATOR_ADMIN, Role.CUSTOMER_ADMIN)

    @property
    def can_admin(self) -> bool:
        """An admin role acting with admin rights: a session, or a token of admin scope."""
        return self.is_admin and self.can_write and self.admin_scope


def role_can_write(role: Role | str) -> bool:
    """Whether a role may write at all (a token's scope can narrow it further)."""
    return Role(role) in OPERATOR_ROLES or Role(role) == Role.CUSTOMER_ADMIN


def get_object_for_tenant(model: type[M], principal: Principal, **lookup: object) -> M:
    """The object matching `lookup` among those the principal may see, else Http404."""
    queryset = model.objects.for_tenant(principal)
    try:
        return queryset.get(**lookup)
    except model.DoesNotExist:
        raise Http404(f"No {model._meta.verbose_name} matches the given query.") from None
