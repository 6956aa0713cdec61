"""/settings/agents/: the agent tokens nodes stream with, and the agents seen (operator
admins only)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from frontend.access import console_view
from frontend.forms.settings import AgentTokenForm
from frontend.selectors.settings import AGENT_SORTS, agent_sort, agents_overview, page_number
from frontend.views.settings.common import (
    add_service_error,
    answers_bad_parameters,
    no_store,
    render_settings,
    show_secret_once,
    take_secret,
)
from tenants.access import Principal
from tenants.services import TenancyError, do_create_agent_token, do_revoke_agent_token


@require_http_methods(["GET", "POST"])
@console_view(operator_only=True, admin_only=True)
@answers_bad_parameters
def agents(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = AgentTokenForm(request.POST if request.method == "POST" else None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                token, plaintext = do_create_agent_token(principal, name=form.cleaned_data["name"])
            except TenancyError as exc:
                add_service_error(form, exc, {"name": "name"})
            else:
                show_secret_once(request, kind="agent", label=str(token), value=plaintext)
                messages.success(request, f"Agent token “{token.name}” created.")
                return redirect("settings-agents")
        status = 400
    sort = agent_sort(request.GET.get("sort"))
    overview = agents_overview(principal, page_number(request.GET.get("page")), sort)
    secret = take_secret(request, "agent")
    response = render_settings(
        request,
        principal,
        "agents.html",
        {"overview": overview, "form": form, "secret": secret, "sort": sort, "sorts": AGENT_SORTS},
        page="settings-agents",
        status=status,
    )
    return no_store(response) if secret else response


@require_POST
@console_view(operator_only=True, admin_only=True)
def agent_token_revoke(request: HttpRequest, principal: Principal, token_id: int) -> HttpResponse:
    token = do_revoke_agent_token(principal, token_id)
    messages.success(
        request, f"Agent token “{token.name}” revoked: agents using it can no longer send data."
    )
    return redirect("settings-agents")
