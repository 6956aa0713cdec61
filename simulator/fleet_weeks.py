"""A fleet over weeks at the hourly-rollup level: ≥ 1,000 GPUs (8 per node, one InfiniBand
port per GPU) for 30 days plus two weeks of history before them, with degradations that end
in a failure at a known hour, and the benign things a real fleet does that must not drain a
node (docs/fleet-health.md, "The fleet-over-weeks simulator").

What each hour holds is what ingest's rollups keep (first/last of cumulative counters, the
max of the throttle-reason bitmask and of the temperature, the min of the PCIe link width)
and, for warning XIDs, the events of that hour. Ground truth: `FleetWeeks.failures`.

Degradation modes (onset 5–12 days before the failure; 5% of them fast, 1.5–4 days; 4% of
failures come with no sign at all):
- `ecc_dbe` → XID 48: single-bit ECC rate rising exponentially, XID 92 warnings and a few
  remaps as it gets high, then a double-bit error.
- `remap_failure` → XID 64 / DCGM_FI_DEV_ROW_REMAP_FAILURE: correctable remaps accumulating
  (XID 63 each) until the spare rows run out.
- `uncorrectable` → XID 94/95: uncorrectable remaps rising with the SBE rate.
- `thermal` → XID 79: one GPU's cooling failing: its peak temperature climbing above its node
  peers' to the slowdown point, throttled hours growing.
- `pcie` → XID 79: PCIe replays rising, the link dropping from x16 to x8 a day or two before.
- `ib_link` → link down: symbol errors, link recoveries and receive errors rising on a port.
- `sudden` → XID 79 with no precursor (not forecastable; counted in the denominator).

Benign: flat pre-existing counts (old remaps, a baseline SBE trickle), single-bit and PCIe
replay bursts of hours that stop, one-off remaps, IB ports with errors for one to three days
that recover (a reseated cable), rack-wide hot spells (every GPU of ten nodes hotter and
throttling for days), driver reloads resetting volatile counters, GPUs moving to another node
(an hours-long gap, volatile counters reset), and missing hours.

Imports only numpy and contract (the simulator learns nothing from the model it scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from contract import signals

HOURS_PER_DAY = 24
GPUS_PER_NODE = 8
SLOWDOWN_C = 87.0
SPARE_ROWS = 64.0
# Failures that give little or no warning: fast degradations (1.5–4 days from the first sign;
# every FAST_EVERY-th failure, 5%) and sudden ones (every SUDDEN_EVERY-th: 4%). Assumptions,
# not field figures: they set how far above 90% a perfect model could score (`simulate`'s
# fast_every / sudden_every change them).
FAST_EVERY = 20
SUDDEN_EVERY = 25
MODES = ("ecc_dbe", "remap_failure", "uncorrectable", "thermal", "pcie", "ib_link")
MODE_XID = {
    "ecc_dbe": "XID 48",
    "remap_failure": "XID 64 (remap failure)",
    "uncorrectable": "XID 94/95",
    "thermal": "XID 79",
    "pcie": "XID 79",
    "ib_link": "link down",
    "sudden": "XID 79",
}
MODE_KIND = {
    "ecc_dbe": "gpu",
    "remap_failure": "gpu",
    "uncorrectable": "gpu",
    "thermal": "gpu",
    "pcie": "pcie",
    "ib_link": "ib_port",
    "sudden": "gpu",
}


@dataclass(frozen=True)
class Failure:
    unit: int  # GPU index (gpu/pcie kinds) or port index (ib_port; port i belongs to GPU i)
    kind: str
    mode: str
    hour: int  # the hour of the failure (absolute, 0 = start of history)
    onset_hour: int
    what: str


@dataclass
class FleetWeeks:
    """Dense (units, hours) arrays; NaN where the hour has no data."""

    n_gpus: int
    hours: int
    history_hours: int
    start_ts: float
    gpu_uuid: list[str]
    node_of: np.ndarray  # (n_gpus, hours) int node index per hour (moves change it)
    counters: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (first, last)
    throttle_max: np.ndarray
    temp_max: np.ndarray
    pcie_width_min: np.ndarray
    xid_warnings: np.ndarray  # warning XIDs per hour
    failures: list[Failure] = field(default_factory=list)

    def node_name(self, index: int) -> str:
        return f"node-{index:04d}"


def _exp_rate(lo: float, hi: float, hours: int) -> np.ndarray:
    """Per-hour rate rising exponentially from lo/day to hi/day over `hours`."""
    t = np.arange(hours, dtype=np.float64) / max(hours - 1, 1)
    return lo * (hi / lo) ** t / HOURS_PER_DAY


def simulate(
    n_gpus: int = 1024,
    days: int = 30,
    history_days: int = 14,
    failures: int = 80,
    seed: int = 0,
    fast_every: int = FAST_EVERY,
    sudden_every: int = SUDDEN_EVERY,
    start_ts: float = 1_767_225_600.0,  # 2026-01-01 00:00 UTC
) -> FleetWeeks:
    if n_gpus < GPUS_PER_NODE or n_gpus % GPUS_PER_NODE:
        raise ValueError(f"n_gpus={n_gpus}: a whole number of {GPUS_PER_NODE}-GPU nodes")
    if days < 1 or history_days < 5:
        raise ValueError(f"days={days}, history_days={history_days}: need ≥ 1 and ≥ 5")
    rng = np.random.default_rng(seed)
    n = n_gpus
    n_nodes = n // GPUS_PER_NODE
    h_hist = history_days * HOURS_PER_DAY
    h = h_hist + days * HOURS_PER_DAY
    node_of = np.repeat(np.arange(n_nodes), GPUS_PER_NODE)[:, None].repeat(h, axis=1)

    # Hourly increments (rates per hour) of each counter.
    inc: dict[str, np.ndarray] = {}
    sbe_base = np.where(rng.random(n) < 0.05, rng.uniform(5, 15, n), rng.uniform(0, 4, n))
    inc["sbe"] = np.tile(sbe_base[:, None] / HOURS_PER_DAY, (1, h))
    inc["dbe"] = np.zeros((n, h))
    inc["remap_c"] = np.zeros((n, h))
    inc["remap_u"] = np.zeros((n, h))
    inc["remap_fail"] = np.zeros((n, h))
    inc["pcie"] = np.tile(rng.uniform(0, 10, n)[:, None] / HOURS_PER_DAY, (1, h))
    inc["nvlink"] = np.tile(rng.uniform(0, 40, n)[:, None] / HOURS_PER_DAY, (1, h))
    inc["ib_sym"] = np.tile(rng.uniform(0, 10, n)[:, None] / HOURS_PER_DAY, (1, h))
    inc["ib_rec"] = np.zeros((n, h))
    inc["ib_rcv"] = np.tile(rng.uniform(0, 4, n)[:, None] / HOURS_PER_DAY, (1, h))
    inc["ib_down"] = np.zeros((n, h))
    xidw = np.zeros((n, h))
    hour_of_day = np.arange(h) % HOURS_PER_DAY
    temp = (
        rng.uniform(62, 72, n)[:, None]
        + 3.0 * np.sin(2 * np.pi * (hour_of_day[None, :] - 9) / 24)
        + rng.normal(0, 1.0, (n, h))
    )
    throttled = np.zeros((n, h), dtype=bool)
    width = np.full((n, h), 16.0)

    # Benign bursts that stop.
    def bursts(key: str, share: float, lo_h: int, hi_h: int, lo_r: float, hi_r: float) -> None:
        for i in np.flatnonzero(rng.random(n) < share):
            start = int(rng.integers(0, h - hi_h))
            length = int(rng.integers(lo_h, hi_h))
            inc[key][i, start : start + length] += rng.uniform(lo_r, hi_r) / HOURS_PER_DAY

    bursts("sbe", 0.04, 6, 40, 1000, 12000)
    bursts("pcie", 0.03, 12, 48, 500, 4000)
    bursts("nvlink", 0.02, 6, 48, 1000, 20000)
    # IB ports with errors for 1–3 days that recover (a reseated cable).
    for i in np.flatnonzero(rng.random(n) < 0.05):
        start = int(rng.integers(0, h - 80))
        length = int(rng.integers(24, 72))
        inc["ib_sym"][i, start : start + length] += rng.uniform(200, 5000) / HOURS_PER_DAY
        inc["ib_rec"][i, start : start + length] += rng.uniform(2, 10) / HOURS_PER_DAY
        inc["ib_rcv"][i, start : start + length] += rng.uniform(20, 400) / HOURS_PER_DAY
    # One-off remaps (a remap, then nothing for weeks).
    for i in np.flatnonzero(rng.random(n) < 0.05):
        inc["remap_c"][i, int(rng.integers(0, h))] += float(rng.integers(1, 3))
    moved_at: list[tuple[int, int]] = []
    # Moves: 2% of GPUs go to another node after an hours-long gap (volatile counters reset).
    gap = np.zeros((n, h), dtype=bool)
    for i in np.flatnonzero(rng.random(n) < 0.02):
        at = int(rng.integers(HOURS_PER_DAY, h - HOURS_PER_DAY))
        length = int(rng.integers(4, 24))
        gap[i, at : at + length] = True
        moved_at.append((int(i), min(h - 1, at + length)))
        node_of[i, at + length :] = int(rng.integers(0, n_nodes))
    # Rack-wide hot spells: every GPU of ten nodes hotter, throttling some hours.
    for _ in range(max(1, days // 10)):
        nodes = rng.choice(n_nodes, size=min(10, n_nodes), replace=False)
        start = int(rng.integers(0, h - 96))
        length = int(rng.integers(48, 96))
        # The heat is where the node is: the GPUs there when the spell starts.
        rows = np.flatnonzero(np.isin(node_of[:, start], nodes))
        temp[rows, start : start + length] += rng.uniform(5, 9)
        hot = (hour_of_day[start : start + length] >= 12) & (
            hour_of_day[start : start + length] < 15
        )
        throttled[np.ix_(rows, np.arange(start, start + length)[hot])] = True

    # Pre-existing flat counts.
    pre = {
        "remap_c": np.where(rng.random(n) < 0.2, rng.integers(1, 30, n), 0).astype(np.float64),
        "remap_u": np.where(rng.random(n) < 0.03, rng.integers(1, 3, n), 0).astype(np.float64),
        "sbe": rng.integers(0, 5000, n).astype(np.float64),
        "pcie": rng.integers(0, 2000, n).astype(np.float64),
        "nvlink": rng.integers(0, 10**5, n).astype(np.float64),
        "ib_sym": rng.integers(0, 10**4, n).astype(np.float64),
        "ib_rcv": rng.integers(0, 10**3, n).astype(np.float64),
    }

    # Failures: distinct GPUs, failure hour inside the 30 evaluated days.
    fails: list[Failure] = []
    units = rng.choice(n, size=min(failures, n), replace=False)
    dead_from = np.full(n, h)
    port_dead_from = np.full(n, h)
    for k, unit in enumerate(units):
        gi = int(unit)
        mode = "sudden" if k % sudden_every == sudden_every - 1 else MODES[k % len(MODES)]
        f_h = int(rng.integers(h_hist + 2 * HOURS_PER_DAY, h - 1))
        fast = k % fast_every == fast_every - 2
        lead_days = rng.uniform(1.5, 4.0) if fast else rng.uniform(5.0, 12.0)
        o_h = max(0, f_h - int(lead_days * HOURS_PER_DAY))
        span = f_h - o_h
        u = float(rng.lognormal(0.0, 0.3))
        seg = slice(o_h, f_h)
        if mode == "ecc_dbe":
            r = _exp_rate(40, 5000 * u, span)
            inc["sbe"][gi, seg] += r
            inc["remap_c"][gi, seg] += r / 2000.0
            xidw[gi, seg] += np.where(r * HOURS_PER_DAY > 1000, 1 / 6, 0.0)
            inc["dbe"][gi, f_h] += 1
        elif mode == "remap_failure":
            left = max(4.0, (SPARE_ROWS - pre["remap_c"][gi]) * u)
            growth = np.exp(np.linspace(0, np.log(25), span))
            r = growth / growth.sum() * left
            inc["remap_c"][gi, seg] += r
            xidw[gi, seg] += r
            inc["sbe"][gi, seg] += _exp_rate(30, 1500, span)
            inc["remap_fail"][gi, f_h] += 1
        elif mode == "uncorrectable":
            inc["remap_u"][gi, seg] += _exp_rate(1.5, 8 * u, span)
            inc["sbe"][gi, seg] += _exp_rate(30, 2000 * u, span)
        elif mode == "thermal":
            rise = np.linspace(0, SLOWDOWN_C * u**0.1 - temp[gi, seg].mean() + 3, span)
            temp[gi, seg] += rise
            hot = temp[gi, seg] > 80
            throttled[gi, seg] |= hot & (
                rng.random(span) < np.clip((temp[gi, seg] - 78) / 10, 0, 1)
            )
        elif mode == "pcie":
            inc["pcie"][gi, seg] += _exp_rate(150, 20000 * u, span)
            drop = f_h - int(rng.uniform(1.0, 2.0) * HOURS_PER_DAY)
            width[gi, max(o_h, drop) : f_h] = 8.0
        elif mode == "ib_link":
            inc["ib_sym"][gi, seg] += _exp_rate(150, 50000 * u, span)
            inc["ib_rec"][gi, seg] += _exp_rate(4, 100 * u, span)
            inc["ib_rcv"][gi, seg] += _exp_rate(40, 20000 * u, span)
            inc["ib_down"][gi, f_h] += 1
        else:
            o_h = f_h
        if mode == "ib_link":
            port_dead_from[gi] = f_h + 1
        else:
            dead_from[gi] = f_h + 1
        fails.append(Failure(gi, MODE_KIND[mode], mode, f_h, o_h, MODE_XID[mode]))

    # Counts from rates (Poisson), then cumulative values with resets.
    counts = {k: rng.poisson(np.maximum(v, 0.0)).astype(np.float64) for k, v in inc.items()}
    counts["remap_fail"] = inc["remap_fail"]
    counts["dbe"] = inc["dbe"]
    counts["ib_down"] = inc["ib_down"]
    xid_counts = rng.poisson(np.maximum(xidw, 0.0)).astype(np.float64)
    volatile = {"sbe", "dbe", "ib_sym", "ib_rec", "ib_rcv", "ib_down", "pcie", "nvlink"}
    # Driver reloads: each node about every 10 days resets its volatile counters.
    reload = np.zeros((n, h), dtype=bool)
    for node in range(n_nodes):
        for hr in np.flatnonzero(rng.random(h) < 1.0 / (10 * HOURS_PER_DAY)):
            reload[node * GPUS_PER_NODE : (node + 1) * GPUS_PER_NODE, hr] = True
    for moved, at in moved_at:
        reload[moved, at] = True
    missing = rng.random((n, h)) < 0.005
    absent = gap | missing
    cols = np.arange(h)[None, :]
    absent_gpu = absent | (cols >= dead_from[:, None])
    absent_port = absent | (cols >= port_dead_from[:, None])

    counters: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    names = {
        "sbe": signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
        "dbe": signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
        "remap_c": signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
        "remap_u": signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
        "remap_fail": signals.DCGM_FI_DEV_ROW_REMAP_FAILURE,
        "pcie": signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
        "nvlink": signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        "ib_sym": signals.IB_SYMBOL_ERROR,
        "ib_rec": signals.IB_LINK_ERROR_RECOVERY,
        "ib_rcv": signals.IB_PORT_RCV_ERRORS,
        "ib_down": signals.IB_LINK_DOWNED,
    }
    for key, name in names.items():
        c = counts[key]
        base = pre.get(key, np.zeros(n))
        if key in volatile:
            # Cumulative since the last reload: a reload at hour r zeroes the count at r's start.
            seg_id = np.cumsum(reload, axis=1)
            total = np.cumsum(c, axis=1)
            before = total - c
            # value at the start of each hour = total before it − total before the segment
            start_total = np.zeros_like(total)
            for i in np.flatnonzero(reload.any(axis=1)):
                rs = np.flatnonzero(reload[i])
                offs = np.concatenate([[0.0], before[i, rs]])
                start_total[i] = offs[seg_id[i]]
            has_base = seg_id == 0
            first = before - start_total + np.where(has_base, base[:, None], 0.0)
        else:
            first = np.cumsum(c, axis=1) - c + base[:, None]
        last = first + c
        dead = absent_port if key.startswith("ib_") else absent_gpu
        counters[name] = (np.where(dead, np.nan, first), np.where(dead, np.nan, last))
    throttle_max = np.where(throttled, float(signals.THROTTLE_HW_THERMAL), 0.0)
    throttle_max[(rng.random((n, h)) < 0.05) & ~throttled] = float(signals.THROTTLE_SW_POWER_CAP)
    return FleetWeeks(
        n_gpus=n,
        hours=h,
        history_hours=h_hist,
        start_ts=start_ts,
        gpu_uuid=[f"GPU-{seed:04x}{i:08x}-fleet-weeks" for i in range(n)],
        node_of=node_of,
        counters=counters,
        throttle_max=np.where(absent_gpu, np.nan, throttle_max),
        temp_max=np.where(absent_gpu, np.nan, np.round(temp + np.abs(rng.normal(0, 0.5, (n, h))))),
        pcie_width_min=np.where(absent_gpu, np.nan, width),
        xid_warnings=np.where(absent_gpu, np.nan, xid_counts),
        failures=fails,
    )
