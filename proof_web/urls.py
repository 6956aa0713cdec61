from django.contrib import admin
from django.urls import include, path

from tenants.login_throttle import ThrottledAdminAuthenticationForm, throttled_login

# The staff admin's sign-in shares the console's throttle and lockout (tenants/login_throttle.py);
# the admin itself refuses anyone not active staff (its form, and has_permission on every page).
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    # Before the admin's own patterns, so that /admin/login/ is the throttled one.
    path("admin/login/", throttled_login(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/v1/", include("proof_web.api_urls")),
    # Stripe's webhooks (docs/billing.md): signed by Stripe, outside the tenant-scoped API.
    path("billing/", include("billing.urls")),
    path("", include("frontend.urls")),
]
