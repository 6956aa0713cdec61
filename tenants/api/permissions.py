from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from tenants.access import Principal
from tenants.models import Role


def _principal(request: Request) -> Principal | None:
    principal = getattr(request, "principal", None) or getattr(request._request, "principal", None)
    return principal if isinstance(principal, Principal) else None


class HasPrincipal(BasePermission):
    """Authenticated as a member of an operator or customer; writes need a write scope."""

    message = "Authentication with an operator or customer principal is required."

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = _principal(request)
        if principal is None:
            return False
        return request.method in SAFE_METHODS or principal.can_write


class IsOperatorPrincipal(HasPrincipal):
    message = "Only operator roles may use this endpoint."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        principal = _principal(request)
        return principal is not None and principal.is_operator


class IsAdminPrincipal(HasPrincipal):
    message = "Only admin roles may use this endpoint."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        principal = _principal(request)
        return principal is not None and principal.is_admin


class IsOperatorAdminPrincipal(HasPrincipal):
    message = "Only operator admins may use this endpoint."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not super().has_permission(request, view):
            return False
        principal = _principal(request)
        return principal is not None and principal.role == Role.OPERATOR_ADMIN
