"""What every settings page shares: the page frame, 400 for bad query parameters, service
refusals shown as field errors, and secrets shown exactly once after a redirect."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps
from typing import Any, Concatenate, ParamSpec

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.selectors.settings import BadParameter
from tenants.access import Principal
from tenants.services import NotAllowed

P = ParamSpec("P")

SECRET_SESSION_KEY = "proof_settings_secret"  # noqa: S105 - a session key name, not a secret


def settings_links(principal: Principal) -> list[tuple[str, str]]:
    """(URL name, label) of the settings pages this admin has."""
    links = [("settings-users", "Users and roles"), ("settings-api-tokens", "API tokens")]
    if principal.is_operator:
        links = [
            ("settings-customers", "Customers"),
            ("settings-rules", "Job mapping"),
            ("settings-agents", "Agents"),
            ("settings-prices", "GPU list prices"),
            *links,
        ]
        if principal.is_admin:
            links.append(("settings-billing", "Billing"))
            links.append(("settings-audit", "Audit log"))
    return links


def render_settings(
    request: HttpRequest,
    principal: Principal,
    template: str,
    context: dict[str, Any],
    *,
    page: str,
    status: int = 200,
) -> HttpResponse:
    context = {
        "section": "settings",
        "settings_page": page,
        "settings_links": settings_links(principal),
        **context,
    }
    return render(request, f"proof/console/settings/{template}", context, status=status)


def answers_bad_parameters(
    view: Callable[Concatenate[HttpRequest, Principal, P], HttpResponse],
) -> Callable[Concatenate[HttpRequest, Principal, P], HttpResponse]:
    """A BadParameter raised while reading the page is a 400 naming the parameter."""

    @wraps(view)
    def wrapped(
        request: HttpRequest, principal: Principal, /, *args: P.args, **kwargs: P.kwargs
    ) -> HttpResponse:
        try:
            return view(request, principal, *args, **kwargs)
        except BadParameter as exc:
            return render_settings(
                request,
                principal,
                "bad_parameter.html",
                {"parameter": exc.name, "message": str(exc)},
                page="",
                status=400,
            )

    return wrapped


def add_service_error(form: forms.Form, exc: Exception, field_words: dict[str, str]) -> None:
    """Put a service's error on the field its message is about (the first of `field_words`,
    field -> a word the message would contain), else on the form as a whole. The services
    quote the values they refuse ('…'), so the words are looked for outside the quotes: a
    posted value never decides which field the error lands on."""
    message = str(exc)
    if isinstance(exc, NotAllowed):  # a refusal of who is asking, not of a value posted
        form.add_error(None, message)
        return
    unquoted = re.sub(r"'[^']*'", "", message)
    for field, word in field_words.items():
        if word in unquoted and field in form.fields:
            form.add_error(field, message)
            return
    form.add_error(None, message)


def show_secret_once(request: HttpRequest, *, kind: str, label: str, value: str) -> None:
    """Keep a new secret for the next page only. The session lives server-side (database
    sessions), unlike a message, which may ride in a cookie."""
    request.session[SECRET_SESSION_KEY] = {"kind": kind, "label": label, "value": value}


def take_secret(request: HttpRequest, kind: str) -> dict[str, str] | None:
    """The secret kept for this page, removed so that a reload no longer shows it."""
    secret: dict[str, str] | None = request.session.get(SECRET_SESSION_KEY)
    if secret is None or secret.get("kind") != kind:
        return None
    del request.session[SECRET_SESSION_KEY]
    return secret


def no_store(response: HttpResponse) -> HttpResponse:
    """A page showing a secret is never cached, by the browser or a proxy."""
    response["Cache-Control"] = "no-store"
    return response
