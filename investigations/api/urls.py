"""Investigations routes, registered on the project's one API router (proof_web/api_urls.py)."""

from __future__ import annotations

from rest_framework.routers import BaseRouter

from investigations.api.views import (
    GpuListPriceViewSet,
    IncidentViewSet,
    RealPriceViewSet,
    VerdictViewSet,
)


def register(router: BaseRouter) -> None:
    router.register("incidents", IncidentViewSet, basename="incident")
    router.register("verdicts", VerdictViewSet, basename="verdict")
    router.register("gpu-prices", GpuListPriceViewSet, basename="gpu-price")
    router.register("real-price", RealPriceViewSet, basename="real-price")
