"""REST API v1: each app registers its viewsets on this one router."""

from rest_framework.routers import DefaultRouter

from tenants.api.urls import register as register_tenants

router = DefaultRouter()
register_tenants(router)

urlpatterns = router.urls
