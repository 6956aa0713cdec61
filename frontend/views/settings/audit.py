"""/settings/audit/: the operator's audit log and its customer-page views (operator admins)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from frontend.access import console_view
from frontend.selectors.audit import KINDS, audit_kind, audit_page
from frontend.selectors.settings import page_number
from frontend.views.settings.common import answers_bad_parameters, render_settings
from tenants.access import Principal


@require_GET
@console_view(operator_only=True, admin_only=True)
@answers_bad_parameters
def audit_log(request: HttpRequest, principal: Principal) -> HttpResponse:
    kind = audit_kind(request.GET.get("kind"))
    page = audit_page(principal, kind, page_number(request.GET.get("page")))
    return render_settings(
        request,
        principal,
        "audit.html",
        {
            "audit": page,
            "page": page.views if page.events is None else page.events,
            "views_rows": page.views.rows if page.views is not None else page.recent_views,
            "kinds": [(key, label) for key, (label, _) in KINDS.items()],
            "extra_query": urlencode({"kind": kind}) if kind != "all" else "",
        },
        page="settings-audit",
    )
