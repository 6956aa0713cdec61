"""Investigations routes, registered on the project's one API router (proof_web/api_urls.py)."""

from __future__ import annotations

from rest_framework.routers import BaseRouter

from investigations.api import fleet, forecast, jobs, metrics, questions, share_links, views
from tenants.api.base import register_viewsets


def register(router: BaseRouter) -> None:
    register_viewsets(
        router,
        views.IncidentViewSet,
        views.VerdictViewSet,
        views.GpuListPriceViewSet,
        views.RealPriceViewSet,
    )
    register_viewsets(router, share_links.ShareLinkViewSet)
    # Verdicts for Prometheus alerting and Grafana annotations (investigations/api/metrics.py).
    register_viewsets(router, metrics.VerdictMetricsViewSet, metrics.GrafanaAnnotationsViewSet)
    register_viewsets(
        router, jobs.JobViewSet, fleet.NodeViewSet, fleet.GpuViewSet, fleet.FleetHealthViewSet
    )
    # The days-ahead forecast and its drain advice (docs/fleet-health.md).
    register_viewsets(router, forecast.ForecastViewSet, forecast.DrainPlanViewSet)
    # Nested under the incident: its route is a pattern, so it is named by hand.
    router.register(
        questions.QuestionViewSet.route, questions.QuestionViewSet, basename="incident-question"
    )
