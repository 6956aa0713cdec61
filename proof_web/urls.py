from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("proof_web.api_urls")),
    # Stripe's webhooks (docs/billing.md): signed by Stripe, outside the tenant-scoped API.
    path("billing/", include("billing.urls")),
    path("", include("frontend.urls")),
]
