"""Who may open a console page.

Every console view is wrapped in `console_view`: the user must be signed in and a member of an
operator or a customer (tenants.middleware has resolved `request.principal` and set the tenant
context); `operator_only` pages (fleet, health, settings of the fleet) answer 404 to customer
users, the same answer as a URL of another tenant, so a customer cannot even confirm the page
exists. Reads inside the view go through `for_tenant(principal)` selectors.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Concatenate, ParamSpec

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.access import Principal

P = ParamSpec("P")
ConsoleView = Callable[Concatenate[HttpRequest, Principal, P], HttpResponse]


def principal_of(request: HttpRequest) -> Principal | None:
    principal: Principal | None = getattr(request, "principal", None)
    return principal


def console_view(
    *, operator_only: bool = False, admin_only: bool = False
) -> Callable[[ConsoleView[P]], Callable[Concatenate[HttpRequest, P], HttpResponse]]:
    """Wrap a view taking (request, principal, ...). A signed-in user without a membership gets
    the "not a member yet" page (403); a customer user on an operator-only page, or a
    non-admin on an admin-only page, gets 404."""

    def decorate(view: ConsoleView[P]) -> Callable[Concatenate[HttpRequest, P], HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
            principal = principal_of(request)
            if principal is None:
                return render(request, "proof/console/no_membership.html", status=403)
            if operator_only and not principal.is_operator:
                raise Http404("No such page.")
            if admin_only and not principal.is_admin:
                raise Http404("No such page.")
            return view(request, principal, *args, **kwargs)

        signed_in: Callable[Concatenate[HttpRequest, P], HttpResponse] = login_required(wrapped)
        return signed_in

    return decorate
