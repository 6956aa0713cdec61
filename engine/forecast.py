"""Fleet health days ahead: per component (a GPU, its PCIe link, its NVLink, an InfiniBand
port) the risk of failure within 1, 3 and 7 days, an estimated time to failure and the
evidence behind it, from the hourly rollups (docs/fleet-health.md).

Pure and batch-first: every function takes arrays of many components at once, (n, hours),
so one pass over 10,000 GPUs is a few dozen array operations per signal, not 10,000 loops.
The live app (investigations/forecast_services.py) and the bench (`proof bench
fleet-health`, on simulator/fleet_weeks.py) call the same `forecast_batch`.

The model, in short: each signal becomes a daily series (counter increases, hours throttled,
daily peak temperature relative to the GPU's node peers). A signal is a *sign* when it is
present now, was present on most of the last four days and is growing (a step that stays
flat, a burst that stopped and an old flat count are not). Each sign is extrapolated to the
level at which it ends in a failure (its `limit`: a rate, the spare rows left, the slowdown
temperature), giving a time to failure; the risk within h days is a logistic in (h − ttf)
whose width grows with ttf. A component needs two independent signs still rising, or one
that has grown for `STRONG_SIGN_DAYS` days in a row (or steadily, beyond noise, for one day
fewer), to reach the drain level; one young sign is "watch".
When the errors stop the sign is gone the next day, so recovered parts clear.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import signals

HOURS_PER_DAY = 24
# The look-back the model reads: two weeks of hourly rollups. The trend uses the last
# TREND_DAYS days; the rest is the component's own quiet baseline and the charts.
LOOKBACK_DAYS = 14
TREND_DAYS = 4
# A sign must be present (≥ its floor) on at least this many of the last TREND_DAYS days…
PERSIST_MIN_DAYS = 3
# …and growing: the last two days' total ≥ RISE_RATIO × the two days before (plus one floor,
# so a trickle at the floor is not "growth"), and the log-linear slope ≥ MIN_GROWTH per day.
RISE_RATIO = 1.5
MIN_GROWTH = 0.15
# …and not falling: today and yesterday each at least (about) the day before. A port whose
# errors are dying down after a burst is recovering, not degrading.
RISING_MIN_DAYS = 2
# Today over yesterday, in log: ≥ 0.075 (+8%), and more than two Poisson standard deviations
# of yesterday's count (2/√n in log), so 9 link recoveries after 8 is not growth.
LATELY_MIN_GROWTH = MIN_GROWTH / 2
LATELY_SIGMAS = 2.0
# Growth used to extrapolate a rate, clipped: a sign rising 15%/day is not projected slower
# than 10%/day, nor a two-day jump faster than ×4.5 per day.
GROWTH_CLIP = (0.10, 1.5)
# One sign alone drains only once it has grown this many days in a row (or one day fewer when
# each of the last two day-over-day rises is beyond STEADY_SIGMAS of noise); benign
# bursts and recovering links seen in the field last one to three days (docs/fleet-health.md).
STRONG_SIGN_DAYS = 4
# …or when it has grown three days, was present four, and projects to fail within SOON_DAYS.
SOON_DAYS = 3.0
# A rate is "present" on a day at or above its floor plus twice the component's usual day.
USUAL_FACTOR = 2.0
# Steady growth: each of the last two day-over-day rises beyond this many standard deviations
# of Poisson noise (two days of a constant rate differ by 2σ one time in twenty).
STEADY_SIGMAS = 3.0
# Today's rise (in log) must be at least this share of yesterday's for a sign to count as one
# of two independent signs, or as steady.
SUSTAINED_SHARE = 1.0 / 3.0
# Days of a gauge on its current node, before the trend window, that a peer sign needs as its
# baseline (the GPU's usual offset from its neighbours).
PEER_BASELINE_DAYS = 3
# A single young sign is capped below the drain level: it is worth watching, not draining.
SINGLE_SIGN_RISK_CAP = 0.45
# Risk levels (of failure within 7 days, or 1 day for urgent).
WATCH_RISK = 0.2
DRAIN_RISK = 0.5
URGENT_RISK_1D = 0.5
HORIZONS_DAYS = (1, 3, 7)
# The slowdown temperature a thermal sign heads for (H100 SXM reports ~87 °C as its GPU
# slowdown threshold in `nvidia-smi -q -d TEMPERATURE`; configurable per fleet).
SLOWDOWN_TEMP_C = 87.0
# Spare rows the row remapper has before a remap fails, as planned headroom per GPU (an
# assumption: NVIDIA documents up to 8 remaps per memory bank; failures come when one bank's
# spares run out, earlier than the GPU-wide total).
SPARE_ROWS = 64.0
# A width/gen drop is projected to end in a link failure within this many days (prior from
# the simulator's PCIe mode; field data would recalibrate it).
LINK_DROP_TTF_DAYS = 1.5

THROTTLE_HOURS = "throttle_hours"  # derived: hours a day with HW/thermal throttle reasons
XID_WARNINGS = "xid_warnings"  # derived: warning XIDs (63, 92, …) a day, from events
TEMP_EXCESS = "temp_peak"  # derived: daily peak GPU temperature
# derived: the day's mean of each hour's peak temperature less its node peers' median that
# hour (the trend of a GPU heating up; the daily peak alone is one noisy sample a day)
TEMP_ABOVE_PEERS = "temp_above_peers"
# The gauges judged against the node's peers: callers pass them only for the hours the GPU
# was on its current node (a GPU that moved is not compared with its new neighbours over days
# it ran elsewhere).
PEER_GAUGES = (TEMP_EXCESS, THROTTLE_HOURS)
LINK_WIDTH = "pcie_width_drop"  # derived: PCIe width or gen below its own look-back max

_THROTTLE_BITS = (
    signals.THROTTLE_HW_SLOWDOWN
    | signals.THROTTLE_HW_THERMAL
    | signals.THROTTLE_HW_POWER_BRAKE
    | signals.THROTTLE_SW_THERMAL
)


@dataclass(frozen=True)
class Rule:
    """One signal of one component kind: how it becomes a sign and what it heads for."""

    signal: str
    label: str
    mode: str  # "rate" (counter per day), "headroom" (rate against spare left), "peer" (gauge
    # relative to node peers), "drop" (a level below its own max)
    floor: float  # per day: below this the signal is noise
    limit: float  # the level at which it ends in a failure
    heading_for: str
    unit: str = "/day"


RULES: dict[str, tuple[Rule, ...]] = {
    "gpu": (
        Rule(
            signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
            "single-bit ECC errors",
            "rate",
            20.0,
            5000.0,
            "XID 48 (double-bit ECC) / XID 92 (high single-bit rate) at ~5,000 SBE/day",
        ),
        Rule(
            signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
            "correctable row remaps",
            "headroom",
            1.0,
            SPARE_ROWS,
            f"row-remap failure (XID 64) when the {SPARE_ROWS:.0f} planned spare rows run out",
        ),
        Rule(
            signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
            "uncorrectable row remaps",
            "rate",
            1.0,
            8.0,
            "XID 94/95 (contained/uncontained ECC) at ~8 uncorrectable remaps/day",
        ),
        Rule(
            XID_WARNINGS,
            "warning XIDs (63, 92)",
            "rate",
            1.0,
            24.0,
            "an uncorrectable error once warnings come hourly",
        ),
        Rule(
            TEMP_EXCESS,
            "peak temperature above node peers",
            "peer",
            3.0,
            SLOWDOWN_TEMP_C,
            f"thermal shutdown / fallen off the bus (XID 79) at {SLOWDOWN_TEMP_C:.0f} °C",
            "°C",
        ),
        Rule(
            THROTTLE_HOURS,
            "hours throttled (HW/thermal) above node peers",
            "peer",
            1.0,
            12.0,
            "XID 79 once the GPU throttles half the day",
            "h/day",
        ),
    ),
    "pcie": (
        Rule(
            signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
            "PCIe replays",
            "rate",
            50.0,
            20000.0,
            "link failure / fallen off the bus (XID 79) at ~20,000 replays/day",
        ),
        Rule(
            LINK_WIDTH,
            "PCIe link width/gen below its own maximum",
            "drop",
            1.0,
            1.0,
            "link failure (XID 79) within days of a width/gen downgrade",
            "lanes",
        ),
    ),
    "nvlink": (
        Rule(
            signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            "NVLink CRC flit errors",
            "rate",
            100.0,
            200000.0,
            "NVLink down (XID 74) at ~200,000 CRC errors/day",
        ),
    ),
    "ib_port": (
        Rule(
            signals.IB_SYMBOL_ERROR,
            "IB symbol errors",
            "rate",
            50.0,
            50000.0,
            "port down at ~50,000 symbol errors/day",
        ),
        Rule(
            signals.IB_LINK_ERROR_RECOVERY,
            "IB link error recoveries",
            "rate",
            2.0,
            100.0,
            "port down at ~100 recoveries/day",
        ),
        Rule(
            signals.IB_PORT_RCV_ERRORS,
            "IB receive errors",
            "rate",
            20.0,
            20000.0,
            "port down at ~20,000 receive errors/day",
        ),
    ),
}
KINDS = tuple(RULES)


# --- from rollup rows to hourly increases ---------------------------------------------------


def counter_increase(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """(n, H) hourly increases of cumulative counters from each hour's first and last value
    (NaN where the hour has no data), robust to resets: a value below the one before it is a
    restart from zero (driver reload, reboot), so the increase is the new value itself, as
    Prometheus' `increase` counts it. The first hour with data contributes only its own rise:
    a pre-existing count is never an increase."""
    first = np.asarray(first, dtype=np.float64)
    last = np.asarray(last, dtype=np.float64)
    within = last - first
    within = np.where(within < 0, last, within)  # reset inside the hour
    valid = np.isfinite(last)
    # The last value of the most recent earlier hour with data (forward fill along hours).
    idx = np.where(valid, np.arange(last.shape[1])[None, :], -1)
    np.maximum.accumulate(idx, axis=1, out=idx)
    prev_idx = np.concatenate([np.full((last.shape[0], 1), -1), idx[:, :-1]], axis=1)
    prev = np.take_along_axis(last, np.maximum(prev_idx, 0), axis=1)
    prev = np.where(prev_idx >= 0, prev, np.nan)
    gap = first - prev
    gap = np.where(gap < 0, first, gap)  # reset between hours: count from zero
    gap = np.where(np.isfinite(gap), gap, 0.0)
    return np.where(valid, within + gap, np.nan)


def daily(hourly: np.ndarray, how: str = "sum") -> np.ndarray:
    """(n, H) hourly → (n, H // 24) per day, the last day ending at the last hour; a day with
    no data is NaN."""
    n, h = hourly.shape
    d = h // HOURS_PER_DAY
    part = hourly[:, h - d * HOURS_PER_DAY :].reshape(n, d, HOURS_PER_DAY)
    seen = np.isfinite(part).any(axis=2)
    with np.errstate(all="ignore"):
        if how == "sum":
            out = np.nansum(part, axis=2)
        elif how == "max":
            out = np.nanmax(np.where(np.isfinite(part), part, -np.inf), axis=2)
        elif how == "min":
            out = np.nanmin(np.where(np.isfinite(part), part, np.inf), axis=2)
        elif how == "mean":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a day without data: NaN
                out = np.nanmean(part, axis=2)
        else:
            raise ValueError(f"unknown daily aggregate {how!r}: use sum, max, min or mean")
    return np.where(seen, out, np.nan)


def throttled_hours(reasons_max: np.ndarray) -> np.ndarray:
    """(n, H) 1.0 for an hour whose throttle-reasons rollup max has an HW/thermal bit, else 0;
    NaN where the hour has no data. (The rollup keeps the max sample of the bitmask: a sample
    with one of these bits set makes the max carry one of them or a higher bit.)"""
    r = np.asarray(reasons_max, dtype=np.float64)
    bits = np.nan_to_num(r, nan=0.0).astype(np.int64)
    return np.where(np.isfinite(r), ((bits & _THROTTLE_BITS) != 0).astype(np.float64), np.nan)


# --- the batch ------------------------------------------------------------------------------


@dataclass
class ComponentBatch:
    """Components of one kind, over the same hours. `daily` maps each of the kind's rule
    signals to (n, days) values (missing signals are treated as no data); `level` the current
    cumulative value of headroom signals (remaps); `nodes` each component's node (for peer
    baselines and drains)."""

    kind: str
    keys: list[str]
    nodes: list[str]
    end_ts: float
    daily: dict[str, np.ndarray]
    level: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in RULES:
            raise ValueError(f"unknown component kind {self.kind!r}: one of {', '.join(KINDS)}")
        n = len(self.keys)
        if len(self.nodes) != n:
            raise ValueError(f"{len(self.nodes)} nodes for {n} components: one node each")
        for name, arr in self.daily.items():
            if arr.ndim != 2 or arr.shape[0] != n:
                raise ValueError(f"daily[{name!r}] has shape {arr.shape}: expected ({n}, days)")


@dataclass
class BatchForecast:
    """Per component: risk within 1/3/7 days, ttf (days, inf when no sign), level, and the
    sign matrix the evidence is read from."""

    batch: ComponentBatch
    risk: np.ndarray  # (n, 3)
    ttf_days: np.ndarray  # (n,)
    level: np.ndarray  # (n,) 0 ok, 1 watch, 2 drain, 3 urgent
    active: np.ndarray  # (n, rules) bool
    sign_ttf: np.ndarray  # (n, rules)
    rate: np.ndarray  # (n, rules) the value today
    before: np.ndarray  # (n, rules) the value three days ago
    growth: np.ndarray  # (n, rules) log-slope per day
    days_rising: np.ndarray  # (n, rules)


LEVELS = ("ok", "watch", "drain", "urgent")


def _node_median(values: np.ndarray, nodes: list[str]) -> np.ndarray:
    """(n, d) → each component's node median per day (NaN-aware), for peer baselines.
    Nodes are grouped by their component count so each size is one vectorised nanmedian
    (a loop per node was 80% of a pass)."""
    _, inv, counts = np.unique(
        np.asarray(nodes, dtype=object).astype(str), return_inverse=True, return_counts=True
    )
    order = np.argsort(inv, kind="stable")
    size = counts[inv[order]]  # the node size of each sorted component
    out = np.empty_like(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN day of a node is NaN
        for s in np.unique(counts):
            rows = order[size == s]  # whole nodes of size s, each one's members adjacent
            block = values[rows].reshape(-1, int(s), values.shape[1])
            med = np.nanmedian(block, axis=1)
            out[rows] = np.repeat(med, int(s), axis=0)
    return out


def _slope(y: np.ndarray) -> np.ndarray:
    """Least-squares slope per row of (n, k), NaN treated as 0."""
    k = y.shape[1]
    x = np.arange(k, dtype=np.float64) - (k - 1) / 2.0
    y = np.nan_to_num(y, nan=0.0)
    return np.asarray((y * x).sum(axis=1) / float((x * x).sum()))


def _days_rising(d: np.ndarray, floor: float | np.ndarray) -> np.ndarray:
    """Consecutive days ending today on which the value is ≥ floor and not below the day
    before's (the run of growth a sign has behind it)."""
    n, k = d.shape
    v = np.nan_to_num(d, nan=0.0)
    ok = v >= np.reshape(np.asarray(floor, dtype=np.float64), (-1, 1))
    grow = np.ones_like(ok)
    # Not below 90% of the day before, less two Poisson standard deviations (small counts —
    # a few remaps or link recoveries a day — wobble by their square root).
    grow[:, 1:] = v[:, 1:] >= 0.9 * v[:, :-1] - 2.0 * np.sqrt(np.maximum(v[:, :-1], 0.0))
    good = ok & grow
    run = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    for j in range(k - 1, -1, -1):
        alive &= good[:, j]
        run += alive
    return run


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(x, -50, 50))))


def forecast_batch(batch: ComponentBatch) -> BatchForecast:
    rules = RULES[batch.kind]
    n = len(batch.keys)
    r = len(rules)
    active = np.zeros((n, r), dtype=bool)
    sign_ttf = np.full((n, r), np.inf)
    rate = np.zeros((n, r))
    before = np.zeros((n, r))
    growth = np.zeros((n, r))
    rising = np.zeros((n, r), dtype=np.int64)
    steady = np.zeros((n, r), dtype=bool)  # grew significantly on each of the last two days
    seasoned = np.zeros((n, r), dtype=bool)  # present on each of the last TREND_DAYS days
    sustained = np.ones((n, r), dtype=bool)  # today's rise not a small share of yesterday's
    for j, rule in enumerate(rules):
        d = batch.daily.get(rule.signal)
        if d is None or d.shape[1] < TREND_DAYS + 1:
            continue
        d = np.asarray(d, dtype=np.float64)
        if rule.mode == "drop":
            # A level below the component's own look-back maximum, today.
            hist = np.nanmax(np.where(np.isfinite(d[:, :-1]), d[:, :-1], -np.inf), axis=1)
            today = d[:, -1]
            drop = np.isfinite(today) & np.isfinite(hist) & (today < hist)
            active[:, j] = drop
            sign_ttf[:, j] = np.where(drop, LINK_DROP_TTF_DAYS, np.inf)
            rate[:, j] = np.nan_to_num(today)
            before[:, j] = np.where(np.isfinite(hist), hist, 0.0)
            rising[:, j] = drop
            continue
        if rule.mode == "peer":
            rel = batch.daily.get(TEMP_ABOVE_PEERS) if rule.signal == TEMP_EXCESS else None
            if rel is not None:
                x = np.asarray(rel, dtype=np.float64)
            else:
                x = d - _node_median(d, batch.nodes)
            # Less the component's own usual offset from its peers (a GPU that always runs
            # 4 °C hotter than its neighbours is not heating up).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                usual = np.nanmedian(x[:, :-TREND_DAYS], axis=1)
            x = x - np.where(np.isfinite(usual), usual, 0.0)[:, None]
            tail = x[:, -TREND_DAYS:]
            g = _slope(tail)  # units per day
            present = (np.nan_to_num(tail, nan=0.0) >= 0.5 * rule.floor).sum(axis=1)
            now = np.nan_to_num(x[:, -1], nan=0.0)
            # A baseline first: a GPU new on its node (moved, or back after a gap) has no usual
            # offset from these peers yet, and arriving in the middle of a rack-wide hot spell
            # its offset moves as the spell ends (a false drain, seeds 1, 4 and 6).
            known = np.isfinite(x[:, :-TREND_DAYS]).sum(axis=1) >= PEER_BASELINE_DAYS
            sign = (
                known
                & (present >= PERSIST_MIN_DAYS)
                & (now >= rule.floor)
                & (g >= 0.5 * rule.floor)
            )
            if rule.signal == TEMP_EXCESS:
                margin = rule.limit - np.nan_to_num(d[:, -1], nan=-np.inf)
            else:
                margin = rule.limit - now
            ttf = np.where(sign, np.maximum(margin, 0.0) / np.maximum(g, 1e-9), np.inf)
            active[:, j] = sign
            sign_ttf[:, j] = ttf
            rate[:, j] = now
            before[:, j] = np.nan_to_num(x[:, -TREND_DAYS], nan=0.0)
            growth[:, j] = g
            rising[:, j] = _days_rising(x, 0.5 * rule.floor)
            # A gauge (°C, hours) is not a count: steady when it rose on each of the last
            # two days by at least half its floor.
            step = np.diff(np.nan_to_num(x[:, -3:], nan=0.0), axis=1)
            steady[:, j] = sign & (step >= 0.5 * rule.floor).all(axis=1)
            seasoned[:, j] = sign
            continue
        tail = np.nan_to_num(d[:, -TREND_DAYS:], nan=0.0)
        now = tail[:, -1]
        # The floor, on top of twice the component's own usual rate (its median day before
        # the trend window): a GPU that always logs 10-20 SBE a day sits at the fixed floor,
        # so is "present" every day and "growing" at its first burst (a false drain, seed 2).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no day before: no baseline
            usual = np.nanmedian(d[:, : -TREND_DAYS - 1], axis=1)
        floor = rule.floor + USUAL_FACTOR * np.nan_to_num(usual, nan=0.0)
        present = (tail >= floor[:, None]).sum(axis=1)
        recent = tail[:, -2:].sum(axis=1)
        earlier = tail[:, :2].sum(axis=1)
        g = _slope(np.log1p(tail))
        # Still growing from yesterday to today (both whole days): a plateau (a step up that
        # stays flat, what a loose cable or a noisy neighbour gives) has ~0 here even when the
        # 4-day slope, which sees the step, is steep.
        lately = np.log1p(tail[:, -1]) - np.log1p(tail[:, -2])
        before_rise = np.log1p(tail[:, -2]) - np.log1p(tail[:, -3])
        days_up = _days_rising(d, floor)
        sign = (
            (present >= PERSIST_MIN_DAYS)
            & (now >= floor)
            & (recent >= RISE_RATIO * (earlier + floor))
            & (g >= MIN_GROWTH)
            & (lately >= np.maximum(LATELY_MIN_GROWTH, LATELY_SIGMAS / np.sqrt(tail[:, -2] + 1.0)))
            & (days_up >= RISING_MIN_DAYS)
        )
        g_eff = np.clip(g, *GROWTH_CLIP)
        r_now = np.maximum(now, 1e-9)
        if rule.mode == "headroom":
            left = rule.limit - np.nan_to_num(batch.level.get(rule.signal, np.zeros(n)), nan=0.0)
            left = np.maximum(left, 0.0)
            # Cumulative r·(e^{g t} − 1)/g reaches the rows left.
            ttf = np.log1p(left * g_eff / r_now) / g_eff
        else:
            ttf = np.where(
                now >= rule.limit, 0.0, np.log(np.maximum(rule.limit / r_now, 1.0)) / g_eff
            )
        active[:, j] = sign
        sign_ttf[:, j] = np.where(sign, ttf, np.inf)
        rate[:, j] = now
        before[:, j] = tail[:, 0]
        growth[:, j] = g
        rising[:, j] = days_up
        seasoned[:, j] = sign & (tail[:, 0] >= floor)
        # Both of the last two rises beyond noise: a log-ratio of two Poisson counts a and b
        # has a standard deviation of about √(1/a + 1/b).
        sd_1 = np.sqrt(1.0 / (tail[:, -1] + 1.0) + 1.0 / (tail[:, -2] + 1.0))
        sd_2 = np.sqrt(1.0 / (tail[:, -2] + 1.0) + 1.0 / (tail[:, -3] + 1.0))
        # Exponential growth rises by about the same factor every day; a step (a reseated
        # cable's errors, a noisy neighbour) jumps once — often over a partial first day —
        # then stays flat: its last rise is a small fraction of the one before.
        sustained[:, j] = sign & (lately >= SUSTAINED_SHARE * before_rise)
        steady[:, j] = (
            sign
            & (tail[:, -3] >= floor)
            & (before_rise >= np.maximum(LATELY_MIN_GROWTH, STEADY_SIGMAS * sd_2))
            & (lately >= STEADY_SIGMAS * sd_1)
            & sustained[:, j]
        )
    ttf_days = sign_ttf.min(axis=1) if r else np.full(n, np.inf)
    horizons = np.asarray(HORIZONS_DAYS, dtype=np.float64)
    # Per sign, risk within h: logistic in (h − ttf), wider for a further ttf.
    finite = np.where(np.isfinite(sign_ttf), sign_ttf, 1e6)
    width = 0.3 * finite + 0.5
    p = _sigmoid((horizons[None, None, :] - finite[:, :, None]) / width[:, :, None])
    p = np.where(active[:, :, None], p, 0.0)
    risk = 1.0 - np.prod(1.0 - p, axis=1)
    n_signs = (active & sustained).sum(axis=1)
    strong = (
        (np.where(active, rising, 0) >= STRONG_SIGN_DAYS)
        | (steady & (rising >= STRONG_SIGN_DAYS - 1))
        | (seasoned & (rising >= STRONG_SIGN_DAYS - 1) & (sign_ttf <= SOON_DAYS))
    ).any(axis=1)
    capped = (n_signs < 2) & ~strong
    risk = np.where(capped[:, None], np.minimum(risk, SINGLE_SIGN_RISK_CAP), risk)
    level = np.zeros(n, dtype=np.int64)
    level[risk[:, 2] >= WATCH_RISK] = 1
    level[risk[:, 2] >= DRAIN_RISK] = 2
    level[(risk[:, 0] >= URGENT_RISK_1D) & (level == 2)] = 3
    return BatchForecast(
        batch, risk, ttf_days, level, active, sign_ttf, rate, before, growth, rising
    )


# --- one component's forecast, explained ------------------------------------------------------


def _fmt(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 3)


def component_result(fc: BatchForecast, i: int, chart_days: int = LOOKBACK_DAYS) -> dict[str, Any]:
    """The forecast of component i as JSON: risk, ttf, level and the evidence — each sign's
    signal, value now and three days ago, growth, the threshold it heads for and when — and
    the daily series of every rule signal for the charts."""
    b = fc.batch
    rules = RULES[b.kind]
    evidence = []
    for j, rule in enumerate(rules):
        if not fc.active[i, j]:
            continue
        g = float(fc.growth[i, j])
        evidence.append(
            {
                "signal": rule.signal,
                "label": rule.label,
                "now": _fmt(fc.rate[i, j]),
                "three_days_ago": _fmt(fc.before[i, j]),
                "unit": rule.unit,
                "growth_per_day": _fmt(g),
                "doubling_days": _fmt(math.log(2) / g)
                if rule.mode in ("rate", "headroom") and g > 0
                else None,
                "days_rising": int(fc.days_rising[i, j]),
                "threshold": rule.limit,
                "heading_for": rule.heading_for,
                "ttf_days": _fmt(fc.sign_ttf[i, j]),
            }
        )
    series = {}
    for rule in rules:
        d = b.daily.get(rule.signal)
        if d is None:
            continue
        series[rule.signal] = [
            None if not np.isfinite(v) else round(float(v), 3) for v in d[i, -chart_days:]
        ]
    ttf = float(fc.ttf_days[i])
    return {
        "kind": b.kind,
        "key": b.keys[i],
        "node": b.nodes[i],
        "level": LEVELS[int(fc.level[i])],
        "risk": {f"{h}d": round(float(fc.risk[i, k]), 3) for k, h in enumerate(HORIZONS_DAYS)},
        "ttf_hours": None if not math.isfinite(ttf) else round(ttf * 24.0, 1),
        "evidence": evidence,
        "daily": series,
        "end_ts": b.end_ts,
    }


def summary_text(result: dict[str, Any]) -> str:
    """One line naming each sign, its trend and the threshold it heads for."""
    if not result["evidence"]:
        return "no sign of degradation"
    parts = []
    for e in result["evidence"]:
        trend = f", doubling every {e['doubling_days']:.1f} d" if e.get("doubling_days") else ""
        parts.append(
            f"{e['label']} {e['now']:g}{e['unit']} (3 days ago {e['three_days_ago']:g}{trend})"
            f" heading for {e['heading_for']}"
        )
    ttf = result["ttf_hours"]
    when = f"; estimated time to failure {ttf:.0f} h" if ttf is not None else ""
    return "; ".join(parts) + when


# How each rule signal's hourly values become a day: counters' increases and throttled hours
# add up; the temperature's daily peak; the link width's daily minimum.
DAILY_AGG: dict[str, str] = {TEMP_EXCESS: "max", LINK_WIDTH: "min"}


def build_batch(
    kind: str,
    keys: list[str],
    nodes: list[str],
    end_ts: float,
    hourly: dict[str, np.ndarray],
    level: dict[str, np.ndarray] | None = None,
) -> ComponentBatch:
    """A batch from hourly values of the kind's rule signals (counters as increases —
    `counter_increase` — throttling as `throttled_hours`, the temperature's hourly max, the
    link width's hourly min), the last hour ending at end_ts."""
    wanted = {r.signal for r in RULES[kind]}
    per_day = {
        name: daily(arr, DAILY_AGG.get(name, "sum"))
        for name, arr in hourly.items()
        if name in wanted
    }
    temp = hourly.get(TEMP_EXCESS)
    if TEMP_EXCESS in wanted and temp is not None:
        temp = np.asarray(temp, dtype=np.float64)
        per_day[TEMP_ABOVE_PEERS] = daily(temp - _node_median(temp, nodes), "mean")
    return ComponentBatch(kind, keys, nodes, end_ts, per_day, level or {})
