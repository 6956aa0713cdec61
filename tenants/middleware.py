"""Per-request tenant context for the console (session) views and the staff admin site.

Every signed-in request runs inside one transaction with the user's operator set as the
current tenant (tenants/context.py), so row-level security applies to everything the view
reads or writes, template rendering included. API views re-set it from their token principal
(tenants/api/base.py).

The admin site is Proof staff's cross-tenant tool: for active staff users its requests run in
system_context() instead, so the admin can list every operator's rows under RLS. Nobody else
reaches it (the admin itself refuses non-staff users).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from tenants.context import system_context, tenant_context
from tenants.selectors import principal_for_user


@cache
def _admin_prefix() -> str:
    return reverse("admin:index")


def is_staff_admin_request(request: HttpRequest) -> bool:
    user = request.user
    return (
        user.is_authenticated
        and user.is_active
        and user.is_staff
        and request.path.startswith(_admin_prefix())
    )


class TenantContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        principal = principal_for_user(request.user)
        request.principal = principal  # type: ignore[attr-defined]
        if is_staff_admin_request(request):
            with system_context():
                return self.get_response(request)
        if principal is None:
            return self.get_response(request)
        with tenant_context(principal.operator_id):
            return self.get_response(request)
