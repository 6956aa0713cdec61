"""Per-request tenant context for the console (session) views.

Every request runs inside one transaction with the signed-in user's operator set as the
current tenant (tenants/context.py), so row-level security applies to everything the view
reads or writes. API views re-set it from their token principal (tenants/api/base.py).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from tenants.context import tenant_context
from tenants.selectors import principal_for_user


class TenantContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        principal = principal_for_user(request.user)
        request.principal = principal  # type: ignore[attr-defined]
        if principal is None:
            return self.get_response(request)
        with tenant_context(principal.operator_id):
            return self.get_response(request)
