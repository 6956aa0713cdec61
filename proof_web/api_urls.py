"""REST API v1: each app registers its viewsets on this one router."""

from rest_framework.routers import DefaultRouter

router = DefaultRouter()

urlpatterns = router.urls
