"""A simulated training job's records: job and process/exit records, rank 0's training log
in its framework's format (loss, LR, grad norm, throughput, checkpoint lines), and the failure
text of crashed or timed-out ranks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simulator.fleet import Fleet
from simulator.job import _CMDS, JobPlan, JobResult, _worker_spawn_t
from simulator.logs import (
    NanoGPT,
    StepLog,
    cuda_error_lines,
    make_formatter,
    nccl_watchdog_lines,
)
from simulator.run import SimRun


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


def emit_records(
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
    # The last step line printed; None while the run is too short to reach the print interval
    # (then the framework prints no end-of-training summary either: it has nothing to sum up).
    sl_log: StepLog | None = None
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
            mfu=tflops * 1e12 / fleet.spec.bf16_flops,
            global_batch=plan.global_batch,
            seq_len=plan.seq_len,
            loss_scale=loss_scale,
            skipped=skipped,
            nan_iters=nan_iters,
            epoch=step * plan.global_batch / plan.samples_per_epoch,
            mem_gib=plan.fb_used_mib / 1024 * 0.85,
            mem_pct=plan.fb_used_mib * 0.85 / fleet.spec.fb_total_mib * 100,
        )
        for ts, line in fmt.step(sl_log):
            log(ts, line)
        nan_iters = 0 if fmt.name == "megatron" else nan_iters
    if res.state == "completed" and sl_log is not None:
        last = float(step_end[K - 1]) + 0.5
        for ts, line in fmt.finished(last, sl_log, last - plan.start_t):
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
