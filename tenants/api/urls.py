"""Tenancy routes, registered on the project's one API router (proof_web/api_urls.py)."""

from __future__ import annotations

from rest_framework.routers import BaseRouter

from tenants.api.views import (
    AgentTokenViewSet,
    ApiTokenViewSet,
    CustomerViewSet,
    JobMappingRuleViewSet,
)


def register(router: BaseRouter) -> None:
    router.register("customers", CustomerViewSet, basename="customer")
    router.register("api-tokens", ApiTokenViewSet, basename="api-token")
    router.register("agent-tokens", AgentTokenViewSet, basename="agent-token")
    router.register("job-mapping-rules", JobMappingRuleViewSet, basename="job-mapping-rule")
