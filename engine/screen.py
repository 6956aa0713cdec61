"""A cheap look at each stored batch for signs that a job's verdict may be due now.

The detectors (engine.detectors) need a job's window and cost milliseconds per GPU; running
them every few seconds on every job of a fleet would cost more than the product may (≤ 0.1
core per 1,000 GPUs). Most jobs, most of the time, are fine and unchanged: they are evaluated
on a routine pass (every 30 s). A job whose newest batch shows a sign below is evaluated within
seconds instead, so its verdict comes while the fault is fresh:

- an event (XID, throttle, link down, …) on its node;
- a log line of the kinds verdicts are made of: errors and tracebacks, timeouts, a
  non-finite value, a checkpoint starting, or a loss ≥ 1.5× the lowest the job printed;
- a cumulative error counter that moved (double-bit ECC, row remaps, NVLink/PCIe/InfiniBand
  errors);
- hardware throttling (HW slowdown, HW thermal, power brake);
- a level change of SM or engine activity, GPU utilisation, power or SM clock: the ~5 s mean
  (EWMA) ≥ 25% off the ~30 s one;
- one GPU of a node drifting from its peers: its SM activity ≥ 6% off theirs, or the rank's
  synchronize time ≥ 60% off (smoothed over ~10 s);
- a level change or a drift is a sign for the 20 s after it began, then not until it has
  come back and changed anew;
- the job's first minute (verdicts about how a job runs from its start have no change to see).

A sign only brings an evaluation forward; the verdict is the detectors' alone, so a false sign
costs an evaluation, never a false verdict, and a missed one costs the wait for the routine
pass. The state (a running mean per series, the lowest loss per job) is bounded (least
recently seen dropped first) and starts empty after a restart: the first batches of a series
only set its baseline.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import signals
from contract.rows import SeriesInfo

# A level change: the series' recent mean (EWMA, 30% per batch: about the last 5 s) ≥ 25% off
# its long mean (EWMA, 3% per batch: about the last 30 s). Healthy training's 1 s GPU
# utilisation swings by tens of points at a save or an evaluation loop, an inference server's
# with its request bursts; a stall, a hang or a starved loader moves it for good. Values
# within ABS_FLOOR of the mean never count (a near-zero signal's relative change means nothing).
LEVEL_CHANGE = 0.25
ABS_FLOOR = 1.0
# …0.01 for the profiling fields, which are ratios (0–1) rather than percentages or watts.
RATIO_FLOOR = 0.01
EWMA_ALPHA = 0.3
SLOW_ALPHA = 0.03
# A GPU whose SM activity stays ≥ 6% off its node's peers (EWMA, 10% per batch: about the
# last 10 s) is drifting. Measured on the simulator's healthy jobs (1 s samples, after start-
# up): per-sample gaps have an sd of 4.3%, the smoothed gap's p99 is 3.6%; a straggler's SM
# activity leads its peers' by 10-16% (it computes while they wait). Tensor activity (an
# inference server's swings by 15% a sample), engine activity and utilisation (GPUs idle at
# different moments of a save) are too noisy between peers to say so.
PEER_GAP = 0.06
PEER_ALPHA = 0.1
# A printed loss ≥ 1.5× the job's lowest is a sign (the divergence rule needs ≥ 2×, then
# staying ≥ 1.5×; the sign comes first).
LOSS_RISE = 1.5
# The rank's synchronize time swings with whichever rank was slowest at each step (healthy
# jobs' smoothed gaps reach 45% at p99); a straggler's is 80-90% below its peers' (they wait
# for it, it never waits).
PEER_GAP_SYNC = 0.6
# A drift (or a level change) is a sign for the 20 s after it began — long enough for the
# detectors' evidence on a straggler, a stall or a starved loader to accumulate — then no
# longer: a GPU that stays a little off its peers without a verdict (rank 0 doing a little
# extra work), or a long mean still catching up with a job's ramp-up, would otherwise keep the
# job on the 2 s cadence for ever. It is a sign again once it has come back (within half the
# threshold) and changed anew.
PEER_HOLD_S = 20.0
# A job is evaluated within seconds through its first minute too: some verdicts are about how
# the job runs from its start (an inference server that never fills its batches), with no
# change to see.
YOUNG_S = 60.0
MAX_SERIES = 500_000
MAX_JOBS = 50_000

_PEER_SIGNALS = frozenset({signals.DCGM_FI_PROF_SM_ACTIVE, signals.CUDA_SYNC_MS})
# Level changes are looked for on the signals verdicts are made of; others (launch counts, the
# longest launch gap, memory used) swing from second to second in healthy jobs.
# The synchronize time is compared with the peers' only: on its own it swings with whichever
# rank was slowest at each step. Tensor activity is not among them: an inference server's
# swings with its request bursts by 15% a sample, which read as a level change on 102–288 of
# 600 healthy batches (an evaluation every ~10 s instead of ~19 s), and every stall, hang or
# starved loader it would show moves SM activity and utilisation as well (every fault
# scenario still shows a sign within 5 s of its onset: engine/tests/test_screen.py).
_LEVEL_SIGNALS = frozenset(
    {
        signals.DCGM_FI_PROF_SM_ACTIVE,
        signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        signals.DCGM_FI_DEV_GPU_UTIL,
        signals.DCGM_FI_DEV_POWER_USAGE,
        signals.DCGM_FI_DEV_SM_CLOCK,
    }
)
# Cumulative counters that count errors (traffic and token counters move all the time). SBE
# counts are fleet health's (gpu_degrading, evaluated on its own schedule), not a job's.
_ERROR_COUNTER_MARKS = ("DBE", "REMAP", "CRC", "REPLAY", "RECOVERY", "ERROR", "DOWNED", "DISCARD")


def _episode(since: float | None, gap: float, limit: float, now: float) -> float | None:
    """When the current excursion began: it begins when `gap` passes `limit` and ends once it
    is back within half of it (hysteresis: a gap hovering at the limit does not flicker)."""
    if gap < limit / 2:
        return None
    if since is None and gap >= limit:
        return now
    return since


def _fresh(since: float | None, now: float) -> bool:
    """An excursion is a sign for PEER_HOLD_S after it began."""
    return since is not None and now - since <= PEER_HOLD_S


def _floor(name: str) -> float:
    return RATIO_FLOOR if name.startswith(signals.DCGM_PROF_PREFIX) else ABS_FLOOR


# What the screen does with a signal, decided once per name (a batch of one 4-GPU node holds
# ~400 series; classifying each name anew was half the screen's time).
_SKIP, _THROTTLE, _ERROR_COUNTER, _LEVEL = 0, 1, 2, 3


def _kind_of(name: str) -> int:
    if name == signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS:
        return _THROTTLE
    if signals.is_cumulative(name):
        upper = name.upper()
        return _ERROR_COUNTER if any(m in upper for m in _ERROR_COUNTER_MARKS) else _SKIP
    return _LEVEL if name in _LEVEL_SIGNALS else _SKIP


_HW_THROTTLE = (
    signals.THROTTLE_HW_SLOWDOWN | signals.THROTTLE_HW_THERMAL | signals.THROTTLE_HW_POWER_BRAKE
)
_LOG_SIGN = re.compile(
    r"error|exception|traceback|timed? ?out|timeout|\bnan\b|\binf\b|killed|watchdog|"
    r"saving|checkpoint|xid|nccl warn|out of memory",
    re.IGNORECASE,
)
_LOSS = re.compile(
    r"""loss['"]?\s*[:=]?\s*['"]?([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)""", re.IGNORECASE
)


@dataclass
class Signs:
    """What looked due, with the first reason seen: job ids, and nodes (for samples and events
    that carry no job). `lasting` signs are conditions that can hold for a while (a throttling
    GPU, a level changed, a GPU drifting from its peers); the others are happenings (an event,
    an error line, a counter that moved, a loss that rose, the job's first minute).
    `prompt_jobs`/`prompt_nodes` are those with at least one happening: the scheduler backs
    off repeated evaluations of a job whose signs are only lasting ones and whose verdicts do
    not change (investigations/services.py, URGENT_MAX_S), never a happening's."""

    jobs: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    prompt_jobs: set[str] = field(default_factory=set)
    prompt_nodes: set[str] = field(default_factory=set)

    def add(self, job: str, node: str, reason: str, *, lasting: bool = False) -> None:
        if job:
            self.jobs.setdefault(job, reason)
            if not lasting:
                self.prompt_jobs.add(job)
        elif node:
            self.nodes.setdefault(node, reason)
            if not lasting:
                self.prompt_nodes.add(node)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.nodes)


class BatchScreen:
    """Per process (ingest's), shared by its writer threads."""

    def __init__(self, max_series: int = MAX_SERIES, max_jobs: int = MAX_JOBS) -> None:
        # cumulative error counter → its last value
        self._counter_last: OrderedDict[SeriesInfo, float] = OrderedDict()
        # (node, signal, GPU or pid) → (EWMA of its gap to the peers, when it began drifting)
        self._gaps: OrderedDict[Any, tuple[float, float | None]] = OrderedDict()
        self._low_loss: OrderedDict[str, float] = OrderedDict()
        self._first_seen: OrderedDict[str, float] = OrderedDict()
        # series → (recent mean, long mean, when the gap between them opened)
        self._levels: OrderedDict[SeriesInfo, tuple[float, float, float | None]] = OrderedDict()
        self._kinds: dict[str, int] = {}  # signal name → what the screen does with it
        self._max_series = max_series
        self._max_jobs = max_jobs
        self._lock = threading.Lock()
        self.cpu_s = 0.0  # thread CPU time spent looking, summed (what the screen costs)
        self.batches = 0

    def look(
        self,
        series: Sequence[SeriesInfo],
        counts: np.ndarray,
        values: np.ndarray,
        logs: Sequence[dict[str, Any]] = (),
        events: Sequence[dict[str, Any]] = (),
        ts_ms: np.ndarray | None = None,
    ) -> Signs:
        """The signs in one batch: its series (identity, samples per series, values and
        timestamps in series order) and its log and event records (ingest's decoded dicts)."""
        began = time.thread_time()
        signs = Signs()
        for e in events:
            signs.add(str(e.get("job") or ""), str(e.get("node") or ""), f"event {e.get('name')}")
        with self._lock:
            self._look_logs(logs, signs)
            if len(values) and ts_ms is not None and len(ts_ms):
                first, last = float(ts_ms.min()) / 1e3, float(ts_ms.max()) / 1e3
                self._look_series(series, counts, values, signs, last)
                self._look_young(series, first, last, signs)
            elif len(values):  # no timestamps: no episode has a time to be fresh by
                self._look_series(series, counts, values, signs, 0.0)
            self.cpu_s += time.thread_time() - began
            self.batches += 1
        return signs

    # --- logs ------------------------------------------------------------------------------
    def _look_logs(self, logs: Sequence[dict[str, Any]], signs: Signs) -> None:
        for row in logs:
            line = str(row.get("line") or "")
            job = str(row.get("job") or "")
            if _LOG_SIGN.search(line):
                signs.add(job, str(row.get("node") or ""), "log line")
                continue
            if not job:
                continue
            m = _LOSS.search(line)
            if m is None:
                continue
            loss = float(m.group(1))
            low = self._low_loss.get(job)
            if low is None or loss < low:
                self._low_loss[job] = loss
                self._low_loss.move_to_end(job)
                while len(self._low_loss) > self._max_jobs:
                    self._low_loss.popitem(last=False)
            elif low > 0 and loss >= LOSS_RISE * low:
                signs.add(job, "", "loss rose")

    def _look_young(
        self, series: Sequence[SeriesInfo], first: float, last: float, signs: Signs
    ) -> None:
        for job in {info.job for info in series if info.job}:
            began = self._first_seen.get(job)
            if began is None:
                began = self._first_seen[job] = first
                while len(self._first_seen) > self._max_jobs:
                    self._first_seen.popitem(last=False)
            self._first_seen.move_to_end(job)
            if last - began < YOUNG_S:
                signs.add(job, "", "young job")

    # --- series ----------------------------------------------------------------------------
    def _look_series(
        self,
        series: Sequence[SeriesInfo],
        counts: np.ndarray,
        values: np.ndarray,
        signs: Signs,
        now: float,
    ) -> None:
        nonzero = np.flatnonzero(counts)
        if not len(nonzero):
            return
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))[nonzero]
        finite = np.where(np.isfinite(values), values, 0.0)
        sums = np.add.reduceat(finite, starts)
        n = counts[nonzero].astype(np.float64)
        means = sums / n
        lasts = values[starts + counts[nonzero] - 1]
        firsts = values[starts]
        peers: dict[tuple[str, str], list[tuple[SeriesInfo, float]]] = {}
        kinds = self._kinds
        for k, idx in enumerate(nonzero.tolist()):
            info = series[idx]
            name = info.name
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = _kind_of(name)
            if kind == _SKIP:
                continue
            if kind == _THROTTLE:
                last_reasons = float(lasts[k])
                if np.isfinite(last_reasons) and int(last_reasons) & _HW_THROTTLE:
                    signs.add(info.job, info.node, "hardware throttling", lasting=True)
                continue
            mean = float(means[k])
            if kind == _ERROR_COUNTER:
                before = self._counter_last.get(info)
                last = float(lasts[k])
                if (before is not None and last > before) or float(firsts[k]) < last:
                    signs.add(info.job, info.node, f"{name} moved")
                self._remember_counter(info, last)
                continue
            held = self._levels.get(info)
            changed: float | None = None
            if held is None:
                fast = slow = mean
            else:
                fast = held[0] + EWMA_ALPHA * (mean - held[0])
                slow = held[1] + SLOW_ALPHA * (mean - held[1])
                limit = max(LEVEL_CHANGE * abs(slow), _floor(name))
                changed = _episode(held[2], abs(fast - slow), limit, now)
                if _fresh(changed, now):
                    signs.add(info.job, info.node, f"{name} changed level", lasting=True)
            self._levels[info] = (fast, slow, changed)
            self._levels.move_to_end(info)
            if name in _PEER_SIGNALS and (info.gpu or info.pid):
                peers.setdefault((info.node, name), []).append((info, mean))
        for (node, name), rows in peers.items():
            if len(rows) < 2:
                continue
            level = float(np.mean([m for _, m in rows]))
            if level <= _floor(name):
                continue
            limit = PEER_GAP_SYNC if name == signals.CUDA_SYNC_MS else PEER_GAP
            for info, mean in rows:
                key = (node, name, info.gpu or str(info.pid))
                gap = mean / level - 1.0
                prior = self._gaps.get(key)
                # From 0, not from the first gap: one sample's jitter is not a drift.
                held_drift = 0.0 if prior is None else prior[0]
                drift = held_drift + PEER_ALPHA * (gap - held_drift)
                began = _episode(None if prior is None else prior[1], abs(drift), limit, now)
                self._gaps[key] = (drift, began)
                self._gaps.move_to_end(key)
                if _fresh(began, now):
                    signs.add(info.job, node, f"{name} drifting from its peers", lasting=True)
        for held_map in (self._gaps, self._levels):
            while len(held_map) > self._max_series:
                held_map.popitem(last=False)

    def _remember_counter(self, info: SeriesInfo, value: float) -> None:
        self._counter_last[info] = value
        self._counter_last.move_to_end(info)
        while len(self._counter_last) > self._max_series:
            self._counter_last.popitem(last=False)


# The process's screen: ingest's receivers feed it every stored batch (one per ingest process:
# the running means are of what that process stored).
SCREEN = BatchScreen()
