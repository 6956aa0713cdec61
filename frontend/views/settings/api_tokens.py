"""/settings/api-tokens/: REST API tokens (operator admins: every token of the operator;
customer admins: their customer's)."""

from __future__ import annotations

from datetime import UTC, datetime, time

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from frontend.access import console_view
from frontend.forms.settings import ApiTokenForm
from frontend.selectors.settings import api_tokens_page, customer_choices, page_number
from frontend.views.settings.common import (
    add_service_error,
    answers_bad_parameters,
    no_store,
    render_settings,
    show_secret_once,
    take_secret,
)
from tenants.access import Principal
from tenants.services import TenancyError, do_create_api_token, do_revoke_api_token


@require_http_methods(["GET", "POST"])
@console_view(admin_only=True)
@answers_bad_parameters
def api_tokens(request: HttpRequest, principal: Principal) -> HttpResponse:
    choices = customer_choices(principal) if principal.is_operator else []
    form = ApiTokenForm(
        request.POST if request.method == "POST" else None, principal=principal, customers=choices
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            expires_on = data.get("expires_on")
            try:
                token, plaintext = do_create_api_token(
                    principal,
                    name=data["name"],
                    scope=data["scope"],
                    customer_id=form.customer_id(),
                    expires_at=(
                        None
                        if expires_on is None
                        else datetime.combine(expires_on, time.min, tzinfo=UTC)
                    ),
                )
            except TenancyError as exc:
                add_service_error(form, exc, {"customer": "customer", "name": "name"})
            else:
                show_secret_once(request, kind="api", label=str(token), value=plaintext)
                messages.success(request, f"API token “{token.name}” created.")
                return redirect("settings-api-tokens")
        status = 400
    page = api_tokens_page(principal, page_number(request.GET.get("page")))
    secret = take_secret(request, "api")
    response = render_settings(
        request,
        principal,
        "api_tokens.html",
        {"page": page, "form": form, "secret": secret},
        page="settings-api-tokens",
        status=status,
    )
    return no_store(response) if secret else response


@require_POST
@console_view(admin_only=True)
def api_token_revoke(request: HttpRequest, principal: Principal, token_id: int) -> HttpResponse:
    token = do_revoke_api_token(principal, token_id)
    messages.success(request, f"API token “{token.name}” revoked.")
    return redirect("settings-api-tokens")
