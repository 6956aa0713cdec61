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

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent import signals
from agent.sim.fleet import Fleet, Mount
from agent.sim.hardware import compute_speed
from agent.sim.logs import (
    FRAMEWORKS,
    NanoGPT,
    StepLog,
    cuda_error_lines,
    make_formatter,
    nccl_watchdog_lines,
)
from agent.sim.run import SimRun

DATA, COMPUTE, WAIT, COMM, CKPT = range(5)
PHASES = ("data", "compute", "wait", "comm", "ckpt")
# DCGM ratios while in each phase: (engine, sm, occupancy, tensor, dram). Compute levels are
# per job (model dependent) and filled in by the plan.
_WAIT_LEVEL = (1.0, 0.13, 0.02, 0.0, 0.005)
_COMM_LEVEL = (1.0, 0.2, 0.03, 0.0, 0.15)
_CKPT_LEVEL = (0.0, 0.0, 0.0, 0.0, 0.02)
_BUSBW_NVLINK = 360e9
# Rank processes appear within this long after the job starts; their samples (and the job
# identity on their GPUs' samples) begin only once the process has been seen.
_PROC_SEEN_S = 0.8
_BUSBW_IB = 42e9
_H100_BF16_FLOPS = 989e12
_MODELS = (
    ("llama-1b", 1.2),
    ("gpt3-1.3b", 1.3),
    ("llama3-8b", 8.0),
    ("gpt3-7b", 6.7),
    ("mistral-7b", 7.2),
    ("llama2-13b", 13.0),
    ("gpt3-20b", 20.0),
)
_CMDS = {
    "megatron": "python -u pretrain_gpt.py --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --bf16",
    "hf_trainer": "python -u run_clm.py --model_name_or_path {model} --bf16 --do_train",
    "torchtitan": "python -m torchtitan.train --job.config_file ./train_configs/{model}.toml",
    "nanogpt": "python -u train.py config/train_gpt2.py",
}


@dataclass
class JobPlan:
    """Everything random about one job, drawn once from the scenario's RNG; knobs for faults."""

    job_id: str
    name: str
    scheduler: str
    framework: str
    node_ids: list[int]
    gpus_per_node: int
    model: str
    params_b: float
    step_time_s: float  # nominal step time on healthy hardware
    comm_frac: float
    data_frac: float  # batch production time / step time with healthy input
    n_workers: int
    compute_level: tuple[float, float, float, float, float]
    fb_used_mib: float
    precision: str
    seq_len: int
    global_batch: int
    tokens_per_step: float
    first_step: int
    total_steps: int
    ckpt_every: int
    ckpt_mount: Mount
    ckpt_bytes: float  # full checkpoint size (all ranks together)
    start_t: float  # absolute time the processes start
    init_s: float  # load/compile before the first step
    stop_after_steps: int | None = None  # completes (exit 0) after this many steps
    # Loss model.
    loss_start: float = 10.8
    loss_floor: float = 2.2
    loss_k0: float = 200.0
    loss_alpha: float = 0.6
    loss_noise: float = 0.01
    lr_peak: float = 3e-4
    warmup: int = 200
    # Fault knobs (all None/neutral for a healthy job).
    imbalance_seqs: int = 0  # >0: per-rank work from that many variable-length sequences
    imbalance_from: float = -math.inf  # absolute time the sampler becomes imbalanced
    slow_eff: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (from t, eff)
    pcie_rank: tuple[int, float, float] | None = None  # (rank, from t, bandwidth ratio)
    fabric: tuple[float, float] | None = None  # (from t, comm slow-down factor)
    starve: tuple[float, float] | None = None  # (from t, batch production time factor)
    ckpt_write_bw: tuple[float, float] | None = None  # (from t, bytes/s per node) on ckpt_mount
    ckpt_latency_ms: tuple[float, float] | None = None  # (from t, write latency ms)
    hang: tuple[int, float] | None = None  # (rank, from t): rank stops launching
    crash: tuple[int, float, str] | None = None  # (rank, t, CUDA error message)
    divergence: tuple[int, int] | None = None  # (drift start step, explode step)
    corruption_t: float | None = (
        None  # loss jumps from the step after this time (silent corruption)
    )
    no_learning: str | None = None  # "flat" | "zero_lr" | "zero_grad"
    nccl_timeout_s: float = 600.0
    hiccup_per_step: float = 0.002
    samples_per_epoch: float = 5e6
    rerun_of: str | None = None
    end_state: str | None = None  # forced end: ("cancelled", t) via cancel_at
    cancel_at: float | None = None

    def complete_after(self, steps: int, epochs: float = 1.0) -> None:
        """The run finishes (exit 0) after `steps` more steps — at its configured train_iters,
        as a real run does, with its LR schedule fitted to that length."""
        self.stop_after_steps = steps
        self.total_steps = self.first_step + steps
        self.warmup = max(1, min(self.warmup, steps // 10))
        self.samples_per_epoch = self.global_batch * steps / epochs

    def as_finetune(self, rng: np.random.Generator) -> None:
        """A short fine-tune of a pretrained model from step 0: loss starts near 2–3 and drops."""
        self.first_step = 0
        self.name = self.name.replace("-pretrain", "-sft")
        self.loss_start = float(rng.uniform(1.8, 3.0))
        self.loss_floor = self.loss_start * float(rng.uniform(0.35, 0.6))
        self.loss_k0 = float(rng.uniform(10, 80))
        self.loss_alpha = float(rng.uniform(0.5, 0.9))
        self.lr_peak = float(rng.choice([1e-5, 2e-5, 5e-5, 1e-4]))

    @property
    def world_size(self) -> int:
        return len(self.node_ids) * self.gpus_per_node


def draw_plan(
    rng: np.random.Generator,
    fleet: Fleet,
    *,
    node_ids: list[int],
    start_t: float,
    step_time_s: float | None = None,
    framework: str | None = None,
    ckpt_mount: Mount | None = None,
    job_id: str | None = None,
) -> JobPlan:
    scheduler = str(rng.choice(["slurm", "slurm", "slurm", "kubernetes", "torchrun"]))
    if job_id is None:
        if scheduler == "slurm":
            job_id = str(int(rng.integers(100000, 9999999)))
        elif scheduler == "kubernetes":
            job_id = f"pretrain-{rng.integers(1000, 9999)}-{''.join(rng.choice(list('abcdefghjkmnpqrstvwxz23456789'), 5))}-master-0"
        else:
            job_id = f"torchrun-{rng.integers(10**7, 10**8):x}"
    model, params_b = _MODELS[int(rng.integers(len(_MODELS)))]
    step = float(
        step_time_s if step_time_s is not None else np.exp(rng.uniform(np.log(0.3), np.log(5.0)))
    )
    world = len(node_ids) * fleet.gpus_per_node
    mfu = rng.uniform(0.32, 0.52)
    # Model FLOPs per step fix the tokens per step (6·P·tokens at the drawn MFU and step time).
    tokens = mfu * _H100_BF16_FLOPS * world * step / (6 * params_b * 1e9)
    seq_len = int(rng.choice([2048, 4096, 8192]))
    global_batch = max(1, round(tokens / seq_len))
    tensor = rng.uniform(0.38, 0.68)
    mount = (
        ckpt_mount
        if ckpt_mount is not None
        else (fleet.shared if rng.random() < 0.6 else fleet.local)
    )
    fw = framework or str(rng.choice(FRAMEWORKS))
    total = int(rng.choice([20000, 50000, 100000, 250000, 500000]))
    first = int(rng.choice([0, 0, 0, int(rng.integers(1, 200)) * 100]))
    n_steps_window = fleet.n_samples * fleet.interval_s / step
    ckpt_every = int(max(20, round(n_steps_window / rng.uniform(2.5, 6.0), -1)))
    # Healthy saves cost at most ~5% of the time: big models checkpoint less often.
    save_s = params_b * 1e9 * 14.0 / len(node_ids) / 1.5e9
    ckpt_every = max(ckpt_every, int(round(save_s / (0.05 * step), -1)))
    vocab_loss = float(np.log(rng.choice([32000, 50257, 128256])))
    return JobPlan(
        job_id=job_id,
        name=f"{model}-{'pretrain' if rng.random() < 0.6 else 'sft'}",
        scheduler=scheduler,
        framework=fw,
        node_ids=node_ids,
        gpus_per_node=fleet.gpus_per_node,
        model=model,
        params_b=params_b,
        step_time_s=step,
        comm_frac=float(rng.uniform(0.05, 0.16))
        if len(node_ids) > 1
        else float(rng.uniform(0.02, 0.07)),
        data_frac=float(rng.uniform(0.15, 0.45)),
        n_workers=int(rng.choice([2, 4, 6, 8])),
        compute_level=(
            float(rng.uniform(0.965, 0.995)),
            float(rng.uniform(0.80, 0.93)),
            float(rng.uniform(0.25, 0.5)),
            float(tensor),
            float(rng.uniform(0.25, 0.5)),
        ),
        fb_used_mib=float(rng.uniform(42000, 76000)),
        precision=str(rng.choice(["bf16", "bf16", "bf16", "fp8", "fp8", "fp16"])),
        seq_len=seq_len,
        global_batch=global_batch,
        tokens_per_step=float(tokens),
        first_step=first,
        total_steps=total,
        ckpt_every=ckpt_every,
        ckpt_mount=mount,
        ckpt_bytes=params_b * 1e9 * float(rng.uniform(12, 16)),  # bf16 weights + fp32 Adam
        start_t=start_t,
        init_s=float(rng.uniform(15, 75)),
        loss_start=vocab_loss if first == 0 else float(rng.uniform(2.6, 4.0)),
        loss_floor=float(rng.uniform(1.7, 2.6)),
        loss_k0=float(rng.uniform(50, 400)),
        loss_alpha=float(rng.uniform(0.35, 0.8)),
        loss_noise=float(rng.uniform(0.006, 0.02)),
        lr_peak=float(rng.choice([1e-4, 2e-4, 3e-4, 6e-4])),
        warmup=int(rng.choice([100, 200, 500, 2000])),
    )


@dataclass
class JobResult:
    plan: JobPlan
    ranks: list[dict[str, Any]]  # per rank: node, gpu, local_rank, pid, ...
    step_start: np.ndarray  # (K,)
    arrive: np.ndarray  # (W, K) compute end = arrival at the collective
    coll_start: np.ndarray  # (K,)
    coll_end: np.ndarray  # (K,)
    ckpt_end: np.ndarray  # (K,) == coll_end when no checkpoint after the step
    compute_start: np.ndarray  # (W, K)
    phase_frac: np.ndarray  # (W, 5, n): fraction of each sample in each phase
    proc_end: np.ndarray  # (W,) absolute time each rank's process exits
    proc_seen: np.ndarray  # (W,) when each rank's process record is emitted (first seen)
    exit_codes: np.ndarray  # (W,)
    state: str
    exit_code: int
    end_t: float
    hang_step: int | None = None
    bytes_per_step: float = 0.0
    n_buckets: int = 1


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


def _worker_spawn_t(plan: JobPlan) -> float:
    return plan.start_t + plan.init_s * 0.8


def _stop_time(plan: JobPlan) -> float:
    """When the hung or crashed rank stopped launching."""
    if plan.hang is not None:
        return plan.hang[1]
    if plan.crash is not None:
        return plan.crash[1]
    raise ValueError("job has neither a hang nor a crash")


def _record_step(S: list, A: list, CS: list, C: list, E: list, CK: list, *vals: Any) -> None:
    for lst, v in zip((S, A, CS, C, E, CK), vals, strict=True):
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
    rank_jitter = rng.normal(0, 0.004, W)
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
            work = 0.6 + 0.4 * work / mean_work
        else:
            work = 1.0 + rank_jitter + rng.normal(0, 0.008, W)
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
    _apply_to_fleet(result, fleet, rng, ckpt_steps)
    _emit_process_signals(result, fleet, run, rng)
    _emit_records(result, fleet, run, rng, ckpt_steps)
    return result


def _sample_span(fleet: Fleet, t0: float, t1: float) -> tuple[int, int]:
    i0 = int(np.clip(np.ceil((t0 - fleet.start_ts) / fleet.interval_s), 0, fleet.n_samples))
    i1 = (
        int(np.clip(np.ceil((t1 - fleet.start_ts) / fleet.interval_s), 0, fleet.n_samples))
        if np.isfinite(t1)
        else fleet.n_samples
    )
    return i0, max(i0, i1)


def _apply_to_fleet(
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


def _emit_process_signals(
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


def _lr(plan: JobPlan, step: int) -> float:
    if plan.no_learning == "zero_lr":
        return 0.0
    if step < plan.warmup:
        return plan.lr_peak * step / plan.warmup
    prog = min(1.0, (step - plan.warmup) / max(1, plan.total_steps - plan.warmup))
    return plan.lr_peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))


def _loss_curve(
    plan: JobPlan, steps: np.ndarray, rng: np.random.Generator, corrupt_from: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    s = steps.astype(float)
    if plan.no_learning in ("flat", "zero_lr", "zero_grad"):
        loss = np.full_like(s, plan.loss_start * rng.uniform(0.97, 1.0))
    else:
        loss = plan.loss_floor + (plan.loss_start - plan.loss_floor) * (1 + s / plan.loss_k0) ** (
            -plan.loss_alpha
        )
    loss = loss * (1 + rng.normal(0, plan.loss_noise, len(s)))
    g = 0.35 + 6.0 * np.exp(-s / 150.0)
    if plan.no_learning in ("flat", "zero_lr"):
        g = np.full_like(s, float(rng.uniform(0.8, 4.0)))  # weights never move: no decay
    gnorm = g * rng.lognormal(0, 0.18, len(s))
    if plan.no_learning == "zero_grad":
        gnorm = np.zeros_like(s)
    if plan.divergence is not None:
        k_d, k_x = plan.divergence
        rel = np.clip((s - k_d) / max(1, k_x - k_d), 0, None)
        loss = loss * (1 + 0.12 * np.clip(rel, 0, 1) ** 1.5)
        gnorm = gnorm * (1 + 8 * np.clip(rel, 0, 1) ** 2)
        exploded = s >= k_x
        loss = np.where(exploded, np.nan if rng.random() < 0.5 else loss * rng.uniform(3, 9), loss)
        gnorm = np.where(exploded, gnorm * rng.uniform(50, 500), gnorm)
    if corrupt_from is not None:
        bad = s >= corrupt_from
        loss = np.where(
            bad, np.nan if rng.random() < 0.6 else plan.loss_start * rng.uniform(1.2, 3.0), loss
        )
        gnorm = np.where(bad, gnorm * rng.uniform(100, 1e4), gnorm)
    return loss, gnorm


def _emit_records(
    res: JobResult,
    fleet: Fleet,
    run: SimRun,
    rng: np.random.Generator,
    ckpt_steps: list[tuple[int, float, float]],
) -> None:
    plan = res.plan
    W = plan.world_size
    nodes = [fleet.nodes[i].hostname for i in sorted(set(plan.node_ids))]
    ckpt_dir = f"{plan.ckpt_mount.path}/checkpoints/{plan.name}"
    config = {
        "framework": plan.framework,
        "model": plan.model,
        "params_b": plan.params_b,
        "precision": plan.precision,
        "seq_length": plan.seq_len,
        "global_batch_size": plan.global_batch,
        "lr": plan.lr_peak,
        "lr_warmup_iters": plan.warmup,
        "train_iters": plan.total_steps,
        "save_interval": plan.ckpt_every,
        "save": ckpt_dir,
        "num_workers": plan.n_workers,
        "nccl_timeout_s": plan.nccl_timeout_s,
    }
    job = {
        "type": "job",
        # A job already running when the recording began is first seen at its start.
        "ts": max(plan.start_t - rng.uniform(0.5, 3.0), fleet.start_ts),
        "job": plan.job_id,
        "kind": "training",
        "name": plan.name,
        "nodes": nodes,
        "world_size": W,
        "scheduler": plan.scheduler,
        "state": "running",
        "config": config,
    }
    if plan.rerun_of:
        job["rerun_of"] = plan.rerun_of
    run.add(job)
    cmd = _CMDS[plan.framework].format(model=plan.model)
    for r, rk in enumerate(res.ranks):
        base = {
            "node": rk["node"],
            "job": plan.job_id,
            "rank": r,
            "local_rank": rk["local_rank"],
            "world_size": W,
        }
        ts = float(res.proc_seen[r])
        run.add(
            {
                "type": "process",
                "ts": ts,
                "pid": rk["pid"],
                "gpu": rk["gpu"],
                "gpu_index": rk["gpu_index"],
                "cmd": cmd,
                **base,
            }
        )
        for w in range(plan.n_workers):
            run.add(
                {
                    "type": "process",
                    "ts": max(_worker_spawn_t(plan) + rng.uniform(0, 1), fleet.start_ts),
                    "pid": rk["pid"] + 1 + w,
                    "ppid": rk["pid"],
                    "cmd": cmd,
                    **base,
                }
            )
        if (
            np.isfinite(res.proc_end[r])
            and res.proc_end[r] < fleet.start_ts + fleet.n_samples * fleet.interval_s
        ):
            for w in range(plan.n_workers):
                run.add(
                    {
                        "type": "exit",
                        "ts": float(res.proc_end[r]),
                        "node": rk["node"],
                        "pid": rk["pid"] + 1 + w,
                        "exit_code": -15 if res.exit_codes[r] else 0,
                        "job": plan.job_id,
                    }
                )
            run.add(
                {
                    "type": "exit",
                    "ts": float(res.proc_end[r]),
                    "node": rk["node"],
                    "pid": rk["pid"],
                    "exit_code": int(res.exit_codes[r]),
                    "job": plan.job_id,
                    "rank": r,
                }
            )
    if res.state != "running":
        run.add(
            {
                "type": "job",
                "ts": float(res.end_t) + 0.5,
                "job": plan.job_id,
                "state": res.state,
                "exit_code": res.exit_code,
            }
        )

    # Training log from rank 0.
    fmt = make_formatter(
        plan.framework,
        ckpt_dir if plan.framework != "nanogpt" else f"out-{plan.model}",
        world_size=W,
    )
    r0 = res.ranks[0]
    log_base = {
        "node": r0["node"],
        "pid": r0["pid"],
        "job": plan.job_id,
        "rank": 0,
        "stream": "stdout",
    }

    def log(ts: float, line: str, **extra: Any) -> None:
        run.add({"type": "log", "ts": float(ts), "line": line, **log_base, **extra})

    for ts, line in fmt.preamble(plan.start_t + plan.init_s * 0.9, plan.params_b):
        log(ts, line)
    K = len(res.coll_end) if res.hang_step is None else res.hang_step
    if K == 0:
        return
    steps = plan.first_step + 1 + np.arange(K)
    step_end = res.ckpt_end[:K]
    corrupt_from = None
    if plan.corruption_t is not None:
        after = np.flatnonzero(step_end > plan.corruption_t)
        corrupt_from = int(steps[after[0]]) if len(after) else None
    loss, gnorm = _loss_curve(plan, steps, rng, corrupt_from)
    step_dur = np.diff(np.concatenate([[plan.start_t + plan.init_s], step_end]))
    fmt_interval = fmt.log_interval
    # Dynamic loss scaling exists only in fp16; bf16/fp8 runs print a constant 1.0.
    fp16 = plan.precision == "fp16"
    loss_scale = 65536.0 if fp16 else 1.0
    skipped = nan_iters = 0
    ckpt_after = {k: (t0, t1) for k, t0, t1 in ckpt_steps}
    start_idx = 0
    for k in range(K):
        step = int(steps[k])
        if math.isnan(loss[k]):
            nan_iters += 1
        if k in ckpt_after:
            t0, t1 = ckpt_after[k]
            if isinstance(fmt, NanoGPT):
                lv = float(loss[k])
                log(*fmt.eval_line(t0 + 0.005, step, lv, lv * 1.01 + 0.01))
            for ts, line in fmt.ckpt_begin(t0 + 0.01, step):
                log(ts, line)
            for ts, line in fmt.ckpt_end(t1, step, t1 - t0):
                log(ts, line)
        if step % fmt_interval != 0:
            continue
        sl = slice(start_idx, k + 1)
        start_idx = k + 1
        mean_dt = float(np.mean(step_dur[sl]))
        if fmt.name == "nanogpt":
            mean_dt = float(step_dur[k])  # nanoGPT prints the last iteration's time
        tflops = 6 * plan.params_b * 1e9 * plan.tokens_per_step / (mean_dt * W) / 1e12
        seg_loss = loss[sl]
        lval = float(np.nan if np.isnan(seg_loss).any() else np.mean(seg_loss))
        gval = float(np.nan if np.isnan(lval) else np.mean(gnorm[sl]))
        exploding = plan.divergence is not None and step >= plan.divergence[1]
        if fp16 and (exploding or math.isnan(lval)):
            # Overflowing gradients: fp16 skips the iteration and halves the scale.
            loss_scale = max(1.0, loss_scale / 2)
            skipped = int(rng.integers(1, 4))
        else:
            skipped = 0
        sl_log = StepLog(
            ts=float(step_end[k]) + 0.002,
            step=step,
            total_steps=plan.total_steps,
            loss=lval,
            lr=_lr(plan, step),
            grad_norm=gval,
            step_time_s=mean_dt,
            tflops_per_gpu=tflops,
            tokens_per_s_per_gpu=plan.tokens_per_step / (mean_dt * W),
            mfu=tflops * 1e12 / _H100_BF16_FLOPS,
            global_batch=plan.global_batch,
            seq_len=plan.seq_len,
            loss_scale=loss_scale,
            skipped=skipped,
            nan_iters=nan_iters,
            epoch=step * plan.global_batch / plan.samples_per_epoch,
            mem_gib=plan.fb_used_mib / 1024 * 0.85,
            mem_pct=plan.fb_used_mib / 1024 * 0.85 / 79.1 * 100,
        )
        for ts, line in fmt.step(sl_log):
            log(ts, line)
        nan_iters = 0 if fmt.name == "megatron" else nan_iters
    if res.state == "completed":
        last = float(step_end[K - 1]) + 0.5
        for ts, line in fmt.finished(last, sl_log, last - plan.start_t):  # type: ignore[possibly-undefined]
            log(ts, line)
    # Failure output: the crashed rank's traceback; the watchdog on every rank that waited.
    if res.hang_step is not None:
        seq = plan.first_step + res.hang_step + 1
        numel = int(max(res.bytes_per_step, 2e8) / 2 / max(res.n_buckets, 1))
        if plan.crash is not None:
            cr = plan.crash[0]
            rk = res.ranks[cr]
            for line in cuda_error_lines(cr, plan.crash[2]):
                run.add(
                    {
                        "type": "log",
                        "ts": plan.crash[1] + 0.1,
                        "line": line,
                        "node": rk["node"],
                        "pid": rk["pid"],
                        "job": plan.job_id,
                        "rank": cr,
                        "stream": "stderr",
                    }
                )
        for r, rk in enumerate(res.ranks):
            if not np.isfinite(res.arrive[r, res.hang_step]):
                continue
            ts = float(res.proc_end[r]) - 0.01
            if ts >= fleet.start_ts + fleet.n_samples * fleet.interval_s:
                continue
            for line in nccl_watchdog_lines(
                ts, r, seq, "ALLREDUCE", numel, int(plan.nccl_timeout_s * 1000)
            ):
                run.add(
                    {
                        "type": "log",
                        "ts": ts,
                        "line": line,
                        "node": rk["node"],
                        "pid": rk["pid"],
                        "job": plan.job_id,
                        "rank": r,
                        "stream": "stderr",
                    }
                )
