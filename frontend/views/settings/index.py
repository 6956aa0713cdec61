"""/settings/: the list of settings pages this admin has."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from frontend.access import console_view
from frontend.views.settings.common import render_settings
from tenants.access import Principal


@console_view(admin_only=True)
def settings_index(request: HttpRequest, principal: Principal) -> HttpResponse:
    return render_settings(request, principal, "index.html", {}, page="index")
