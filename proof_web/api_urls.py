"""REST API v1: each app registers its viewsets on this one router; the OpenAPI schema and
Swagger UI (assets from Proof's own static files) sit beside them."""

from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from investigations.api.urls import register as register_investigations
from notify.api.urls import register as register_notify
from tenants.api.errors import UNKNOWN_ENDPOINT, unknown_endpoint
from tenants.api.urls import register as register_tenants

router = DefaultRouter()
register_tenants(router)
register_investigations(router)
register_notify(router)

urlpatterns = [
    # Anonymous may read both: the schema describes the API, it holds no tenant data.
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script from ?script, not inline: the page keeps to
    # the Content-Security-Policy (tenants/csp.py).
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    *router.urls,
    # Last: any other path under /api/v1/ is a 404 in the API's one error shape.
    re_path(r"^(?P<rest>.*)$", unknown_endpoint, name=UNKNOWN_ENDPOINT),
]
