"""The days-ahead forecast on real PostgreSQL: rollup rows as ingest's rollup task leaves them
(a GPU whose single-bit errors grow day by day with warning XIDs, a GPU with an old flat count,
an IB port that recovers, a GPU that moved node), a forecast pass (investigations.
forecast_services), the stored rows, the level-crossing announcement, the recovery clearing,
and /api/v1/forecasts/ and /api/v1/drain-plan/: operators only, a customer of the operator
(and of another customer) refused, another operator's rows absent."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from rest_framework.test import APIClient

from contract import signals
from ingest.models import Event, Gpu, Job, Node, Process, Series, SeriesRollup
from investigations import forecast_services
from investigations.models import ComponentForecast
from tenants.context import tenant_context
from tenants.testing import Tenant, make_second_customer, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("fca", "fcb")
HOUR_MS = 3_600_000
NOW = 1_767_225_600.0 + 20 * 86400  # 2026-01-21 00:00 UTC
DAYS = 14
SBE = signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL


def _series(operator_id: int, node: Node, name: str, gpu: str = "", **labels: str) -> Series:
    key = hashlib.sha256(f"{node.hostname}/{gpu}/{name}/{labels}".encode()).hexdigest()[:32]
    return Series.objects.create(
        operator_id=operator_id, key_hash=key, name=name, node=node, gpu=gpu, labels=labels
    )


def _counter(
    operator_id: int, series: Series, per_hour: np.ndarray, start_ms: int, base: float
) -> None:
    """Rollup rows of a cumulative counter increasing by per_hour[i] in hour i (NaN: no data)."""
    rows = []
    value = base
    for i, inc in enumerate(per_hour):
        if not np.isfinite(inc):
            continue
        rows.append(
            SeriesRollup(
                operator_id=operator_id,
                series=series,
                bucket_start_ms=start_ms + i * HOUR_MS,
                count=60,
                min=value,
                max=value + inc,
                sum=60 * value,
                first=value,
                last=value + inc,
            )
        )
        value += inc
    SeriesRollup.objects.bulk_create(rows)


def _daily_to_hourly(per_day: list[float]) -> np.ndarray:
    return np.repeat(np.asarray(per_day, dtype=np.float64) / 24.0, 24)


def _world(t: Tenant, degrading: bool = True) -> dict[str, Any]:
    op = t.operator.pk
    start_ms = int(NOW * 1000) - int(NOW * 1000) % HOUR_MS + HOUR_MS - DAYS * 24 * HOUR_MS
    with tenant_context(op):
        n1 = Node.objects.create(operator_id=op, hostname=f"{t.operator.slug}-node-1")
        n2 = Node.objects.create(operator_id=op, hostname=f"{t.operator.slug}-node-2")
        bad, flat, mover = (f"GPU-{t.operator.slug}-{x}" for x in ("bad", "flat", "mover"))
        for uuid, node in ((bad, n1), (flat, n1), (mover, n2)):
            Gpu.objects.create(operator_id=op, uuid=uuid, node=node, model="H100")
        quiet = [2.0] * (DAYS - 6)
        if degrading:
            sbe = _daily_to_hourly([*quiet, 40, 90, 200, 450, 1000, 2200])
        else:
            sbe = _daily_to_hourly([2.0] * DAYS)
        _counter(op, _series(op, n1, SBE, bad), sbe, start_ms, 5000.0)
        # An old count that stays flat: never an increase.
        _counter(op, _series(op, n1, SBE, flat), np.zeros(DAYS * 24), start_ms, 90_000.0)
        # A GPU that moved from node-1 to node-2 a week ago: two series, the second starting
        # from the GPU's persistent count; a driver reload zeroed its volatile counter.
        half = DAYS * 24 // 2
        before = np.full(DAYS * 24, np.nan)
        before[:half] = 0.1
        after = np.full(DAYS * 24, np.nan)
        after[half + 6 :] = 0.1
        _counter(op, _series(op, n1, SBE, mover), before, start_ms, 70_000.0)
        _counter(op, _series(op, n2, SBE, mover), after, start_ms + (half + 6) * HOUR_MS, 0.0)
        if degrading:
            day0 = start_ms + (DAYS - 4) * 24 * HOUR_MS
            Event.objects.bulk_create(
                Event(
                    operator_id=op,
                    node=n1,
                    gpu=bad,
                    gpu_index=0,
                    ts_us=(day0 + day * 24 * HOUR_MS + k * (24 * HOUR_MS // count)) * 1000,
                    name=signals.EVENT_XID,
                    value=92.0,
                    text="Xid 92: High single-bit ECC error rate",
                )
                # Growing warnings: 3, 7, 15 and 30 a day over the last four days.
                for day, count in enumerate((3, 7, 15, 30))
                for k in range(count)
            )
        # A running two-node job on both nodes: the drain plan groups them.
        now_dt = datetime.fromtimestamp(NOW, tz=UTC)
        job = Job.objects.create(
            operator_id=op,
            job_id="train-42",
            state="running",
            first_seen_at=now_dt,
            last_seen_at=now_dt,
        )
        for pid, node, gpu in ((11, n1, bad), (12, n2, mover)):
            Process.objects.create(
                operator_id=op,
                node=node,
                pid=pid,
                job=job,
                gpu=gpu,
                first_seen_at=now_dt,
                last_seen_at=now_dt,
            )
    return {"bad": bad, "flat": flat, "mover": mover, "n1": n1.hostname, "n2": n2.hostname}


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_a_pass_flags_the_degrading_gpu_with_evidence_and_announces_it_once(a: Tenant) -> None:
    w = _world(a)
    heard: list[tuple[str, str]] = []

    def on_cross(sender: Any, *, forecast: ComponentForecast, previous: str, **kw: Any) -> None:
        heard.append((forecast.key, previous))

    forecast_services.forecast_level_crossed.connect(on_cross, weak=False)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("django.db.transaction.on_commit", lambda fn, robust=False: fn())
            result = forecast_services.run_forecast_pass(a.operator.pk, now=NOW)
            again = forecast_services.run_forecast_pass(a.operator.pk, now=NOW + 3600)
    finally:
        forecast_services.forecast_level_crossed.disconnect(on_cross)
    assert result.crossed == [f"gpu:{w['bad']}"]
    assert again.crossed == []  # still flagged: no second announcement
    assert heard == [(w["bad"], "ok")]
    with tenant_context(a.operator.pk):
        rows = {r.key: r for r in ComponentForecast.objects.for_tenant(a.operator.pk)}
    assert set(rows) == {w["bad"]}  # the flat count and the moved GPU are not flagged
    row = rows[w["bad"]]
    assert row.level in ("drain", "urgent") and row.node == w["n1"]
    assert row.risk_7d >= 0.5 and row.ttf_hours is not None and row.ttf_hours < 7 * 24
    signs = {e["signal"]: e for e in row.result["evidence"]}
    assert signs[SBE]["now"] == pytest.approx(2200.0, rel=0.05)  # the last 24 h
    assert "xid_warnings" in signs
    warned = row.result["daily"]["xid_warnings"]
    # (the row is the second pass's, an hour later: its days end an hour later)
    assert sum(warned[:-5]) == 0 and 50 <= sum(warned) <= 55  # of the 55 stored
    assert "heading for XID 48" in row.summary
    assert len(row.result["daily"][SBE]) == DAYS


def test_recovery_clears_the_component(a: Tenant) -> None:
    w = _world(a)
    forecast_services.run_forecast_pass(a.operator.pk, now=NOW)
    # Three days later with no new errors stored: the sign is gone.
    later = forecast_services.run_forecast_pass(a.operator.pk, now=NOW + 3 * 86400)
    assert f"gpu:{w['bad']}" in later.cleared
    with tenant_context(a.operator.pk):
        row = ComponentForecast.objects.for_tenant(a.operator.pk).get(key=w["bad"])
    assert row.level == "ok" and row.cleared_at is not None


def test_api_lists_forecasts_and_the_drain_plan_for_operators_only(a: Tenant, b: Tenant) -> None:
    w = _world(a)
    _world(b)
    forecast_services.run_forecast_pass(a.operator.pk, now=NOW)
    forecast_services.run_forecast_pass(b.operator.pk, now=NOW)
    answer = _client(a.operator_admin).get("/api/v1/forecasts/")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    rows = body["results"] if isinstance(body, dict) else body
    assert [r["key"] for r in rows] == [w["bad"]]  # b's GPU of the same shape is not listed
    assert rows[0]["evidence"][0]["threshold"] > 0
    assert _client(a.operator_support).get("/api/v1/forecasts/?kind=gpu").status_code == 200
    bad_kind = _client(a.operator_admin).get("/api/v1/forecasts/?kind=disk")
    assert bad_kind.status_code == 400 and "kind" in bad_kind.content.decode()
    plan = _client(a.operator_admin).get("/api/v1/drain-plan/")
    assert plan.status_code == 200, plan.content
    groups = plan.json()["groups"]
    assert len(groups) == 1 and groups[0]["nodes"] == [w["n1"]]
    assert groups[0]["jobs"] == ["train-42"]
    assert groups[0]["wait_cost_gpu_hours"] >= 0
    _, second_admin = make_second_customer(a)
    for user in (a.customer_admin, a.customer_viewer, second_admin):
        for url in ("/api/v1/forecasts/", "/api/v1/drain-plan/"):
            assert _client(user).get(url).status_code in (403, 404), (user.username, url)
