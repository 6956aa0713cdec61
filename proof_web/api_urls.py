"""REST API v1: each app registers its viewsets on this one router."""

from rest_framework.routers import DefaultRouter

from investigations.api.urls import register as register_investigations
from notify.api.urls import register as register_notify
from tenants.api.urls import register as register_tenants

router = DefaultRouter()
register_tenants(router)
register_investigations(router)
register_notify(router)

urlpatterns = router.urls
