"""Tenancy routes, registered on the project's one API router (proof_web/api_urls.py)."""

from __future__ import annotations

from rest_framework.routers import BaseRouter

from tenants.api import audit, views
from tenants.api.base import register_viewsets


def register(router: BaseRouter) -> None:
    register_viewsets(
        router,
        views.CustomerViewSet,
        views.ApiTokenViewSet,
        views.AgentTokenViewSet,
        views.JobMappingRuleViewSet,
        audit.AuditLogViewSet,
    )
