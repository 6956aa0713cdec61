"""The customer-facing verdict page (`/incidents/<public_id>/summary/`, signed-in customer and
operator users) and the page a share link opens (`/share/<token>/`, no sign-in).

The shared page is standalone (no console navigation, whoever opens it), read-only, and sent
with no-store, noindex and no-referrer headers: the URL is the credential, so it must not be
cached, indexed, or leaked to another site in a Referer. An unknown token is 404; an expired or
revoked link 410 (investigations.services.open_share_link reads the row on every open).
"""

from __future__ import annotations

import uuid

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from frontend.access import console_view
from frontend.selectors import share as selectors
from investigations import services
from tenants.access import Principal
from tenants.context import tenant_context


@console_view(operator_only=False)
def incident_summary(
    request: HttpRequest, principal: Principal, public_id: uuid.UUID
) -> HttpResponse:
    verdict = selectors.customer_verdict(principal, public_id)
    return render(
        request,
        "proof/console/customer_verdict.html",
        {"section": "incidents", "wide": True, "cv": verdict, "incident_id": public_id},
    )


def _private(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store, private"
    response["X-Robots-Tag"] = "noindex, nofollow, noarchive"
    response["Referrer-Policy"] = "no-referrer"
    return response


def _gone(request: HttpRequest, reason: str, status: int) -> HttpResponse:
    return _private(
        render(request, "proof/console/share_gone.html", {"reason": reason}, status=status)
    )


@require_safe
def shared_verdict(request: HttpRequest, token: str) -> HttpResponse:
    try:
        opened = services.open_share_link(
            token,
            # The peer's address as the server saw it: forwarded-for headers are the client's
            # to write unless a trusted proxy sets them, and none is configured.
            address=request.META.get("REMOTE_ADDR"),
            user_agent=str(request.META.get("HTTP_USER_AGENT", "")),
        )
    except services.ShareRefused as refused:
        return _gone(request, refused.reason, 410 if refused.gone else 404)
    link = opened.link
    with tenant_context(link.operator_id):
        try:
            verdict = selectors.customer_verdict(
                opened.reader, link.incident.public_id, operator=link.operator
            )
        except Http404:
            # The incident is no longer its job's customer's (the job was re-attributed).
            return _gone(request, "This share link no longer opens anything.", 404)
        response = render(
            request,
            "proof/console/share_verdict.html",
            {"cv": verdict, "expires_at": link.expires_at},
        )
    return _private(response)
