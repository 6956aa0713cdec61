"""A distributed training job on the simulated fleet, step by step, rank by rank.

Each step k, every rank r: waits for its input batch (`data`, GPU idle), computes (`compute`,
tensor pipes busy; duration from the rank's work and its GPU's clock), then enters the gradient
all-reduce: it `wait`s for the slowest rank (an NCCL kernel spins: engine active, tensor pipes
idle), the transfer runs (`comm`), and every `ckpt_every` steps all ranks block while the
checkpoint is written (`ckpt`). The phase boundaries are exact times; each 1 s sample is the
exact integral of the phases over its interval (piecewise-linear cumulative time, `np.interp`),
so DCGM ratios, power, `cuda.*`, `nccl.*`, host CPU, IB and storage all agree with each other
and with the log lines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.fleet import Fleet
from simulator.hardware import compute_speed
from simulator.job import (
    _PROC_SEEN_S,
    CKPT,
    COMM,
    COMPUTE,
    DATA,
    PHASES,
    WAIT,
    JobPlan,
    JobResult,
    _stop_time,
    draw_plan,
)
from simulator.job_records import emit_records
from simulator.job_signals import apply_to_fleet, emit_process_signals
from simulator.run import SimRun

__all__ = ["PHASES", "JobPlan", "JobResult", "draw_plan", "simulate_job"]


def _integrate(times: np.ndarray, phases: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Seconds of each phase per [edges[i], edges[i+1]) given segments starting at `times`
    (the last time closes the last segment; its phase entry is ignored)."""
    dur = np.diff(times)
    out = np.zeros((len(PHASES), len(edges) - 1))
    for p in range(len(PHASES)):
        cum = np.concatenate([[0.0], np.cumsum(np.where(phases[:-1] == p, dur, 0.0))])
        f = np.interp(edges, times, cum)
        out[p] = np.diff(f)
    return out


def _record_step(
    S: list[float],
    A: list[np.ndarray],
    CS: list[np.ndarray],
    C: list[float],
    E: list[float],
    CK: list[float],
    *vals: Any,
) -> None:
    columns: tuple[list[Any], ...] = (S, A, CS, C, E, CK)
    for lst, v in zip(columns, vals, strict=True):
        lst.append(v)


def simulate_job(
    plan: JobPlan, fleet: Fleet, run: SimRun, rng: np.random.Generator, *, pid_base: int
) -> JobResult:
    W = plan.world_size
    n = fleet.n_samples
    dt = fleet.interval_s
    t_end = fleet.start_ts + n * dt
    ranks = []
    for r in range(W):
        node_id = plan.node_ids[r // plan.gpus_per_node]
        local = r % plan.gpus_per_node
        g = fleet.gpu(node_id, local)
        ranks.append(
            {
                "rank": r,
                "local_rank": local,
                "node_id": node_id,
                "node": fleet.nodes[node_id].hostname,
                "gpu_global": g,
                "gpu": fleet.nodes[node_id].gpu_uuids[local],
                "gpu_index": local,
                "pid": pid_base + node_id * 7919 + local * 37 + int(rng.integers(0, 30)),
            }
        )
    # When the agent first sees each rank's process (at the start of the recording for a job
    # that was already running); samples keyed by its pid begin at the next sample instant.
    proc_seen = np.maximum(plan.start_t + rng.uniform(0, _PROC_SEEN_S, W), fleet.start_ts)
    gpu_ids = np.array([rk["gpu_global"] for rk in ranks])
    demand = (
        0.08 * plan.compute_level[0]
        + 0.25 * plan.compute_level[1]
        + 0.85 * plan.compute_level[3]
        + 0.2 * plan.compute_level[4]
    )
    speed = compute_speed(fleet.spec, fleet.faults, demand)[gpu_ids]  # (W, n)
    base_c = plan.step_time_s * (1 - plan.comm_frac) / 1.01
    a0 = plan.step_time_s * plan.comm_frac
    h2d = plan.step_time_s * rng.uniform(0.005, 0.02)
    # Work per rank and step: packed sequences give near-equal work; variable-length sampling
    # (imbalance_seqs > 0) gives long-tailed per-rank work (attention cost grows with L²).
    node_bw = plan.ckpt_mount.healthy_write_bw
    t = plan.start_t + plan.init_s
    max_steps = int((t_end - t) / (plan.step_time_s * 0.5)) + 2
    if plan.stop_after_steps is not None:
        max_steps = min(max_steps, plan.stop_after_steps)
    rank_jitter = rng.normal(0, plan.rank_offset_sd, W)
    S: list[float] = []
    A: list[np.ndarray] = []
    C: list[float] = []
    E: list[float] = []
    CK: list[float] = []
    CS: list[np.ndarray] = []
    hang_step = None
    crash_step = None
    prev_busy = np.full(W, plan.step_time_s)
    ckpt_steps: list[tuple[int, float, float]] = []
    for k in range(max(0, max_steps)):
        if t >= t_end:
            break
        if plan.cancel_at is not None and t >= plan.cancel_at:
            break
        i = fleet.index_at(t)
        if plan.imbalance_seqs > 0 and t >= plan.imbalance_from:
            lens = rng.lognormal(0.0, 0.4, (W, plan.imbalance_seqs))
            work = (lens + 0.35 * lens**2).sum(axis=1)
            mean_work = plan.imbalance_seqs * (np.exp(0.4**2 / 2) + 0.35 * np.exp(2 * 0.4**2))
            work = (0.6 + 0.4 * work / mean_work) * (1.0 + rng.normal(0, plan.compute_jitter, W))
        else:
            # Balanced work: each rank's compute still varies a few percent step to step
            # (kernel timing, host-side launches, data-dependent shapes).
            work = 1.0 + rank_jitter + rng.normal(0, plan.compute_jitter, W)
        eff = np.ones(W)
        for r, (t0, e) in plan.slow_eff.items():
            if t >= t0:
                eff[r] = e
        c = base_c * work / (speed[:, i] * eff)
        d_extra = np.full(W, h2d)
        if plan.pcie_rank is not None and t >= plan.pcie_rank[1]:
            d_extra[plan.pcie_rank[0]] = h2d / plan.pcie_rank[2]
        produce = plan.data_frac * plan.step_time_s
        if plan.starve is not None and t >= plan.starve[0]:
            produce *= plan.starve[1]
        d = np.maximum(0.0, produce * rng.normal(1.0, 0.01, W) - prev_busy) + d_extra
        if rng.random() < plan.hiccup_per_step:
            # A slow shard read or a GC pause on one rank's input pipeline: a healthy job has
            # these now and then (one short stall, not a pattern).
            d[int(rng.integers(W))] += rng.uniform(0.5, 3.0)
        cs = t + d
        arr = cs + c
        if plan.hang is not None and t >= plan.hang[1] and hang_step is None:
            hang_step = k
            arr = arr.copy()
            arr[plan.hang[0]] = np.inf
        if (
            plan.crash is not None
            and hang_step is None
            and t + plan.step_time_s * 2 >= plan.crash[1]
        ):
            crash_step = hang_step = k
            arr = arr.copy()
            arr[plan.crash[0]] = np.inf
        if hang_step is not None:
            _record_step(S, A, CS, C, E, CK, t, arr, cs, np.inf, np.inf, np.inf)
            break
        coll = float(arr.max())
        fab = plan.fabric[1] if plan.fabric is not None and t >= plan.fabric[0] else 1.0
        a = a0 * rng.lognormal(0, 0.04) * fab
        end = coll + a
        ck_end = end
        if (plan.first_step + k + 1) % plan.ckpt_every == 0:
            bw = node_bw
            if plan.ckpt_write_bw is not None and end >= plan.ckpt_write_bw[0]:
                bw = plan.ckpt_write_bw[1]
            per_node = plan.ckpt_bytes / len(plan.node_ids)
            secs = per_node / (bw * rng.uniform(0.9, 1.1)) + rng.uniform(0.3, 1.5)
            ck_end = end + secs
            ckpt_steps.append((k, end, ck_end))
        _record_step(S, A, CS, C, E, CK, t, arr, cs, coll, end, ck_end)
        prev_busy = end - cs
        t = ck_end + rng.uniform(0.0005, 0.003)
    K = len(S)
    step_start = np.array(S)
    arrive = np.array(A).T if K else np.zeros((W, 0))
    compute_start = np.array(CS).T if K else np.zeros((W, 0))
    coll_start = np.array(C)
    coll_end = np.array(E)
    ckpt_end_a = np.array(CK)

    # End of the job.
    exit_codes = np.zeros(W, dtype=np.int64)
    state, exit_code = "running", 0
    if hang_step is not None:
        arrived = np.isfinite(arrive[:, hang_step])
        watchdog = arrive[:, hang_step] + plan.nccl_timeout_s
        proc_end = np.where(arrived, watchdog, np.inf)
        if crash_step is not None:
            proc_end[plan.crash[0]] = plan.crash[1] + 0.3  # type: ignore[index]
            exit_codes[plan.crash[0]] = 1  # type: ignore[index]
        else:
            stuck_kill = float(np.nanmax(np.where(arrived, watchdog, -np.inf))) + 5.0
            proc_end[~arrived] = stuck_kill
        exit_codes[np.isfinite(arrive[:, hang_step])] = -6  # SIGABRT from the watchdog
        job_end = float(np.max(proc_end))
        state, exit_code = "failed", 1
    elif K and (plan.stop_after_steps is not None and plan.stop_after_steps <= K):
        job_end = float(ckpt_end_a[-1]) + rng.uniform(2, 8)
        proc_end = np.full(W, job_end) + rng.uniform(0, 0.5, W)
        state, exit_code = "completed", 0
    elif plan.cancel_at is not None and plan.cancel_at < t_end:
        job_end = plan.cancel_at
        proc_end = np.full(W, job_end) + rng.uniform(0, 1.0, W)
        exit_codes[:] = -15
        state, exit_code = "cancelled", 143
    else:
        job_end = np.inf
        proc_end = np.full(W, np.inf)

    # Per-rank segment boundaries, then exact integration into samples.
    edges = fleet.start_ts + dt * np.arange(n + 1)
    phase_frac = np.zeros((W, len(PHASES), n))
    for r in range(W):
        times: list[np.ndarray] = []
        phs: list[np.ndarray] = []
        Kc = K if hang_step is None else hang_step
        if Kc:
            b = np.stack(
                [
                    step_start[:Kc],
                    compute_start[r, :Kc],
                    arrive[r, :Kc],
                    coll_start[:Kc],
                    coll_end[:Kc],
                ],
                axis=1,
            ).ravel()
            p = np.tile([DATA, COMPUTE, WAIT, COMM, CKPT], Kc)
            times.append(b)
            phs.append(p)
        tail_t: list[float] = []
        tail_p: list[int] = []
        if hang_step is not None:
            s = step_start[hang_step]
            tail_t += [s, compute_start[r, hang_step]]
            tail_p += [DATA, COMPUTE]
            if np.isfinite(arrive[r, hang_step]):
                tail_t += [arrive[r, hang_step]]
                tail_p += [WAIT]
            else:
                stop = _stop_time(plan)
                tail_t += [max(stop, compute_start[r, hang_step])]
                tail_p += [-1]
            tail_t.append(min(proc_end[r], t_end + dt))
        elif Kc:
            tail_t.append(ckpt_end_a[Kc - 1])
        if tail_t:
            times.append(np.array(tail_t))
            phs.append(np.array([*tail_p, -1][: len(tail_t)]))
        if not times:
            continue
        tt = np.concatenate(times)
        pp = np.concatenate(phs)
        tt = np.maximum.accumulate(np.minimum(tt, t_end + 10 * dt))
        phase_frac[r] = _integrate(tt, pp, edges) / dt

    result = JobResult(
        plan=plan,
        ranks=ranks,
        step_start=step_start,
        arrive=arrive,
        coll_start=coll_start,
        coll_end=coll_end,
        ckpt_end=ckpt_end_a,
        compute_start=compute_start,
        phase_frac=phase_frac,
        proc_end=proc_end,
        proc_seen=proc_seen,
        exit_codes=exit_codes,
        state=state,
        exit_code=exit_code,
        end_t=job_end,
        hang_step=hang_step,
    )
    apply_to_fleet(result, fleet, rng, ckpt_steps)
    emit_process_signals(result, fleet, run, rng)
    emit_records(result, fleet, run, rng, ckpt_steps)
    return result
