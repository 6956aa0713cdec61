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
- one GPU of a node drifting from its peers: its SM activity ≥ 6% off theirs (smoothed over
  ~10 s);
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
from collections.abc import Hashable, Sequence
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

# The rank's synchronize time is not compared with its peers': it swings with whichever rank
# was slowest at each step, and a 60% gap (a straggler's is 80-90% below its peers': they wait
# for it) drifted on 29 of 300 batches of a healthy 8-GPU job; a straggler's SM activity
# drifts as well.
_PEER_SIGNALS = frozenset({signals.DCGM_FI_PROF_SM_ACTIVE})
# Level changes are looked for on the signals verdicts are made of; others (launch counts, the
# longest launch gap, memory used) swing from second to second in healthy jobs.
# Tensor activity is not among them: an inference server's
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
# Counters whose every increment is a fault (uncorrectable ECC, failed or uncorrectable row
# remaps, a link that went down): happenings. The others count errors the hardware corrected
# or retried (NVLink CRC, PCIe replays, InfiniBand symbol, receive and recovery errors,
# correctable remaps), which healthy links and GPUs trickle: notices. On the fleet bench a
# healthy 200-GPU job whose nodes' InfiniBand ports trickled symbol errors (395 of 400 s) was
# evaluated every ~7 s at the happenings' share, 32 of 56 s of all evaluation CPU.
_FAULT_COUNTER_MARKS = ("DBE", "REMAP_FAILURE", "UNCORRECTABLE", "DOWNED")


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
    # Not Megatron's "number of nan iterations:   0", which every one of its iteration lines
    # prints: on the fleet bench a 200-GPU Megatron job was evaluated every 6-10 s on them, a
    # third of all evaluation CPU (a count above 0 is still a sign).
    r"error|exception|traceback|timed? ?out|timeout|\bnan\b(?!\s+iterations:\s*0\b)|\binf\b|"
    r"killed|watchdog|xid|nccl warn|out of memory",
    re.IGNORECASE,
)
# Lines a healthy job prints in its normal course that a family still needs seen soon (a
# save's start and end bound checkpoint_stall's evidence): notices, held to a smaller share of
# a costly job's CPU than the happenings above (investigations/cadence.py NOTICE_CPU_SHARE).
_LOG_NOTICE = re.compile(r"saving|checkpoint", re.IGNORECASE)
_LOSS = re.compile(
    r"""loss['"]?\s*[:=]?\s*['"]?([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)""", re.IGNORECASE
)


@dataclass
class Signs:
    """What looked due, with the first reason seen: job ids, and nodes (for samples and events
    that carry no job). `lasting` signs are conditions that can hold for a while (a throttling
    GPU, a level changed, a GPU drifting from its peers); the others are happenings (an event,
    an error line, a fault counter that moved, a loss that rose) or notices (a save's log
    line, the job's first minute, a corrected-error counter that moved: what a healthy job
    shows in its normal course).
    `prompt_jobs`/`prompt_nodes` are those with at least one happening or notice: the
    scheduler backs off repeated evaluations of a job whose signs are only lasting ones and
    whose verdicts do not change (investigations/services.py, URGENT_MAX_S), never theirs.
    `severe_jobs`/`severe_nodes` are the prompt ones with a happening, not only notices (a
    corrected error counted: InfiniBand symbol errors, PCIe replays, NVLink CRC): a costly
    job's notices are held to a smaller share of a core than its happenings (cadence.py)."""

    jobs: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    prompt_jobs: set[str] = field(default_factory=set)
    prompt_nodes: set[str] = field(default_factory=set)
    severe_jobs: set[str] = field(default_factory=set)
    severe_nodes: set[str] = field(default_factory=set)

    def add(
        self, job: str, node: str, reason: str, *, lasting: bool = False, notice: bool = False
    ) -> None:
        if job:
            self.jobs.setdefault(job, reason)
            if not lasting:
                self.prompt_jobs.add(job)
                if not notice:
                    self.severe_jobs.add(job)
        elif node:
            self.nodes.setdefault(node, reason)
            if not lasting:
                self.prompt_nodes.add(node)
                if not notice:
                    self.severe_nodes.add(node)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.nodes)


@dataclass
class _Layout:
    """What the screen does with each series of one batch layout (the series, in order, that
    one agent's batches carry): positions by kind and each series' state slot. Built once per
    layout; a node's batches repeat theirs, so a batch costs array operations, not a Python
    step per series (one per series was 6.8 ms a 25-node agent batch in the fleet bench)."""

    series: list[SeriesInfo]
    jobs: frozenset[str]
    throttle: np.ndarray  # positions
    counter: np.ndarray  # positions of cumulative error counters...
    counter_slot: np.ndarray  # ...and their state slots
    counter_fault: np.ndarray  # ...and whether an increment is a fault (else a notice)
    level: np.ndarray
    level_slot: np.ndarray
    level_floor: np.ndarray
    peer: np.ndarray  # positions of the peer-compared series (with a GPU or a pid)...
    peer_slot: np.ndarray
    peer_group: np.ndarray  # ...and their (node, signal) group
    group_floor: np.ndarray
    group_node: list[str]


class BatchScreen:
    """Per process (ingest's), shared by its writer threads.

    State lives in arrays indexed by a slot per series (SeriesInfo → slot): a series keeps its
    running means whichever layout of batches brings it. At most `max_series` slots: past it,
    the tenth least recently seen are freed (their series start a new baseline when seen
    again), as after a restart."""

    def __init__(self, max_series: int = MAX_SERIES, max_jobs: int = MAX_JOBS) -> None:
        # a series' SeriesInfo → its slot; a peer-compared one's drift is kept by (node,
        # signal, GPU or pid) instead, so it carries over when the series' job key changes
        self._slots: dict[Hashable, int] = {}
        self._slot_info: list[Hashable | None] = []
        self._free: list[int] = []
        cap = 1024
        # NaN: no state yet (a series' first batch only sets its baseline)
        self._counter_last = np.full(cap, np.nan)
        self._fast = np.full(cap, np.nan)
        self._slow = np.full(cap, np.nan)
        self._level_since = np.full(cap, np.nan)  # when the level gap opened
        self._drift = np.full(cap, np.nan)  # EWMA of the gap to the peers
        self._drift_since = np.full(cap, np.nan)  # when it began drifting
        self._seen = np.zeros(cap, dtype=np.int64)  # batch number it was last seen in
        self._layouts: OrderedDict[tuple[Any, ...], _Layout] = OrderedDict()
        self._low_loss: OrderedDict[str, float] = OrderedDict()
        self._first_seen: OrderedDict[str, float] = OrderedDict()
        self._kinds: dict[str, int] = {}  # signal name → what the screen does with it
        self._max_series = max_series
        self._max_jobs = max_jobs
        self._lock = threading.Lock()
        self.cpu_s = 0.0  # thread CPU time spent looking, summed (what the screen costs)
        self.batches = 0

    @property
    def held_series(self) -> int:
        """Series with state (bounded by `max_series`)."""
        return len(self._slots)

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
            self.batches += 1
            self._look_logs(logs, signs)
            if len(values) and len(series):
                layout = self._layout(series)
                if ts_ms is not None and len(ts_ms):
                    first, last = float(ts_ms.min()) / 1e3, float(ts_ms.max()) / 1e3
                    self._look_series(layout, counts, values, signs, last)
                    self._look_young(layout, first, last, signs)
                else:  # no timestamps: no episode has a time to be fresh by
                    self._look_series(layout, counts, values, signs, 0.0)
            self.cpu_s += time.thread_time() - began
        return signs

    # --- logs ------------------------------------------------------------------------------
    def _look_logs(self, logs: Sequence[dict[str, Any]], signs: Signs) -> None:
        for row in logs:
            line = str(row.get("line") or "")
            job = str(row.get("job") or "")
            if _LOG_SIGN.search(line):
                signs.add(job, str(row.get("node") or ""), "log line")
                continue
            if _LOG_NOTICE.search(line):
                signs.add(job, str(row.get("node") or ""), "save line", notice=True)
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

    def _look_young(self, layout: _Layout, first: float, last: float, signs: Signs) -> None:
        for job in layout.jobs:
            began = self._first_seen.get(job)
            if began is None:
                began = self._first_seen[job] = first
                while len(self._first_seen) > self._max_jobs:
                    self._first_seen.popitem(last=False)
            self._first_seen.move_to_end(job)
            if last - began < YOUNG_S:
                signs.add(job, "", "young job", notice=True)

    # --- layouts and slots -----------------------------------------------------------------
    def _layout(self, series: Sequence[SeriesInfo]) -> _Layout:
        """The layout of this batch's series: the held one when the batch repeats it (one
        comparison of the lists), else built, its series given slots."""
        key = (len(series), series[0], series[-1])
        held = self._layouts.get(key)
        if held is not None and held.series == series:
            self._layouts.move_to_end(key)
            return held
        layout = self._build_layout(list(series))
        self._layouts[key] = layout
        while len(self._layouts) > max(64, self._max_series // 64):
            self._layouts.popitem(last=False)
        return layout

    def _slot(self, info: Hashable) -> int:
        slot = self._slots.get(info)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self._slot_info[slot] = info
        else:
            slot = len(self._slot_info)
            self._slot_info.append(info)
            if slot >= len(self._seen):
                self._grow(2 * len(self._seen))
        self._slots[info] = slot
        for state in self._state_arrays():
            state[slot] = np.nan
        self._seen[slot] = self.batches
        return slot

    def _state_arrays(self) -> tuple[np.ndarray, ...]:
        return (
            self._counter_last,
            self._fast,
            self._slow,
            self._level_since,
            self._drift,
            self._drift_since,
        )

    def _grow(self, capacity: int) -> None:
        def grown(a: np.ndarray, fill: float) -> np.ndarray:
            out = np.full(capacity, fill, dtype=a.dtype)
            out[: len(a)] = a
            return out

        self._counter_last = grown(self._counter_last, np.nan)
        self._fast = grown(self._fast, np.nan)
        self._slow = grown(self._slow, np.nan)
        self._level_since = grown(self._level_since, np.nan)
        self._drift = grown(self._drift, np.nan)
        self._drift_since = grown(self._drift_since, np.nan)
        self._seen = grown(self._seen, 0)

    def _make_room(self, new: int) -> None:
        """Before `new` series get slots past `max_series`: free at least the tenth least
        recently seen; the layouts that used them are rebuilt when next seen."""
        held = len(self._slots)
        if held + new <= self._max_series:
            return
        used = np.array(list(self._slots.values()), dtype=np.int64)
        drop = min(held, max(held + new - self._max_series, held // 10))
        oldest = used[np.argsort(self._seen[used], kind="stable")[:drop]]
        for slot in oldest.tolist():
            info = self._slot_info[slot]
            if info is not None:
                del self._slots[info]
            self._slot_info[slot] = None
            self._free.append(slot)
        self._layouts.clear()

    def _build_layout(self, series: list[SeriesInfo]) -> _Layout:
        kinds = self._kinds
        throttle: list[int] = []
        counter: list[int] = []
        level: list[int] = []
        peer: list[int] = []
        groups: dict[tuple[str, str], int] = {}
        peer_group: list[int] = []
        for pos, info in enumerate(series):
            name = info.name
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = _kind_of(name)
            if kind == _THROTTLE:
                throttle.append(pos)
            elif kind == _ERROR_COUNTER:
                counter.append(pos)
            elif kind == _LEVEL:
                level.append(pos)
            if name in _PEER_SIGNALS and (info.gpu or info.pid):
                peer.append(pos)
                peer_group.append(groups.setdefault((info.node, name), len(groups)))
        peer_keys = [_peer_key(series[p]) for p in peer]
        self._make_room(
            sum(1 for p in {*counter, *level} if series[p] not in self._slots)
            + sum(1 for k in peer_keys if k not in self._slots)
        )
        slot = self._slot

        def slots(positions: list[int]) -> np.ndarray:
            return np.array([slot(series[p]) for p in positions], dtype=np.int64)

        group_names = [name for _, name in groups]
        return _Layout(
            series=series,
            jobs=frozenset(info.job for info in series if info.job),
            throttle=np.array(throttle, dtype=np.int64),
            counter=np.array(counter, dtype=np.int64),
            counter_slot=slots(counter),
            counter_fault=np.array(
                [any(m in series[p].name.upper() for m in _FAULT_COUNTER_MARKS) for p in counter],
                dtype=bool,
            ),
            level=np.array(level, dtype=np.int64),
            level_slot=slots(level),
            level_floor=np.array([_floor(series[p].name) for p in level], dtype=np.float64),
            peer=np.array(peer, dtype=np.int64),
            peer_slot=np.array([slot(k) for k in peer_keys], dtype=np.int64),
            peer_group=np.array(peer_group, dtype=np.int64),
            group_floor=np.array([_floor(name) for name in group_names], dtype=np.float64),
            group_node=[node for node, _ in groups],
        )

    # --- series ----------------------------------------------------------------------------
    def _look_series(
        self, layout: _Layout, counts: np.ndarray, values: np.ndarray, signs: Signs, now: float
    ) -> None:
        n = len(layout.series)
        counts = np.asarray(counts, dtype=np.int64)
        nonzero = counts > 0
        if not nonzero.any():
            return
        ends = np.cumsum(counts)
        starts = ends - counts
        # Per-series mean (a NaN sample counts as 0, as stored samples are finite), first and
        # last value, for the series with samples in this batch.
        finite = np.where(np.isfinite(values), values, 0.0)
        nz = np.flatnonzero(nonzero)
        sums = np.add.reduceat(finite, starts[nz]) if len(finite) else np.zeros(len(nz))
        mean = np.full(n, np.nan)
        mean[nz] = sums / counts[nz]
        last = np.full(n, np.nan)
        last[nz] = values[ends[nz] - 1]
        first = np.full(n, np.nan)
        first[nz] = values[starts[nz]]
        series = layout.series
        seen_slots = []

        pos = layout.throttle[nonzero[layout.throttle]]
        if len(pos):
            reasons = last[pos]
            ok = np.isfinite(reasons)
            hw = np.zeros(len(pos), dtype=bool)
            hw[ok] = (reasons[ok].astype(np.int64) & _HW_THROTTLE) != 0
            for p in pos[hw].tolist():
                info = series[p]
                signs.add(info.job, info.node, "hardware throttling", lasting=True)

        keep = nonzero[layout.counter]
        pos, slot = layout.counter[keep], layout.counter_slot[keep]
        fault = layout.counter_fault[keep]
        if len(pos):
            before, now_v = self._counter_last[slot], last[pos]
            moved = (now_v > before) | (first[pos] < now_v)  # NaN (no state) compares False
            self._counter_last[slot] = now_v
            seen_slots.append(slot)
            for p, is_fault in zip(pos[moved].tolist(), fault[moved].tolist(), strict=True):
                info = series[p]
                signs.add(info.job, info.node, f"{info.name} moved", notice=not is_fault)

        keep = nonzero[layout.level]
        pos, slot = layout.level[keep], layout.level_slot[keep]
        if len(pos):
            m = mean[pos]
            fast, slow, since = self._fast[slot], self._slow[slot], self._level_since[slot]
            fresh_series = np.isnan(fast)
            fast = np.where(fresh_series, m, fast + EWMA_ALPHA * (m - fast))
            slow = np.where(fresh_series, m, slow + SLOW_ALPHA * (m - slow))
            limit = np.maximum(LEVEL_CHANGE * np.abs(slow), layout.level_floor[keep])
            since = _episodes(since, np.abs(fast - slow), limit, now)
            since[fresh_series] = np.nan  # a first batch only sets the baseline
            self._fast[slot], self._slow[slot], self._level_since[slot] = fast, slow, since
            seen_slots.append(slot)
            for p in pos[_fresh_all(since, now)].tolist():
                info = series[p]
                signs.add(info.job, info.node, f"{info.name} changed level", lasting=True)

        keep = nonzero[layout.peer]
        if keep.any():
            self._look_peers(layout, keep, mean, signs, now)
            seen_slots.append(layout.peer_slot[keep])
        for slot in seen_slots:
            self._seen[slot] = self.batches

    def _look_peers(
        self, layout: _Layout, keep: np.ndarray, mean: np.ndarray, signs: Signs, now: float
    ) -> None:
        """Each GPU's (or rank's) gap to its node's peers on the same signal, smoothed."""
        pos, slot, group = layout.peer[keep], layout.peer_slot[keep], layout.peer_group[keep]
        m = mean[pos]
        n_groups = len(layout.group_floor)
        count = np.bincount(group, minlength=n_groups)
        level = np.bincount(group, weights=m, minlength=n_groups) / np.maximum(count, 1)
        compared = (count >= 2) & (level > layout.group_floor)
        use = compared[group]
        if not use.any():
            return
        pos, slot, group, m = pos[use], slot[use], group[use], m[use]
        gap = m / level[group] - 1.0
        # From 0, not from the first gap: one sample's jitter is not a drift.
        held = np.nan_to_num(self._drift[slot], nan=0.0)
        drift = held + PEER_ALPHA * (gap - held)
        since = _episodes(self._drift_since[slot], np.abs(drift), PEER_GAP, now)
        self._drift[slot], self._drift_since[slot] = drift, since
        series = layout.series
        fresh = _fresh_all(since, now)
        for p, g in zip(pos[fresh].tolist(), group[fresh].tolist(), strict=True):
            info = series[p]
            signs.add(
                info.job, layout.group_node[g], f"{info.name} drifting from its peers", lasting=True
            )


def _peer_key(info: SeriesInfo) -> tuple[str, str, str, str]:
    return ("peer", info.node, info.name, info.gpu or str(info.pid))


def _episodes(
    since: np.ndarray, gap: np.ndarray, limit: np.ndarray | float, now: float
) -> np.ndarray:
    """When each series' current excursion began (NaN: none under way): it begins when its
    gap passes its limit and ends once it is back within half of it (hysteresis: a gap
    hovering at the limit does not flicker)."""
    out = np.where(np.isnan(since) & (gap >= limit), now, since)
    out[gap < limit / 2] = np.nan
    return out


def _fresh_all(since: np.ndarray, now: float) -> np.ndarray:
    """An excursion is a sign for PEER_HOLD_S after it began."""
    fresh: np.ndarray = ~np.isnan(since) & (now - since <= PEER_HOLD_S)
    return fresh


# The process's screen: ingest's receivers feed it every stored batch (one per ingest process:
# the running means are of what that process stored).
SCREEN = BatchScreen()
