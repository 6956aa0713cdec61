"""Console pages. The signed-in user's principal and tenant context come from
tenants.middleware.TenantContextMiddleware; every read below is scoped by it."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.access import Principal
from tenants.models import Role
from tenants.selectors import customer_of, customers_for, operator_of


@login_required
def home(request: HttpRequest) -> HttpResponse:
    principal: Principal | None = getattr(request, "principal", None)
    context: dict[str, object] = {}
    if principal is not None:
        context = {
            "operator": operator_of(principal),
            "customer": customer_of(principal),
            "customers": customers_for(principal),
            "role_label": Role(principal.role).label,
        }
    return render(request, "proof/home.html", context)
