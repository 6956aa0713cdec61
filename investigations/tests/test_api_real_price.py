"""GET /api/v1/real-price/?start=&end=: the real price over a period, of GPU time the live
pipeline accounted from simulated runs — a usage row straddling an edge counts pro rata of its
span inside; a period before any usage is empty; the job/customer/GPU filters combine with it;
bad dates are a 400 naming the parameter; customers see their own jobs only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from investigations.models import JobGpuUsage
from investigations.tests.test_api_incident_actions import (
    World,
    _fresh_caches,  # noqa: F401 - the autouse fixture, applied here too
    session,
    world_fixture,  # noqa: F401 - the fixture `world`
)
from tenants.context import tenant_context

pytestmark = pytest.mark.django_db


def _price(client: APIClient, query: str) -> Any:
    response = client.get(f"/api/v1/real-price/{query}")
    assert response.status_code == 200, response.content
    return response.json()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(world: World) -> tuple[float, float, float]:
    """(first sample, last sample, GPU-hours) of the operator's accounted usage."""
    op = world.a.operator.pk
    with tenant_context(op):
        rows = list(
            JobGpuUsage.objects.for_tenant(op).values_list("first_ts", "last_ts", "gpu_seconds")
        )
    assert rows, "the pipeline accounted the simulated runs' GPU time"
    firsts = [r[0] for r in rows if r[0] is not None]
    lasts = [r[1] for r in rows if r[1] is not None]
    return min(firsts), max(lasts), sum(r[2] for r in rows) / 3600


def test_a_period_counts_the_usage_inside_it(world: World) -> None:
    api = session(world.a.operator_admin)
    first, last, hours = _span(world)
    everything = _price(api, "")
    assert everything["gpu_hours"] == pytest.approx(hours, abs=1e-5)
    today = datetime.now(UTC).date()
    whole = _price(api, f"?start={today - timedelta(days=1)}&end={today}")
    assert whole["gpu_hours"] == pytest.approx(hours, abs=1e-5)
    assert whole["start"] == f"{today - timedelta(days=1)}T00:00:00+00:00"
    assert whole["end"] == f"{today + timedelta(days=1)}T00:00:00+00:00"  # end: the whole day
    assert whole["productive_share"] == pytest.approx(everything["productive_share"], rel=1e-6)
    # The later part of the span: only that share of it (rows are spread evenly over theirs).
    middle = first + (last - first) / 2
    later = _price(api, f"?start={_iso(middle)}")
    assert 0.2 * hours < later["gpu_hours"] < 0.8 * hours
    earlier = _price(api, f"?start={_iso(first - 3600)}&end={_iso(middle)}")
    assert earlier["gpu_hours"] + later["gpu_hours"] == pytest.approx(hours, rel=0.02)
    before_any = _price(api, "?start=2020-01-01&end=2020-01-02")
    assert before_any["gpu_hours"] == 0 and before_any["productive_share"] is None


def test_the_period_combines_with_the_job_and_customer_filters(world: World) -> None:
    api = session(world.a.operator_admin)
    job = world.mine.verdict["subject"]["job"]
    today = datetime.now(UTC).date()
    one_job = _price(api, f"?job={job}&start={today}")
    assert one_job["job"] == job and one_job["gpu_hours"] > 0
    fleet = _price(api, f"?start={today}")
    assert one_job["gpu_hours"] < fleet["gpu_hours"]  # a's second customer's job is in the fleet
    # A customer's own price: its job's, whatever it asks for.
    customer = _price(session(world.a.customer_viewer), f"?start={today}")
    assert customer["gpu_hours"] == pytest.approx(one_job["gpu_hours"], rel=1e-9)
    theirs = world.theirs.verdict["subject"]["job"]
    assert (
        session(world.a.customer_viewer).get(f"/api/v1/real-price/?job={theirs}").status_code == 404
    )
    other = world.other.verdict["subject"]["job"]
    assert api.get(f"/api/v1/real-price/?job={other}&start={today}").status_code == 404


def test_bad_dates_are_a_400_naming_the_parameter(world: World) -> None:
    api = session(world.a.operator_admin)
    for query, name in (
        ("?start=last-week", "start"),
        ("?start=2026-02-30", "start"),
        ("?start=2026-12-01&end=soon", "end"),
        ("?start=2026-12-02&end=2026-12-01", "end"),
        ("?end=2026-12-01", "start"),
        ("?start=2020-01-01&end=2026-01-01", "end"),
    ):
        response = api.get(f"/api/v1/real-price/{query}")
        assert response.status_code == 400, query
        assert name in response.json()["error"]["fields"], (query, response.json())
