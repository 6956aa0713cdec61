"""Infrastructure faults seen in counters and events: `hardware_fault` (an XID/ECC/remap event
on one of the job's GPUs during its window), `fabric_degraded` (IB errors rising on a node's
port while the job's collectives slow down) and `gpu_degrading` (fleet health, per GPU)."""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.rows import EventRow
from engine.detectors.common import (
    counter_delta,
    gpu_hours,
    hhmmss,
    new_finding,
    rate_trend,
    step_seconds,
)
from engine.detectors.xids import FAULT, WARNING, xid_kind, xid_name
from engine.findings import INFRASTRUCTURE, Finding
from engine.window import GpuWindow, JobWindow

# XIDs are classed by xids.py (NVIDIA's XID catalogue): faults (48 DBE, 64 row-remap failure,
# 74 NVLink, 79 fallen off the bus, 94/95 ECC, 119/120 GSP, 140, …) hit the job; warnings (63
# remap recorded, 92 high single-bit rate) feed fleet health; application XIDs (13, 31, 43,
# 45) are the program's own errors.
# Counters whose increase alone implicates the hardware (uncorrected errors and remap
# failures); corrected ones (SBE, NVLink CRC, PCIe replays) are normal in small numbers.
FAULT_COUNTERS: tuple[str, ...] = (
    signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
    signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_ROW_REMAP_FAILURE,
)
IB_ERROR_COUNTERS: tuple[str, ...] = (
    signals.IB_SYMBOL_ERROR,
    signals.IB_LINK_DOWNED,
    signals.IB_LINK_ERROR_RECOVERY,
    signals.IB_PORT_RCV_ERRORS,
)
# Fabric: the job's collectives must be ≥ 15% slower after the errors began than before
# (time in synchronize per rank, or iteration time from the log). Day-to-day variation of a
# job's step time is a few percent.
FABRIC_MIN_SLOWDOWN = 0.15
# …measured on ≥ 4 stepping samples after the first error and ≥ 3 of the job's steps (its log's
# cadence: synchronize time comes at each step's end), and ≥ 20 before (4 s / 20 s at 1 s).
# A mean over so few samples is noisy — over 4–15 samples the synchronize time of healthy
# simulated jobs reads 1.15–3.3× its earlier mean at its worst (healthy_* scenarios, seeds
# 0–3) — so the after-mean must also exceed the mean of every equally long run of stepping
# samples before the errors (≥ 19 of them: p ≤ 5% by chance alone, on top of the port's own
# rising error counters). (After was 10 samples, and 20 before that.)
FABRIC_MIN_AFTER_SAMPLES = 4
FABRIC_MIN_AFTER_STEPS = 3.0
FABRIC_MIN_BEFORE_SAMPLES = 20
FABRIC_MIN_BEFORE_WINDOWS = 19
# gpu_degrading needs at least two independent signs: one alone (a throttling episode, a
# burst of replays) has benign explanations; two together are a GPU heading for failure.
DEGRADING_MIN_SIGNS = 2
# A counter "rises" when it increments in ≥ 3 separate samples and its rate in the last third
# of the window is ≥ 2× the first third's: growth, not a lone event and not a flat old value.
RISING_MIN_INCREMENTS = 3
RISING_RATE_RATIO = 2.0
# Recurring throttling: ≥ 2 separate episodes of HW/thermal throttle reasons.
RECURRING_MIN_EPISODES = 2
# The evidence signal of warning XIDs (63, 92, …) counted as one sign of a degrading GPU.
_WARNING_XID_SIGN = "event: xid (warning)"
_THROTTLE_BITS = (
    signals.THROTTLE_HW_SLOWDOWN
    | signals.THROTTLE_HW_THERMAL
    | signals.THROTTLE_HW_POWER_BRAKE
    | signals.THROTTLE_SW_THERMAL
)


def fault_events(w: JobWindow) -> list[EventRow]:
    """Events on the job's GPUs that are hardware evidence, oldest first."""
    gpus = {r.gpu for r in w.ranks}
    out = []
    for e in w.events:
        if e.gpu and e.gpu not in gpus:
            continue
        if (e.name == signals.EVENT_XID and xid_kind(e.value) == FAULT) or (
            e.name in (signals.EVENT_ECC_DBE, signals.EVENT_GPU_LOST) and e.gpu
        ):
            out.append(e)
    return out


def detect_hardware_fault(w: JobWindow) -> list[Finding]:
    evs = fault_events(w)
    counter_hits: list[tuple[str, str, float, float, float, float]] = []
    for r in w.ranks:
        for name in FAULT_COUNTERS:
            s = w.gpu_raw.get(r.gpu, {}).get(name)
            if s is None or not len(s.ts):
                continue
            d, v0, _ = counter_delta(s.ts, s.values)
            if d > 0:
                inc = np.flatnonzero(np.diff(s.values) > 0)
                t_first = float(s.ts[inc[0] + 1]) if len(inc) else float(s.ts[0])
                counter_hits.append((r.gpu, name, d, v0, t_first, float(s.ts[-1])))
    if not evs and not counter_hits:
        return []
    t_first = min([e.ts for e in evs] + [h[4] for h in counter_hits])
    gpu = evs[0].gpu if evs else counter_hits[0][0]
    rank = next((r for r in w.ranks if r.gpu == gpu), None)
    node = rank.node if rank else (evs[0].node if evs else "")
    f = new_finding(
        "hardware_fault",
        INFRASTRUCTURE,
        f"Hardware fault on {node} GPU {rank.gpu_index if rank else ''}".strip(),
        (t_first, w.t1),
        0.9,
        f"Drain {node} and run GPU diagnostics (dcgmi diag -r 3, nvidia-smi -q -d ECC,"
        "ROW_REMAPPER); reset or RMA the GPU. Resume the job from its last checkpoint on "
        "healthy nodes; the customer should not be billed for the lost time.",
        job=w.job,
        node=node,
        gpu=gpu,
        rank=rank.rank if rank else None,
    )
    cites = []
    for e in evs[:5]:
        label = xid_name(e.value) if e.name == signals.EVENT_XID and e.value else e.name
        cites.append(
            f.add(
                f"event: {e.name}",
                (e.ts, e.ts),
                int(e.value) if e.value is not None else e.name,
                None,
                f"{label} on GPU {e.gpu_index}: {e.text[:160]}".rstrip(": "),
                node=e.node,
                gpu=e.gpu,
                rank=rank.rank if rank and rank.gpu == e.gpu else None,
                job=w.job,
            )
        )
    for g, name, d, v0, t0, t1 in counter_hits[:5]:
        cites.append(
            f.add(
                name,
                (t0, t1),
                d,
                v0,
                "increase during the job's window; baseline: value at the window's start",
                gpu=g,
                job=w.job,
            )
        )
    consequence = ""
    after = [e for e in w.log_events if e.ts >= t_first]
    loss_bad = False
    # Only rows that printed a loss: a progress bar's row (a step, no loss) is NaN in the
    # loss column and would read as "the loss blew up" after any fault.
    printed = w.steps.with_loss()
    if len(printed):
        post = printed.loss[printed.ts >= t_first]
        pre = printed.loss[printed.ts < t_first]
        if len(post) and len(pre) and np.isfinite(pre).any():
            loss_bad = bool((~np.isfinite(post)).any() or np.nanmax(post) > 2 * np.nanmin(pre))
    if loss_bad:
        e_l = f.add(
            "log: loss",
            (t_first, float(w.steps.ts[-1])),
            "nan/exploded",
            None,
            "the loss went non-finite or doubled after the fault",
            job=w.job,
        )
        consequence = f" The loss blew up right after it [{e_l}]: silent data corruption."
    elif after:
        e_l = f.add(
            "log: error",
            (after[0].ts, after[-1].ts),
            after[0].kind,
            None,
            after[0].text[:200],
            job=w.job,
        )
        consequence = f" The job then failed [{e_l}]."
    what = (
        ", ".join(
            (f"XID {int(e.value)}" if e.name == signals.EVENT_XID and e.value else e.name)
            for e in evs[:3]
        )
        or counter_hits[0][1]
    )
    f.summary = (
        f"{what} hit GPU {gpu} on {node}"
        + (f" (rank {rank.rank})" if rank else "")
        + f" at {hhmmss(t_first)}, during the job [{', '.join(cites)}]."
        + consequence
    )
    f.explanation = (
        "The fault is reported by the GPU itself (driver XID / ECC counters) on one of the job's "
        "GPUs inside the job's window; what followed in the job is a consequence, not the cause."
    )
    f.gpu_hours_lost = gpu_hours(w.world, max(0.0, w.t1 - t_first))
    return [f]


def _ib_series(
    w: JobWindow,
) -> dict[tuple[str, str, str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    out: dict[tuple[str, str, str], dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for node, series in w.node_series.items():
        for s in series:
            if s.info.name in IB_ERROR_COUNTERS:
                key = (node, s.info.label("device") or "", s.info.label("port") or "")
                out.setdefault(key, {})[s.info.name] = (s.ts, s.values)
    return out


def detect_fabric_degraded(w: JobWindow) -> list[Finding]:
    if w.meta.kind == "inference" or len(w.job_nodes()) < 2:
        return []
    best = None
    for key, per in _ib_series(w).items():
        total = 0.0
        first = None
        for name, (ts, v) in per.items():
            d, _, _ = counter_delta(ts, v)
            if d > 0:
                total += d
                inc = np.flatnonzero(np.diff(v) > 0)
                if len(inc) >= RISING_MIN_INCREMENTS or name == signals.IB_LINK_DOWNED:
                    t = float(ts[inc[0] + 1])
                    first = t if first is None else min(first, t)
        if first is not None and (best is None or total > best[1]):
            best = (key, total, first, per)
    if best is None:
        return []
    (node, dev, port), total, t_on, per = best
    # Collectives slower after the errors began: per-rank synchronize time, else iteration time.
    slow = None
    sync = w.proc.get(signals.CUDA_SYNC_MS)
    before = w.times < t_on
    after = w.times >= t_on
    step_s = step_seconds(w)
    min_after = FABRIC_MIN_AFTER_SAMPLES
    if np.isfinite(step_s):
        min_after = max(min_after, int(np.ceil(FABRIC_MIN_AFTER_STEPS * step_s / w.dt)))
    if sync is not None:
        launches = w.proc.get(signals.CUDA_LAUNCHES)
        act = (
            (np.nan_to_num(launches, nan=0.0) > 0).all(axis=0)
            if launches is not None
            else np.ones(len(w.times), dtype=bool)
        )
        n_b, n_a = int((before & act).sum()), int((after & act).sum())
        if n_b >= FABRIC_MIN_BEFORE_SAMPLES and n_a >= min_after:
            b_v = float(np.nanmean(sync[:, before & act]))
            a_v = float(np.nanmean(sync[:, after & act]))
            # Runs of stepping samples before the errors, as long as the after period (or
            # shorter, to have FABRIC_MIN_BEFORE_WINDOWS of them: a shorter run's mean varies
            # more, so that is the stricter test): the after-mean must be above every one.
            per_sample = np.nanmean(sync[:, before & act], axis=0)
            n_r = min(n_a, len(per_sample) // FABRIC_MIN_BEFORE_WINDOWS)
            k = len(per_sample) // n_r if n_r else 0
            top = (
                float(np.nanmax(per_sample[len(per_sample) - k * n_r :].reshape(k, n_r).mean(1)))
                if k
                else np.inf
            )
            if (
                np.isfinite(b_v)
                and np.isfinite(a_v)
                and b_v > 0
                and k >= FABRIC_MIN_BEFORE_WINDOWS
                and a_v > top
            ):
                slow = (signals.CUDA_SYNC_MS, a_v, b_v)
    if slow is None and len(w.steps) >= 6 and np.isfinite(w.steps.iter_ms).any():
        it = w.steps.iter_ms
        b_v = np.nanmedian(it[w.steps.ts < t_on]) if (w.steps.ts < t_on).any() else np.nan
        a_v = np.nanmedian(it[w.steps.ts >= t_on]) if (w.steps.ts >= t_on).any() else np.nan
        if np.isfinite(b_v) and np.isfinite(a_v) and b_v > 0:
            slow = ("log: iteration time", float(a_v), float(b_v))
    if slow is None or slow[1] < (1 + FABRIC_MIN_SLOWDOWN) * slow[2]:
        return []
    f = new_finding(
        "fabric_degraded",
        INFRASTRUCTURE,
        f"InfiniBand link degraded on {node} ({dev} port {port})",
        (t_on, w.t1),
        0.85,
        f"Take {node}'s {dev} port {port} out of service: check/replace the cable or "
        "transceiver and the switch port (ibdiagnet), then return the node.",
        job=w.job,
        node=node,
    )
    cites = []
    for name, (ts, v) in per.items():
        d, v0, _ = counter_delta(ts, v)
        if d > 0:
            cites.append(
                f.add(
                    name,
                    (t_on, w.t1),
                    d,
                    v0,
                    f"increase on {dev} port {port}; baseline: value before",
                    node=node,
                )
            )
    e_s = f.add(
        slow[0],
        (t_on, w.t1),
        round(slow[1], 2),
        round(slow[2], 2),
        "mean per-rank time in collectives/synchronize (or iteration time) after vs "
        "before the errors began",
        job=w.job,
    )
    f.summary = (
        f"From {hhmmss(t_on)}, {dev} port {port} on {node} took {total:.0f} link errors "
        f"[{', '.join(cites)}] while the job's collectives slowed by "
        f"{slow[1] / slow[2] - 1:.0%} [{e_s}]."
    )
    f.explanation = (
        "Symbol errors and link recoveries force retransmissions on that port; every "
        "all-reduce crosses it, so the whole job slows down."
    )
    # The job's slowdown, not the collectives': with synchronize time the job computes for
    # (1 − sync share) of each interval, so it progresses that much slower; iteration time
    # from the log is the job's speed directly.
    if slow[0] == signals.CUDA_SYNC_MS:
        span_ms = w.dt * 1000.0
        busy_before = max(1e-6, 1.0 - slow[2] / span_ms)
        busy_after = max(1e-6, 1.0 - slow[1] / span_ms)
        job_slowdown = busy_before / busy_after - 1.0
    else:
        job_slowdown = slow[1] / slow[2] - 1.0
    f.details["collective_slowdown_pct"] = round(100.0 * (slow[1] / slow[2] - 1), 1)
    f.slowdown_pct = round(100.0 * job_slowdown, 1)
    f.gpu_hours_lost = gpu_hours(
        w.world, max(0.0, w.t1 - t_on) * job_slowdown / (1.0 + job_slowdown)
    )
    return [f]


def _episodes(bits: np.ndarray) -> list[tuple[int, int]]:
    """Runs of throttled samples as [start, end) index pairs (found with array operations:
    a GPU's 6 h window holds 21,600 samples, which a loop over them took 3 ms to walk)."""
    on = (np.nan_to_num(bits, nan=0.0).astype(np.int64) & _THROTTLE_BITS) != 0
    edges = np.diff(np.concatenate(([0], on.view(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def detect_gpu_degrading(g: GpuWindow) -> list[Finding]:
    """Fleet health for one GPU: rising error rates / recurring throttling, before a failure."""
    signs: list[tuple[str, float, float, float, float, str]] = []
    for name in (
        signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
        signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
    ):
        s = g.series.get(name)
        if s is None or len(s.ts) < 6:
            continue
        inc = np.flatnonzero(np.diff(s.values) > 0)
        if len(inc) < RISING_MIN_INCREMENTS:
            continue
        r0, r1 = rate_trend(s.ts, s.values)
        if r1 >= RISING_RATE_RATIO * max(r0, 1e-9) and r1 > 0:
            signs.append(
                (
                    name,
                    float(s.ts[inc[0] + 1]),
                    float(s.ts[-1]),
                    r1,
                    r0,
                    "increase per hour in the last third of the window vs the first",
                )
            )
    s = g.series.get(signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS)
    if s is not None and len(s.ts):
        d, v0, _ = counter_delta(s.ts, s.values)
        if d > 0:
            inc = np.flatnonzero(np.diff(s.values) > 0)
            signs.append(
                (
                    signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
                    float(s.ts[inc[0] + 1]),
                    float(s.ts[-1]),
                    d,
                    v0,
                    "rows remapped during the window; baseline: "
                    "the (pre-existing) count at its start",
                )
            )
    s = g.series.get(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)
    if s is not None and len(s.ts):
        eps = _episodes(s.values)
        if len(eps) >= RECURRING_MIN_EPISODES:
            secs = float(sum(b - a for a, b in eps))
            signs.append(
                (
                    signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
                    float(s.ts[eps[0][0]]),
                    float(s.ts[min(eps[-1][1], len(s.ts) - 1)]),
                    len(eps),
                    secs,
                    "separate HW/thermal throttling episodes (baseline: samples throttled)",
                )
            )
    warn = [e for e in g.events if e.name == signals.EVENT_XID and xid_kind(e.value) == WARNING]
    if warn:
        codes = sorted({int(e.value or 0) for e in warn})
        signs.append(
            (
                _WARNING_XID_SIGN,
                warn[0].ts,
                warn[-1].ts,
                len(warn),
                0,
                "warning XIDs from the driver (the GPU corrected or recorded the error and kept "
                "running): " + ", ".join(xid_name(c) for c in codes),
            )
        )
    if len(signs) < DEGRADING_MIN_SIGNS:
        return []
    t0 = min(x[1] for x in signs)
    f = new_finding(
        "gpu_degrading",
        INFRASTRUCTURE,
        f"GPU degrading on {g.node} (GPU {g.gpu_index})",
        (t0, g.t1),
        round(min(0.95, 0.55 + 0.15 * len(signs)), 2),
        f"Schedule {g.node} GPU {g.gpu_index} for drain and diagnostics (dcgmi diag -r 3, "
        "check cooling) before it fails a job; move long jobs off it.",
        node=g.node,
        gpu=g.gpu,
    )
    cites = [
        f.add(name, (a, b), round(obs, 3), round(base, 3), note, node=g.node, gpu=g.gpu)
        for name, a, b, obs, base, note in signs
    ]
    names = ", ".join(
        {
            signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: "rising single-bit ECC rate",
            signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "rising NVLink CRC errors",
            signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: "rising PCIe replays",
            signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: "new row remaps",
            signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: "recurring throttling",
            _WARNING_XID_SIGN: f"{int(x[3])} warning XID(s)",
        }[x[0]]
        for x in signs
    )
    f.summary = f"GPU {g.gpu} on {g.node} shows {names} since {hhmmss(t0)} [{', '.join(cites)}]."
    f.explanation = (
        "Each sign is measured against the GPU's own history in the window (rates and deltas, "
        "not absolute counts: an old, flat count is not evidence). Together they are the usual "
        "run-up to an uncorrectable error or a GPU falling off the bus."
    )
    return [f]
