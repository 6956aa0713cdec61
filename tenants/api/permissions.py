from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from tenants.access import Principal
from tenants.models import Role

READ_ONLY_MESSAGE = (
    "This principal may only read: a token of scope read, or a role that cannot write."
)


def principal_or_none(request: Request) -> Principal | None:
    """The principal the authentication (or the session middleware) put on the request."""
    principal = getattr(request, "principal", None) or getattr(request._request, "principal", None)
    return principal if isinstance(principal, Principal) else None


class HasPrincipal(BasePermission):
    """Authenticated as a member of an operator or customer; writes need a write scope
    (read_write or admin); the admin classes below also need the admin scope of a token.

    Subclasses narrow who may use the endpoint with `allows()`.
    """

    message = "Authentication with an operator or customer principal is required."

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = principal_or_none(request)
        if principal is None:
            return False
        if not self.allows(principal):
            return False
        if request.method not in SAFE_METHODS and not principal.can_write:
            self.message = READ_ONLY_MESSAGE
            return False
        return True

    def allows(self, principal: Principal) -> bool:
        return True


class IsOperatorPrincipal(HasPrincipal):
    message = "Only operator roles may use this endpoint."

    def allows(self, principal: Principal) -> bool:
        return principal.is_operator


class AdminScopeForWrites(HasPrincipal):
    """Admin endpoints: what the role allows (`allows`, any principal here, the view's
    queryset scoping the rows), and a change only with admin rights: a session, or a token
    of scope admin. A read or read_write token reads what its role may read."""

    message = "This change needs admin rights: a session, or an API token of scope admin."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        principal = principal_or_none(request)
        if request.method in SAFE_METHODS or (principal is not None and principal.admin_scope):
            return True
        self.message = AdminScopeForWrites.message
        return False


class IsAdminPrincipal(AdminScopeForWrites):
    message = "Only admin roles may use this endpoint."

    def allows(self, principal: Principal) -> bool:
        return principal.is_admin


class IsOperatorAdminPrincipal(AdminScopeForWrites):
    message = "Only operator admins may use this endpoint."

    def allows(self, principal: Principal) -> bool:
        return principal.role == Role.OPERATOR_ADMIN
