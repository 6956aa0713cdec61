"""What a simulated training job does to the fleet's arrays (GPU activity, framebuffer, host
CPU/memory, IB traffic, storage I/O) and its process-scope samples (`cuda.*`, `nccl.*`,
`host.cpu_util` of ranks and input workers), all from the integrated step timeline."""

from __future__ import annotations

import numpy as np

from contract import signals
from simulator.fleet import Fleet
from simulator.job import (
    _BUSBW_IB,
    _BUSBW_NVLINK,
    _CKPT_LEVEL,
    _COMM_LEVEL,
    _WAIT_LEVEL,
    CKPT,
    COMM,
    COMPUTE,
    DATA,
    WAIT,
    JobResult,
    _sample_span,
    _stop_time,
    _worker_spawn_t,
)
from simulator.run import SimRun


def apply_to_fleet(
    res: JobResult,
    fleet: Fleet,
    rng: np.random.Generator,
    ckpt_steps: list[tuple[int, float, float]],
) -> None:
    plan = res.plan
    n, dt = fleet.n_samples, fleet.interval_s
    levels = np.array(
        [(0, 0, 0, 0, 0), plan.compute_level, _WAIT_LEVEL, _COMM_LEVEL, _CKPT_LEVEL], dtype=float
    )
    act = fleet.activity
    fields = (
        act.engine_active,
        act.sm_active,
        act.sm_occupancy,
        act.tensor_active,
        act.dram_active,
    )
    for r, rk in enumerate(res.ranks):
        g = rk["gpu_global"]
        frac = res.phase_frac[r]  # (5, n)
        for f_i, arr in enumerate(fields):
            contrib = np.tensordot(levels[:, f_i], frac, axes=1)
            if f_i == 3 and r in plan.slow_eff:
                # Retried NVLink traffic stretches compute with the tensor pipes idle meanwhile.
                t0, e = plan.slow_eff[r]
                after = (fleet.start_ts + dt * np.arange(n)) >= t0
                contrib = contrib - np.where(after, (1 - e) * levels[COMPUTE, 3] * frac[COMPUTE], 0)
            arr[g] += contrib
        # Framebuffer: context at start, model + optimizer loaded over init, allocator jitter.
        i0, i1 = _sample_span(fleet, plan.start_t, res.proc_end[r])
        if i1 > i0:
            tt = np.arange(i0, i1) * dt + fleet.start_ts - plan.start_t
            ramp = np.clip(tt / max(plan.init_s * 0.8, 1.0), 0, 1)
            fb = (
                520
                + (plan.fb_used_mib - 520) * ramp
                + np.round(rng.normal(0, 1, i1 - i0).cumsum() * 6) % 512
            )
            act.fb_used_mib[g, i0:i1] = np.minimum(
                fb, fleet.spec.fb_total_mib - fleet.spec.fb_reserved_mib - 64
            )
            # Init: loading and compiling, short bursts of kernels.
            init_end = min(i1, i0 + int(plan.init_s / dt))
            burst = rng.uniform(0, 0.25, init_end - i0) * (rng.random(init_end - i0) < 0.4)
            act.engine_active[g, i0:init_end] = np.maximum(act.engine_active[g, i0:init_end], burst)
            act.sm_active[g, i0:init_end] = np.maximum(act.sm_active[g, i0:init_end], burst * 0.8)
        fleet.gpu_owner.setdefault(g, []).append(
            (
                _sample_span(fleet, res.proc_seen[r], res.proc_seen[r])[0],
                _sample_span(fleet, plan.start_t, res.proc_end[r])[1],
                {"job": plan.job_id, "rank": r, "local_rank": rk["local_rank"], "pid": rk["pid"]},
            )
        )
    np.clip(act.engine_active, 0, 1, out=act.engine_active)

    # Host CPU and memory per node.
    nodes = sorted(set(plan.node_ids))
    for nid in nodes:
        i0, i1 = _sample_span(fleet, plan.start_t, res.end_t)
        fleet.host_mem_used[nid, i0:i1] += plan.gpus_per_node * rng.uniform(18e9, 40e9)
    # IB traffic: inter-node share of each all-reduce, spread over the transfer.
    if len(nodes) > 1 and len(res.coll_end):
        W = plan.world_size
        K = len(res.coll_start) if res.hang_step is None else res.hang_step
        busbw = _BUSBW_IB
        bytes_per_step = plan.step_time_s * plan.comm_frac * busbw / (2 * (W - 1) / W)
        node_total = 2 * (len(nodes) - 1) / len(nodes) * bytes_per_step
        cum_t = np.stack([res.coll_start[:K], res.coll_end[:K]], axis=1).ravel()
        cum_b = np.stack([np.arange(K), np.arange(1, K + 1)], axis=1).ravel().astype(float)
        edges = fleet.start_ts + dt * np.arange(n + 1)
        if K:
            per = np.diff(np.interp(edges, cum_t, cum_b)) * node_total
            ports = fleet.ib_xmit.shape[1]
            comm_time = np.diff(
                np.interp(
                    edges,
                    cum_t,
                    np.stack([np.zeros(K), res.coll_end[:K] - res.coll_start[:K]], axis=1)
                    .ravel()
                    .cumsum(),
                )
            )
            for nid in nodes:
                split = rng.dirichlet(np.full(ports, 50.0))
                fleet.ib_xmit[nid] += split[:, None] * per[None, :]
                fleet.ib_rcv[nid] += split[:, None] * per[None, :] * rng.uniform(0.98, 1.02)
                fleet.ib_wait[nid] += comm_time[None, :] * rng.uniform(2e3, 2e4)

    # Checkpoint writes: every node writes its shard over the save.
    mount = plan.ckpt_mount
    per_node = plan.ckpt_bytes / len(nodes)
    for _k, t0, t1 in ckpt_steps:
        i0, i1 = fleet.index_at(t0), fleet.index_at(t1)
        edges = fleet.start_ts + dt * np.arange(i0, i1 + 2)
        share = np.diff(np.interp(edges, [t0, t1], [0.0, 1.0]))
        lat = mount.healthy_latency_ms * 3
        if plan.ckpt_latency_ms is not None and t0 >= plan.ckpt_latency_ms[0]:
            lat = plan.ckpt_latency_ms[1]
        for nid in nodes:
            fleet.storage_write[mount.path][nid, i0 : i1 + 1] += share * per_node
            seg = fleet.storage_write_ms[mount.path][nid, i0 : i1 + 1]
            fleet.storage_write_ms[mount.path][nid, i0 : i1 + 1] = np.where(
                share > 0, lat * rng.lognormal(0, 0.2, len(share)), seg
            )
            fleet.host_cores_used[nid, i0 : i1 + 1] += share > 0
    # Dataset reads from the shared mount while stepping (streaming shards).
    read_rate = rng.uniform(20e6, 120e6)
    for nid in nodes:
        busy = res.phase_frac[[i for i, rk in enumerate(res.ranks) if rk["node_id"] == nid]][
            :, COMPUTE
        ].mean(axis=0)
        fleet.storage_read[fleet.shared.path][nid] += busy * read_rate * dt


def emit_process_signals(
    res: JobResult, fleet: Fleet, run: SimRun, rng: np.random.Generator
) -> None:
    plan = res.plan
    n, dt = fleet.n_samples, fleet.interval_s
    W = plan.world_size
    edges = fleet.start_ts + dt * np.arange(n + 1)
    i0, i1 = _sample_span(fleet, float(np.min(res.proc_seen)), float(np.max(res.proc_end)))
    if i1 <= i0:
        return
    alive = np.zeros((W, n), dtype=bool)
    for r in range(W):
        a, b = _sample_span(fleet, res.proc_seen[r], res.proc_end[r])
        alive[r, a:b] = True
    alive = alive[:, i0:i1]
    frac = res.phase_frac[:, :, i0:i1]
    K = res.arrive.shape[1] if res.hang_step is None else res.hang_step
    launch_rate = rng.uniform(1500, 6000)  # kernels per second of compute
    n_buckets = int(rng.integers(4, 25))
    bytes_per_step = (
        plan.step_time_s
        * plan.comm_frac
        * (_BUSBW_IB if len(plan.node_ids) > 1 else _BUSBW_NVLINK)
        / (2 * (W - 1) / max(W, 1))
        if W > 1
        else 0.0
    )
    launches = np.zeros((W, i1 - i0), dtype=np.int64)
    calls = np.zeros((W, i1 - i0), dtype=np.int64)
    gap_max = np.zeros((W, i1 - i0))
    sub_edges = edges[i0 : i1 + 1]
    for r in range(W):
        comp_cum = np.cumsum(frac[r, COMPUTE] * dt)
        comp_cum = np.concatenate([[0.0], comp_cum])
        # Kernel launches follow compute time, at a rate that wobbles a little per interval.
        wobble = rng.lognormal(0.0, 0.03, i1 - i0)
        launches[r] = np.round(np.diff(comp_cum) * launch_rate * wobble).astype(np.int64)
        arr_r = res.arrive[r, :K]
        if K:
            idx = np.floor((arr_r - sub_edges[0]) / dt).astype(np.int64)
            ok = (idx >= 0) & (idx < i1 - i0)
            np.add.at(calls[r], idx[ok], n_buckets)
            launches[r] += calls[r]
            # Launch gaps: from compute end (the NCCL launch) to the next compute start.
            g0 = arr_r
            g1 = np.concatenate(
                [
                    res.compute_start[r, 1 : K + 1]
                    if res.compute_start.shape[1] > K
                    else res.compute_start[r, 1:K],
                    [np.nan] * (1 if res.compute_start.shape[1] <= K else 0),
                ]
            )[:K]
            valid = np.isfinite(g1)
            gl = (g1 - g0)[valid] * 1000.0
            gi = np.floor((g1[valid] - sub_edges[0]) / dt).astype(np.int64)
            okg = (gi >= 0) & (gi < i1 - i0)
            np.maximum.at(gap_max[r], gi[okg], gl[okg])
            long = np.flatnonzero(valid)[(g1 - g0)[valid] > dt]
            for kk in long:
                a = int(np.ceil((g0[kk] - sub_edges[0]) / dt))
                b = int(np.floor((g1[kk] - sub_edges[0]) / dt))
                for j in range(max(a, 0), min(b, i1 - i0)):
                    gap_max[r, j] = max(gap_max[r, j], (sub_edges[j + 1] - g0[kk]) * 1000.0)
        # Open gap after the last launch (hang, crash, end of run).
        last = res.arrive[r, K - 1] if K and res.hang_step is None else None
        if res.hang_step is not None:
            cs = res.compute_start[r, res.hang_step]
            arr_h = res.arrive[r, res.hang_step]
            last = arr_h if np.isfinite(arr_h) else _stop_time(plan)
            last = max(last, cs)
            j0 = int(np.floor((last - sub_edges[0]) / dt))
            for j in range(max(j0, 0), i1 - i0):
                gap_max[r, j] = max(gap_max[r, j], (sub_edges[j + 1] - last) * 1000.0)
        active = frac[r, COMPUTE] > 0
        gap_max[r] = np.where(
            active, np.maximum(gap_max[r], rng.uniform(0.3, 3.0, i1 - i0)), gap_max[r]
        )
        # Bins with nothing launched at all: the gap so far (already filled), or none before start.
    sync = (frac[:, WAIT] + frac[:, COMM]) * dt * 1000.0
    sync = np.where(sync > 0, sync + rng.uniform(0, 0.3, sync.shape), 0.0)
    nbytes = calls.astype(float) / max(n_buckets, 1) * bytes_per_step
    # Host CPU of the training process (cores): launching/spinning in sync ~1, blocked on the
    # input queue ~0.15, serialising a checkpoint ~1.
    cpu = (
        1.05 * frac[:, COMPUTE]
        + 0.95 * (frac[:, WAIT] + frac[:, COMM])
        + 0.12 * frac[:, DATA]
        + 1.0 * frac[:, CKPT]
    )
    if res.hang_step is not None and plan.hang is not None:
        hr = plan.hang[0]
        stuck = sub_edges[:-1] >= plan.hang[1]
        cpu[hr] = np.where(
            stuck, 1.0, cpu[hr]
        )  # spinning in user code, never reaching the collective
    idle = 1 - frac.sum(axis=1)
    cpu = cpu + 0.3 * idle * (sub_edges[:-1] < plan.start_t + plan.init_s)  # loading
    cpu = np.clip(cpu + rng.normal(0, 0.03, cpu.shape), 0.01, None)
    rows = [
        {
            "node": rk["node"],
            "pid": rk["pid"],
            "job": plan.job_id,
            "rank": r,
            "local_rank": rk["local_rank"],
            "gpu": rk["gpu"],
            "gpu_index": rk["gpu_index"],
        }
        for r, rk in enumerate(res.ranks)
    ]
    run.add_samples(signals.CUDA_LAUNCHES, launches, rows, start=i0, valid=alive)
    run.add_samples(
        signals.CUDA_LAUNCH_GAP_MAX_MS, np.round(gap_max, 1), rows, start=i0, valid=alive
    )
    run.add_samples(signals.CUDA_SYNC_MS, np.round(sync, 2), rows, start=i0, valid=alive)
    if W > 1:
        op_rows = [dict(row, labels={"op": "allreduce"}) for row in rows]
        run.add_samples(signals.NCCL_CALLS, calls, op_rows, start=i0, valid=alive)
        run.add_samples(
            signals.NCCL_BYTES, np.round(nbytes).astype(np.int64), op_rows, start=i0, valid=alive
        )
    run.add_samples(signals.HOST_CPU_UTIL, np.round(cpu, 3), rows, start=i0, valid=alive)

    # Input workers: saturated when the pipeline cannot keep up.
    produce = plan.data_frac * plan.step_time_s
    factor = np.ones(i1 - i0)
    if plan.starve is not None:
        factor = np.where(sub_edges[:-1] >= plan.starve[0], plan.starve[1], 1.0)
    step_span = np.clip(frac[:, :4].sum(axis=1), 0, 1)  # while the job is stepping
    load = np.clip(produce * factor / plan.step_time_s, 0, 1.0)
    wrows = []
    wvals = []
    for r, rk in enumerate(res.ranks):
        for w in range(plan.n_workers):
            wrows.append(
                {
                    "node": rk["node"],
                    "pid": rk["pid"] + 1 + w,
                    "job": plan.job_id,
                    "rank": r,
                    "local_rank": rk["local_rank"],
                }
            )
            wvals.append(
                np.clip(
                    load * step_span[r] * rng.uniform(0.9, 1.0) + rng.normal(0, 0.02, i1 - i0),
                    0.0,
                    1.0,
                )
                * (step_span[r] > 0)
                + 0.005
            )
    walive = np.repeat(alive, plan.n_workers, axis=0)
    # Input workers are forked once the model is loaded (see their process records).
    spawn = int(np.ceil(_worker_spawn_t(plan) + 1.0 - fleet.start_ts)) - i0
    walive[:, : max(0, spawn)] = False
    run.add_samples(
        signals.HOST_CPU_UTIL, np.round(np.array(wvals), 3), wrows, start=i0, valid=walive
    )
    for nid in sorted(set(plan.node_ids)):
        sel = [i for i, rk in enumerate(res.ranks) if rk["node_id"] == nid]
        total = cpu[sel].sum(axis=0) + np.array(wvals).reshape(W, plan.n_workers, -1)[sel].sum(
            axis=(0, 1)
        )
        fleet.host_cores_used[nid, i0:i1] += total * alive[sel].any(axis=0)
    res.bytes_per_step = bytes_per_step
    res.n_buckets = n_buckets
