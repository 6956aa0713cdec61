"""The forecast pass (docs/fleet-health.md): read the operator's hourly rollups of the last
LOOKBACK_DAYS, build one batch per component kind, run engine.forecast, and keep one
ComponentForecast row per component that is (or was) flagged. A component that crosses up
into drain or urgent is announced (`forecast_level_crossed`, after commit); one whose signs
stopped goes back to ok with `cleared_at`, so nothing stays flagged after a recovery."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np
from django.db import transaction
from django.dispatch import Signal

from contract import signals
from engine import drain
from engine import forecast as fc
from investigations import forecast_selectors as sel
from investigations.models import ComponentForecast
from tenants.context import tenant_context

HOUR_MS = 3_600_000
# Sent after the pass commits, once per component that rose into drain or urgent, with
# `operator_id`, `forecast` (the row) and `previous` (its level before). Notification
# channels subscribe to it (docs/fleet-health.md, "Notifications").
forecast_level_crossed = Signal()
# Sent inside the pass's transaction, right after the row of a component that rose into drain
# or urgent is saved, with the same arguments: for subscribers that must write in that
# transaction (notify's outbox, notify/receivers.py), so the rows they write commit with the
# forecast or roll back with it. Each receiver writes in a savepoint: one that raises is logged
# (send_robust) and the pass goes on.
forecast_crossed_in_transaction = Signal()
NOTIFY_LEVELS = ("drain", "urgent")


@dataclass
class PassResult:
    components: int
    flagged: int
    crossed: list[str]
    cleared: list[str]
    cpu_s: float


def _hour_index(bucket_ms: int, start_ms: int) -> int:
    return (bucket_ms - start_ms) // HOUR_MS


def _dense(rows: list[sel.RollupRow], start_ms: int, hours: int, field: str) -> np.ndarray:
    out = np.full(hours, np.nan)
    for r in rows:
        i = _hour_index(r.bucket_start_ms, start_ms)
        if 0 <= i < hours:
            out[i] = getattr(r, field)
    return out


def _nansum_rows(arrs: list[np.ndarray]) -> np.ndarray:
    stack = np.vstack(arrs)
    seen = np.isfinite(stack).any(axis=0)
    return np.where(seen, np.nansum(stack, axis=0), np.nan)


def build_batches(
    rows: list[sel.RollupRow], xids: list[tuple[str, int]], start_ms: int, hours: int
) -> dict[str, fc.ComponentBatch]:
    """Batches per kind from rollup rows: each series' counter increases (its resets handled
    on its own), summed per component over its series — a GPU that moved node has one series
    per node, and none of its old count is an increase on the new one."""
    by_series: dict[int, list[sel.RollupRow]] = {}
    for r in rows:
        by_series.setdefault(r.series_id, []).append(r)
    # component (kind, key) -> signal -> list of hourly arrays; node = newest series' node
    parts: dict[tuple[str, str], dict[str, list[np.ndarray]]] = {}
    node_of: dict[tuple[str, str], tuple[int, str]] = {}
    remaps_level: dict[str, float] = {}
    peer_parts: dict[tuple[str, str], list[tuple[str, str, np.ndarray]]] = {}
    kind_of_gpu_signal = {
        signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: "gpu",
        signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: "gpu",
        signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS: "gpu",
        signals.DCGM_FI_DEV_GPU_TEMP: "gpu",
        signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: "gpu",
        signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: "pcie",
        signals.DCGM_FI_DEV_PCIE_LINK_WIDTH: "pcie",
        signals.DCGM_FI_DEV_PCIE_LINK_GEN: "pcie",
        signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "nvlink",
    }
    for series in by_series.values():
        r0 = series[0]
        if r0.name in sel.IB_COUNTERS:
            key = f"{r0.node}/{r0.labels.get('device', '')}/{r0.labels.get('port', '')}"
            comp = ("ib_port", key)
        elif r0.gpu and r0.name in kind_of_gpu_signal:
            comp = (kind_of_gpu_signal[r0.name], r0.gpu)
        else:
            continue
        newest = series[-1].bucket_start_ms
        if comp not in node_of or node_of[comp][0] < newest:
            node_of[comp] = (newest, r0.node)
        name = r0.name
        if name in (*sel.GPU_COUNTERS, *sel.IB_COUNTERS):
            first = _dense(series, start_ms, hours, "first")[None, :]
            last = _dense(series, start_ms, hours, "last")[None, :]
            value = fc.counter_increase(first, last)[0]
            if name == signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS:
                remaps_level[r0.gpu] = max(remaps_level.get(r0.gpu, 0.0), series[-1].last)
        elif name == signals.DCGM_FI_DEV_GPU_TEMP:
            name, value = fc.TEMP_EXCESS, _dense(series, start_ms, hours, "max")
        elif name == signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS:
            name = fc.THROTTLE_HOURS
            value = fc.throttled_hours(_dense(series, start_ms, hours, "max")[None, :])[0]
        else:  # link width/gen: a drop in either is the sign; width is the one stored
            if name == signals.DCGM_FI_DEV_PCIE_LINK_GEN:
                continue
            name, value = fc.LINK_WIDTH, _dense(series, start_ms, hours, "min")
        if name in fc.PEER_GAUGES:
            peer_parts.setdefault(comp, []).append((r0.node, name, value))
            continue
        parts.setdefault(comp, {}).setdefault(name, []).append(value)
    # The peer-relative gauges (temperature, throttling) only from the series of the node the
    # component is on now: a GPU that moved is not compared with its new neighbours over
    # the days it ran elsewhere.
    for comp, gauges in peer_parts.items():
        for node, name, value in gauges:
            if node == node_of[comp][1]:
                parts.setdefault(comp, {}).setdefault(name, []).append(value)
    for gpu, bucket in xids:
        comp = ("gpu", gpu)
        if comp not in node_of:
            continue
        i = _hour_index(bucket, start_ms)
        if 0 <= i < hours:
            arrs = parts.setdefault(comp, {}).setdefault(fc.XID_WARNINGS, [np.zeros(hours)])
            arrs[0][i] += 1.0
    out: dict[str, fc.ComponentBatch] = {}
    end_ts = (start_ms + hours * HOUR_MS) / 1000.0
    for kind in fc.KINDS:
        comps = sorted(c for c in parts if c[0] == kind)
        if not comps:
            continue
        hourly: dict[str, np.ndarray] = {}
        names = {n for c in comps for n in parts[c]}
        for name in names:
            hourly[name] = np.vstack(
                [
                    _nansum_rows(parts[c][name]) if name in parts[c] else np.full(hours, np.nan)
                    for c in comps
                ]
            )
        level = None
        if kind == "gpu":
            level = {
                signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: np.array(
                    [remaps_level.get(c[1], 0.0) for c in comps]
                )
            }
        out[kind] = fc.build_batch(
            kind, [c[1] for c in comps], [node_of[c][1] for c in comps], end_ts, hourly, level
        )
    return out


def _announce(operator_id: int, row: ComponentForecast, previous: str) -> None:
    forecast_level_crossed.send_robust(
        ComponentForecast, operator_id=operator_id, forecast=row, previous=previous
    )


def run_forecast_pass(operator_id: int, now: float | None = None) -> PassResult:
    """One pass over the operator's fleet; returns what it found and changed."""
    c0 = time.process_time()
    now = time.time() if now is None else now
    end_ms = int(now * 1000) - int(now * 1000) % HOUR_MS + HOUR_MS  # the current hour counts
    hours = fc.LOOKBACK_DAYS * fc.HOURS_PER_DAY
    start_ms = end_ms - hours * HOUR_MS
    with tenant_context(operator_id):
        rows = sel.rollup_rows(operator_id, start_ms, end_ms)
        xids = sel.warning_xids(operator_id, start_ms, end_ms)
    batches = build_batches(rows, xids, start_ms, hours)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    total = 0
    for kind, batch in batches.items():
        out = fc.forecast_batch(batch)
        total += len(batch.keys)
        for i in range(len(batch.keys)):
            results[(kind, batch.keys[i])] = {"fc": out, "i": i}
    crossed: list[str] = []
    cleared: list[str] = []
    stamp = datetime.fromtimestamp(now, tz=UTC)
    with transaction.atomic(), tenant_context(operator_id):
        known = {(r.kind, r.key): r for r in ComponentForecast.objects.for_tenant(operator_id)}
        for comp, ref in results.items():
            out, i = ref["fc"], ref["i"]
            level = fc.LEVELS[int(out.level[i])]
            row = known.get(comp)
            if level == "ok" and (row is None or row.level == "ok"):
                continue
            result = fc.component_result(out, i)
            previous = row.level if row is not None else "ok"
            if row is None:
                row = ComponentForecast(
                    operator_id=operator_id, kind=comp[0], key=comp[1], level_since=stamp
                )
            if previous != level:
                row.level_since = stamp
            row.node = result["node"]
            row.gpu = comp[1] if comp[0] != "ib_port" else ""
            row.level = level
            row.risk_1d, row.risk_3d, row.risk_7d = (
                result["risk"]["1d"],
                result["risk"]["3d"],
                result["risk"]["7d"],
            )
            row.ttf_hours = result["ttf_hours"]
            row.summary = fc.summary_text(result)
            row.result = result
            row.evaluated_at = stamp
            rose = sel.LEVEL_ORDER[level] > sel.LEVEL_ORDER[previous] and level in NOTIFY_LEVELS
            if level == "ok":
                row.cleared_at = stamp
                cleared.append(f"{comp[0]}:{comp[1]}")
            elif rose:
                row.cleared_at = None
                crossed.append(f"{comp[0]}:{comp[1]}")
                transaction.on_commit(partial(_announce, operator_id, row, previous))
            row.save()
            if rose:
                forecast_crossed_in_transaction.send_robust(
                    ComponentForecast, operator_id=operator_id, forecast=row, previous=previous
                )
        # A component with no data in the look-back any more (removed, or silent two weeks)
        # is cleared too.
        for comp, row in known.items():
            if comp not in results and row.level != "ok":
                row.level, row.cleared_at, row.evaluated_at = "ok", stamp, stamp
                row.save(update_fields=["level", "cleared_at", "evaluated_at"])
                cleared.append(f"{comp[0]}:{comp[1]}")
        flagged = ComponentForecast.objects.for_tenant(operator_id).exclude(level="ok").count()
    return PassResult(total, flagged, crossed, cleared, round(time.process_time() - c0, 3))


def drain_plan(operator_id: int) -> list[drain.DrainGroup]:
    """The drain advice over the stored forecasts and the running jobs."""
    with tenant_context(operator_id):
        rows = [r for r in sel.flagged(operator_id) if r.level in NOTIFY_LEVELS]
        jobs = sel.running_jobs(operator_id)
    per_node: dict[str, list[ComponentForecast]] = {}
    for r in rows:
        per_node.setdefault(r.node, []).append(r)
    nodes = []
    for node, comps in per_node.items():
        ttfs = [c.ttf_hours for c in comps if c.ttf_hours is not None]
        nodes.append(
            drain.NodeRisk(
                node,
                tuple(f"{c.kind}:{c.key}" for c in comps),
                min(ttfs) if ttfs else None,
                max(c.risk_1d for c in comps),
            )
        )
    return drain.plan_drains(nodes, [drain.Job(j.job_id, j.nodes, j.gpus) for j in jobs])
