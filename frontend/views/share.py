"""The customer-facing verdict page (`/incidents/<public_id>/summary/`, signed-in customer and
operator users) and the page a share link opens (`/share/<token>/`, no sign-in).

On the summary page, operator roles and customer admins (with write access) see the incident's
share links with their open counts, make one (the URL is shown once, kept in the server-side
session for the next page only) and revoke one (POST, CSRF-checked); customer viewers see none.

The shared page is standalone (no console navigation, whoever opens it), read-only, and sent
with no-store, noindex and no-referrer headers: the URL is the credential, so it must not be
cached, indexed, or leaked to another site in a Referer. An unknown token is 404; an expired or
revoked link 410 (investigations.services.open_share_link reads the row on every open).
"""

from __future__ import annotations

import uuid

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from frontend.access import console_view
from frontend.selectors import share as selectors
from frontend.views.settings.common import no_store, show_secret_once, take_secret
from investigations import services
from tenants.access import Principal
from tenants.context import tenant_context
from tenants.services import NotAllowed

SECRET_KIND = "share-link"  # noqa: S105 - the session slot's name, not a secret


@require_safe
@console_view(operator_only=False)
def incident_summary(
    request: HttpRequest, principal: Principal, public_id: uuid.UUID
) -> HttpResponse:
    verdict = selectors.customer_verdict(principal, public_id)
    links = selectors.share_links_of(principal, verdict.detail.incident.pk)
    new_link = take_secret(request, SECRET_KIND) if selectors.may_share(principal) else None
    response = render(
        request,
        "proof/console/customer_verdict.html",
        {
            "section": "incidents",
            "wide": True,
            "cv": verdict,
            "incident_id": public_id,
            "may_share": selectors.may_share(principal),
            "links": links,
            "durations": selectors.SHARE_DURATIONS,
            "new_link": new_link,
        },
    )
    return no_store(response) if new_link else response


@require_POST
@console_view(operator_only=False)
def share_link_create(
    request: HttpRequest, principal: Principal, public_id: uuid.UUID
) -> HttpResponse:
    raw = request.POST.get("expires_in_s", "").strip()
    allowed = {str(seconds) for seconds, _ in selectors.SHARE_DURATIONS}
    if raw not in allowed:
        return HttpResponseBadRequest(
            f"expires_in_s: {raw[:20]!r} is not one of {', '.join(sorted(allowed, key=int))}"
        )
    try:
        _link, token = services.do_create_share_link(
            principal, incident=public_id, expires_in_s=int(raw)
        )
    except NotAllowed:
        raise Http404("No such page.") from None
    url = request.build_absolute_uri(reverse("share", args=[token]))
    show_secret_once(request, kind=SECRET_KIND, label="share link", value=url)
    return redirect("incident-summary", public_id=public_id)


@require_POST
@console_view(operator_only=False)
def share_link_revoke(
    request: HttpRequest, principal: Principal, public_id: uuid.UUID, link_id: int
) -> HttpResponse:
    try:
        services.do_revoke_share_link(principal, link_id)
    except NotAllowed:
        raise Http404("No such page.") from None
    return redirect("incident-summary", public_id=public_id)


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
