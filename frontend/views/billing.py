"""/settings/billing/: this month's GPUs and projected invoice, past invoices, the usage behind
each line (per GPU: days, nodes; per day: the meter reports sent to Stripe), the operator's
chargeback per customer (CSV), the Stripe customer portal when Stripe is configured. Operator
admins only: a customer user, a support user and another operator get 404."""

from __future__ import annotations

from datetime import date

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from billing import selectors as billing_selectors
from billing.pricing import parse_month
from billing.stripe_sync import portal_url
from frontend.access import console_view
from frontend.selectors.settings import BadParameter
from frontend.views.settings.common import answers_bad_parameters, render_settings
from tenants.access import Principal


def _month(request: HttpRequest) -> date | None:
    raw = request.GET.get("month")
    if not raw:
        return None
    try:
        return parse_month(raw)
    except ValueError as exc:
        raise BadParameter("month", str(exc)) from None


# A GPU's NVML UUID as stored (DailyUsage.gpu).
_AFTER_MAX = 96


def _after(request: HttpRequest) -> str:
    """`?after=`: the GPU (UUID) the page of usage lines starts after; empty: the first page."""
    raw = request.GET.get("after", "")
    if len(raw) > _AFTER_MAX:
        raise BadParameter("after", f"a GPU UUID of at most {_AFTER_MAX} characters")
    return raw


@require_GET
@console_view(operator_only=True, admin_only=True)
@answers_bad_parameters
def billing_settings(request: HttpRequest, principal: Principal) -> HttpResponse:
    month = _month(request)
    page = billing_selectors.billing_page(principal, month, after=_after(request))
    return render_settings(
        request,
        principal,
        "billing.html",
        {
            "billing": page,
            "stripe_configured": bool(settings.BILLING_STRIPE_SECRET_KEY),
            "grace_days": settings.BILLING_GRACE_DAYS,
        },
        page="settings-billing",
    )


@require_GET
@console_view(operator_only=True, admin_only=True)
@answers_bad_parameters
def billing_chargeback_csv(request: HttpRequest, principal: Principal) -> HttpResponse:
    month = _month(request) or billing_selectors.current_month()
    body = billing_selectors.chargeback_csv(principal, month)
    response = HttpResponse(body, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="chargeback-{month:%Y-%m}.csv"'
    return response


@require_POST
@console_view(operator_only=True, admin_only=True)
def billing_portal(request: HttpRequest, principal: Principal) -> HttpResponse:
    url = portal_url(principal.operator_id, request.build_absolute_uri(reverse("settings-billing")))
    if url is None:
        return redirect("settings-billing")
    return redirect(url)
