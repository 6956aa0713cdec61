from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from tenants.access import Principal
from tenants.models import Role


def principal_or_none(request: Request) -> Principal | None:
    """The principal the authentication (or the session middleware) put on the request."""
    principal = getattr(request, "principal", None) or getattr(request._request, "principal", None)
    return principal if isinstance(principal, Principal) else None


class HasPrincipal(BasePermission):
    """Authenticated as a member of an operator or customer; writes need a write scope.

    Subclasses narrow who may use the endpoint with `allows()`.
    """

    message = "Authentication with an operator or customer principal is required."

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = principal_or_none(request)
        if principal is None:
            return False
        if request.method not in SAFE_METHODS and not principal.can_write:
            return False
        return self.allows(principal)

    def allows(self, principal: Principal) -> bool:
        return True


class IsOperatorPrincipal(HasPrincipal):
    message = "Only operator roles may use this endpoint."

    def allows(self, principal: Principal) -> bool:
        return principal.is_operator


class IsAdminPrincipal(HasPrincipal):
    message = "Only admin roles may use this endpoint."

    def allows(self, principal: Principal) -> bool:
        return principal.is_admin


class IsOperatorAdminPrincipal(HasPrincipal):
    message = "Only operator admins may use this endpoint."

    def allows(self, principal: Principal) -> bool:
        return principal.role == Role.OPERATOR_ADMIN
