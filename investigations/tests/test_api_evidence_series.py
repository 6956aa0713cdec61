"""GET /api/v1/incidents/<id>/evidence-series/ on incidents the live pipeline wrote from
simulated runs: one item per evidence entry, its series read from the stored blocks over the
entry's interval ± the margin (the same lines the verdict page draws), a customer's clipped to
its job's data; another operator and another customer get 404."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from investigations import evidence_charts
from investigations.models import JobActivity
from investigations.tests.test_api_incident_actions import (
    World,
    _fresh_caches,  # noqa: F401 - the autouse fixture, applied here too
    bearer,
    session,
    world_fixture,  # noqa: F401 - the fixture `world`
)
from tenants.context import tenant_context

pytestmark = pytest.mark.django_db


def _series(client: Any, incident: Any) -> Any:
    return client.get(f"/api/v1/incidents/{incident.public_id}/evidence-series/")


def test_each_evidence_entry_gets_its_stored_series_around_its_interval(world: World) -> None:
    api = bearer(world.a.api_token(world.a.operator_support))
    with CaptureQueriesContext(connection) as queries:
        response = _series(api, world.mine)
    assert response.status_code == 200, response.content
    body = response.json()
    evidence = world.mine.verdict["evidence"]
    assert body["incident"] == str(world.mine.public_id)
    assert body["margin"] == {
        "factor": 2.0,
        "min_s": evidence_charts.MIN_PAD_S,
        "max_s": evidence_charts.MAX_PAD_S,
    }
    assert [item["evidence"] for item in body["items"]] == evidence
    drawn_from_storage = 0
    for item in body["items"]:
        chart = item["chart"]
        start, end = item["evidence"]["interval"]["start"], item["evidence"]["interval"]["end"]
        pad = min(evidence_charts.MAX_PAD_S, max(evidence_charts.MIN_PAD_S, 2 * (end - start)))
        assert chart["window"] == [round(start - pad, 3), round(end + pad, 3)]
        assert chart["interval"] == [start, end]
        assert 2 <= len(chart["x"]) <= evidence_charts.MAX_POINTS
        assert chart["x"] == sorted(chart["x"])
        for line in chart["series"]:
            assert len(line["values"]) == len(chart["x"])
        if item["source"] == "series":
            values = [v for line in chart["series"] for v in line["values"] if v is not None]
            if values:
                drawn_from_storage += 1
                assert all(math.isfinite(v) for v in values)
    # The simulated run's stored samples are what the series rows draw.
    assert drawn_from_storage >= 1
    # One catalog query, one block read, at most one events and one log query: a fixed count.
    assert len(queries.captured_queries) <= 16, len(queries.captured_queries)


def test_a_customer_sees_its_own_job_clipped_to_its_data_and_nothing_else(world: World) -> None:
    viewer = session(world.a.customer_viewer)
    response = _series(viewer, world.mine)
    assert response.status_code == 200
    op, job = world.a.operator.pk, world.mine.job_id
    assert job is not None
    with tenant_context(op):
        first, last = (
            JobActivity.objects.for_tenant(op)
            .filter(job_id=job)
            .values_list("first_data_ts", "last_data_ts")
            .get()
        )
    for item in response.json()["items"]:
        start, end = item["chart"]["interval"]
        w0, w1 = item["chart"]["window"]
        assert w0 >= min(first, start) - 1e-3 and w1 <= max(last, end) + 1e-3
    assert _series(viewer, world.theirs).status_code == 404
    assert _series(session(world.second_admin), world.mine).status_code == 404


def test_another_operator_gets_404(world: World) -> None:
    for client in (
        bearer(world.b.api_token(world.b.operator_support)),
        session(world.b.operator_admin),
    ):
        response = _series(client, world.mine)
        assert response.status_code == 404
        assert response.json()["error"]["message"] == "Not found."
    assert _series(session(world.b.operator_admin), world.other).status_code == 200
