"""`proof bench fleet-health`: the days-ahead forecast (engine/forecast.py) scored on the
fleet-over-weeks simulator (simulator/fleet_weeks.py).

Every `--every` hours (default 1, as the live task runs) of the simulated days the forecast
runs over every GPU, PCIe link, NVLink and IB port on the look-back the live task reads (14
days of hourly rollups). A unit (a GPU with its PCIe link and NVLink; an IB port) is
*drained* the first pass its level is drain or urgent. Printed:

- failures flagged ≥ 48 h ahead (X of Y): the first drain in the 10 days before the failure
  came ≥ 48 h before it (Y counts every failure, sudden ones without a sign included);
- median lead time of the flagged failures;
- false drains per 1,000 GPU-months: drain episodes (a unit entering drain) that began
  while the unit was not degrading (outside the simulator's onset → failure span);
- the cost of one evaluation pass over 10,000 GPUs (their GPU, PCIe, NVLink and IB port
  components, from hourly first/last arrays to levels and evidence), CPU seconds of one core;
- per mode, and the calibration of the 7-day risk (share of passes in each risk band whose
  unit failed within 7 days).

    proof bench fleet-health [--gpus 1024] [--days 30] [--failures 80] [--seed 0]
                             [--every 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import signals
from engine import forecast as fc
from simulator.fleet_weeks import (
    FAST_EVERY,
    HOURS_PER_DAY,
    SUDDEN_EVERY,
    FleetWeeks,
    simulate,
)

LEAD_TARGET_H = 48.0
FLAG_WINDOW_H = 10 * HOURS_PER_DAY  # a drain this long before a failure counts for it
SCORE_FROM_H = 7 * HOURS_PER_DAY
TARGET_FLAGGED = 0.90
TARGET_FALSE_PER_1000 = 1.0
TARGET_PASS_S = 60.0

_GPU_COUNTERS = {
    "gpu": (
        signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
        signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
        signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    ),
    "pcie": (signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,),
    "nvlink": (signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,),
    "ib_port": (
        signals.IB_SYMBOL_ERROR,
        signals.IB_LINK_ERROR_RECOVERY,
        signals.IB_PORT_RCV_ERRORS,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=1024, help="GPUs (8 per node)")
    parser.add_argument("--days", type=int, default=30, help="days scored (after 14 of history)")
    parser.add_argument("--failures", type=int, default=80, help="failures to simulate")
    parser.add_argument(
        "--fast-every",
        type=int,
        default=FAST_EVERY,
        help="every Nth failure degrades fast (1.5-4 d)",
    )
    parser.add_argument(
        "--sudden-every", type=int, default=SUDDEN_EVERY, help="every Nth failure has no sign"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--every",
        type=int,
        default=1,
        help="hours between evaluation passes (1: the live schedule's; 6 runs ~4x faster)",
    )
    parser.add_argument("--cost-gpus", type=int, default=10_000, help="GPUs in the timed pass")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


@dataclass
class Hourly:
    """The simulated fleet's hourly values per kind and signal, in the forecast's terms."""

    per_kind: dict[str, dict[str, np.ndarray]]
    remaps_level: np.ndarray  # (n, hours) correctable remaps, the cumulative value


def hourly_values(fleet: FleetWeeks) -> Hourly:
    per_kind: dict[str, dict[str, np.ndarray]] = {k: {} for k in fc.KINDS}
    for kind, names in _GPU_COUNTERS.items():
        for name in names:
            first, last = fleet.counters[name]
            per_kind[kind][name] = fc.counter_increase(first, last)
    per_kind["gpu"][fc.XID_WARNINGS] = fleet.xid_warnings
    per_kind["gpu"][fc.TEMP_EXCESS] = fleet.temp_max
    per_kind["gpu"][fc.THROTTLE_HOURS] = fc.throttled_hours(fleet.throttle_max)
    per_kind["pcie"][fc.LINK_WIDTH] = fleet.pcie_width_min
    _, remaps_last = fleet.counters[signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS]
    return Hourly(per_kind, remaps_last)


def pass_at(
    fleet: FleetWeeks, hourly: Hourly, end_hour: int, rows: slice | None = None
) -> dict[str, fc.BatchForecast]:
    """One evaluation pass: the forecast of every component on the look-back ending at
    end_hour (exclusive)."""
    lo = max(0, end_hour - fc.LOOKBACK_DAYS * HOURS_PER_DAY)
    sel = rows or slice(None)
    nodes_idx = fleet.node_of[sel, end_hour - 1]
    nodes = [fleet.node_name(int(x)) for x in nodes_idx]
    keys = fleet.gpu_uuid[sel]
    end_ts = fleet.start_ts + end_hour * 3600.0
    remaps = hourly.remaps_level[sel, lo:end_hour]
    with np.errstate(all="ignore"):
        level_now = np.nanmax(np.where(np.isfinite(remaps), remaps, -np.inf), axis=1)
    level_now = np.where(np.isfinite(level_now), level_now, 0.0)
    # The peer-relative gauges only over the hours each GPU spent on its node now: a GPU that
    # moved is not compared with its new neighbours over days it ran elsewhere (the live
    # pass reads only the newest node's series of these, forecast_services.build_batches).
    elsewhere = fleet.node_of[sel, lo:end_hour] != nodes_idx[:, None]
    out = {}
    for kind in fc.KINDS:
        window = {name: arr[sel, lo:end_hour] for name, arr in hourly.per_kind[kind].items()}
        if kind == "gpu" and elsewhere.any():
            for name in fc.PEER_GAUGES:
                window[name] = np.where(elsewhere, np.nan, window[name])
        level = (
            {signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: level_now} if kind == "gpu" else None
        )
        batch = fc.build_batch(kind, keys, nodes, end_ts, window, level)
        out[kind] = fc.forecast_batch(batch)
    return out


def score(fleet: FleetWeeks, every: int = 1) -> dict[str, Any]:
    hourly = hourly_values(fleet)
    n = fleet.n_gpus
    # From the first week on (the model needs TREND_DAYS + 1 days; a week gives the quiet
    # baseline): failures fall from day 16 on, so every degradation is watched from its onset.
    passes = list(range(SCORE_FROM_H, fleet.hours + 1, every))
    gpu_level = np.zeros((len(passes), n), dtype=np.int64)
    port_level = np.zeros((len(passes), n), dtype=np.int64)
    gpu_risk7 = np.zeros((len(passes), n))
    port_risk7 = np.zeros((len(passes), n))
    for p, t in enumerate(passes):
        res = pass_at(fleet, hourly, t)
        gpu_level[p] = np.maximum.reduce([res[k].level for k in ("gpu", "pcie", "nvlink")])
        gpu_risk7[p] = np.maximum.reduce([res[k].risk[:, 2] for k in ("gpu", "pcie", "nvlink")])
        port_level[p] = res["ib_port"].level
        port_risk7[p] = res["ib_port"].risk[:, 2]
    t_arr = np.asarray(passes)
    # A failed unit is out of service from its failure on (its last day still shows the run-up
    # for 24 h, which must not count as a drain).
    for f in fleet.failures:
        gone = t_arr > f.hour
        if f.kind == "ib_port":
            port_level[gone, f.unit] = 0
        else:
            gpu_level[gone, f.unit] = 0
    fail_at = {
        ("gpu", f.unit) if f.kind != "ib_port" else ("port", f.unit): f for f in fleet.failures
    }
    flagged = []
    per_mode: dict[str, list[int]] = {}
    for (unit_kind, unit), f in fail_at.items():
        levels = gpu_level[:, unit] if unit_kind == "gpu" else port_level[:, unit]
        window = (t_arr <= f.hour) & (t_arr >= f.hour - FLAG_WINDOW_H)
        hits = np.flatnonzero(window & (levels >= 2))
        lead = float(f.hour - t_arr[hits[0]]) if len(hits) else None
        ok = lead is not None and lead >= LEAD_TARGET_H
        per_mode.setdefault(f.mode, [0, 0])
        per_mode[f.mode][0] += int(ok)
        per_mode[f.mode][1] += 1
        flagged.append((f, lead, ok))
    false_drains = 0
    false_list = []
    for unit_kind, levels in (("gpu", gpu_level), ("port", port_level)):
        drained = levels >= 2
        starts = drained & ~np.vstack([np.zeros((1, n), dtype=bool), drained[:-1]])
        for p, unit in zip(*np.nonzero(starts), strict=True):
            hit_f = fail_at.get((unit_kind, int(unit)))
            t = int(t_arr[p])
            if hit_f is None or not (hit_f.onset_hour <= t <= hit_f.hour):
                false_drains += 1
                false_list.append((unit_kind, int(unit), t))
    gpu_months = n * (len(passes) * every / HOURS_PER_DAY) / 30.0
    calib = []
    for lo_r, hi_r in ((0.2, 0.5), (0.5, 0.8), (0.8, 1.01)):
        hit = tot = 0
        for unit_kind, risk in (("gpu", gpu_risk7), ("port", port_risk7)):
            for p, unit in zip(*np.nonzero((risk >= lo_r) & (risk < hi_r)), strict=True):
                tot += 1
                band_f = fail_at.get((unit_kind, int(unit)))
                t = int(t_arr[p])
                hit += int(band_f is not None and t <= band_f.hour <= t + 7 * HOURS_PER_DAY)
        calib.append(
            {"risk_7d": f"{lo_r:.1f}-{min(hi_r, 1.0):.1f}", "passes": tot, "failed_within_7d": hit}
        )
    leads = [lead for _, lead, _ in flagged if lead is not None]
    n_ok = sum(ok for _, _, ok in flagged)
    return {
        "gpus": n,
        "days": round(len(passes) * every / HOURS_PER_DAY, 1),
        "passes": len(passes),
        "failures": len(flagged),
        "flagged_48h": n_ok,
        "flagged_48h_share": round(n_ok / max(len(flagged), 1), 3),
        "median_lead_h": round(statistics.median(leads), 1) if leads else None,
        "false_drains": false_drains,
        "gpu_months": round(gpu_months, 1),
        "false_drains_per_1000_gpu_months": round(1000.0 * false_drains / max(gpu_months, 1e-9), 2),
        "per_mode": {m: f"{a} of {b}" for m, (a, b) in sorted(per_mode.items())},
        "missed": [
            {
                "mode": f.mode,
                "unit": f.unit,
                "lead_h": lead,
                "onset_to_failure_h": f.hour - f.onset_hour,
            }
            for f, lead, ok in flagged
            if not ok
        ],
        "false_drain_units": false_list[:20],
        "calibration": calib,
    }


def pass_cost(fleet: FleetWeeks, n_gpus: int) -> dict[str, float]:
    """CPU seconds of one pass over n_gpus GPUs' components (the simulated fleet's look-back
    tiled to that size): hourly increases from first/last, days, forecast, and the evidence
    JSON of every component at watch or above."""
    reps = -(-n_gpus // fleet.n_gpus)
    end = fleet.hours
    lo = end - fc.LOOKBACK_DAYS * HOURS_PER_DAY

    def tile(a: np.ndarray) -> np.ndarray:
        return np.tile(a[:, lo:end], (reps, 1))[:n_gpus]

    big = FleetWeeks(
        n_gpus=n_gpus,
        hours=end - lo,
        history_hours=0,
        start_ts=fleet.start_ts + lo * 3600.0,
        gpu_uuid=[f"GPU-cost-{i:08d}" for i in range(n_gpus)],
        node_of=np.repeat(np.arange(-(-n_gpus // 8)), 8)[:n_gpus, None].repeat(end - lo, axis=1),
        counters={k: (tile(a), tile(b)) for k, (a, b) in fleet.counters.items()},
        throttle_max=tile(fleet.throttle_max),
        temp_max=tile(fleet.temp_max),
        pcie_width_min=tile(fleet.pcie_width_min),
        xid_warnings=tile(fleet.xid_warnings),
    )
    c0 = time.process_time()
    w0 = time.perf_counter()
    hourly = hourly_values(big)
    res = pass_at(big, hourly, big.hours)
    explained = 0
    for r in res.values():
        for i in np.flatnonzero(r.level >= 1):
            fc.component_result(r, int(i))
            explained += 1
    return {
        "cpu_s": round(time.process_time() - c0, 2),
        "wall_s": round(time.perf_counter() - w0, 2),
        "components": float(sum(len(r.level) for r in res.values())),
        "explained": float(explained),
    }


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    fleet = simulate(
        n_gpus=args.gpus,
        days=args.days,
        failures=args.failures,
        seed=args.seed,
        fast_every=args.fast_every,
        sudden_every=args.sudden_every,
    )
    sim_s = time.perf_counter() - t0
    result = score(fleet, every=args.every)
    result["simulate_s"] = round(sim_s, 1)
    result["pass_cost"] = pass_cost(fleet, args.cost_gpus)
    result["cost_gpus"] = args.cost_gpus
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    ok_flag = result["flagged_48h_share"] >= TARGET_FLAGGED
    ok_false = result["false_drains_per_1000_gpu_months"] <= TARGET_FALSE_PER_1000
    ok_cost = result["pass_cost"]["cpu_s"] <= TARGET_PASS_S
    mark = {True: "met", False: "NOT met"}
    print(
        f"fleet-health: {result['gpus']} GPUs x {result['days']} days, a pass every "
        f"{args.every} h ({result['passes']} passes), seed {args.seed}"
    )
    print(
        f"  failures flagged >= 48 h ahead: {result['flagged_48h']} of {result['failures']} "
        f"({result['flagged_48h_share']:.0%}; target >= 90%: {mark[ok_flag]})"
    )
    print(f"  median lead time: {result['median_lead_h']} h")
    print(
        f"  false drains: {result['false_drains']} in {result['gpu_months']} GPU-months = "
        f"{result['false_drains_per_1000_gpu_months']} per 1,000 GPU-months "
        f"(target <= 1: {mark[ok_false]})"
    )
    pc = result["pass_cost"]
    print(
        f"  one pass over {args.cost_gpus:,} GPUs ({pc['components']:.0f} components, "
        f"{pc['explained']:.0f} explained): {pc['cpu_s']} s CPU, {pc['wall_s']} s wall "
        f"(target <= 60 s of one core: {mark[ok_cost]})"
    )
    print(
        "  per mode (flagged >= 48 h / failures): "
        + ", ".join(f"{m} {v}" for m, v in result["per_mode"].items())
    )
    for m in result["missed"]:
        print(f"  missed: {m}")
    print(
        "  7-day risk calibration: "
        + "; ".join(
            f"{c['risk_7d']}: {c['failed_within_7d']} of {c['passes']} passes failed within 7 d"
            for c in result["calibration"]
        )
    )
    return 0
