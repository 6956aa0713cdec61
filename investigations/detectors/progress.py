"""Job-side families read from training progress and per-rank activity:
`numerical_divergence`, `no_learning`, `input_starvation`, `collective_hang`."""

from __future__ import annotations

import numpy as np

from agent import signals
from agent.parsers import training as tp
from investigations.detectors.common import MIN_SAMPLES, gpu_hours, hhmmss, shift_start
from investigations.findings import JOB, Finding, subject
from investigations.window import JobWindow, StepTable

# A loss has "exploded" when it is not finite or at least doubles its best value so far and
# stays up (median of the next 3 logged points ≥ 1.5× the best). Healthy noise and single
# spikes that recover are far smaller/shorter; a divergence does not come back.
EXPLODE_RATIO = 2.0
EXPLODE_HOLD_RATIO = 1.5
# Two reruns diverge "at the same step" when their explosion steps differ by ≤ 5% of the step
# count (and ≤ 50 steps): the same recipe and data order diverge within a few logging periods.
SAME_STEP_FRAC = 0.05
# No learning: the loss's median over the last fifth of the run is within 2% of its median over
# the first tenth. Any run that learns — even a fine-tune from a good checkpoint — drops its
# training loss by more than that over a full run.
NO_LEARNING_MAX_DROP = 0.02
NO_LEARNING_MIN_POINTS = 6
# "From scratch": the first logged step is ≤ 100 or ≤ 10% of the last one.
NO_LEARNING_SCRATCH_STEPS = 100
# Input starvation: GPUs idle ≥ 15% of the stepping time while the busiest input worker of
# each rank uses ≥ 90% of a core (a Python data-loader worker is single-threaded: it cannot go
# faster, so the GPUs wait on it).
STARVE_MIN_IDLE = 0.15
STARVE_WORKER_SATURATED = 0.9
# Hang: no rank launched a kernel for ≥ 30 s and ≥ 20 steps, while all but one rank sit in a
# collective (blocked in synchronize / NCCL kernel spinning).
HANG_MIN_S = 30.0
HANG_MIN_STEPS = 20.0


def _explosion(st: StepTable) -> int | None:
    loss = st.loss
    n = len(loss)
    best = np.inf
    for i in range(n):
        x = loss[i]
        if not np.isfinite(x):
            return i if i > 0 else None
        if best < np.inf and x >= EXPLODE_RATIO * best:
            nxt = loss[i + 1 : i + 4]
            if (
                not len(nxt)
                or np.any(~np.isfinite(nxt))
                or np.median(nxt) >= EXPLODE_HOLD_RATIO * best
            ):
                return i
        best = min(best, x)
    return None


def detect_numerical_divergence(w: JobWindow) -> list[Finding]:
    """Loss drifts then explodes/NaN; the verdict builder adds the hardware clearance. If an
    XID/ECC event hit the job's GPUs before the explosion, `hardware_fault` owns it instead."""
    st = w.steps
    if w.meta.kind == "inference" or len(st) < 5:
        return []
    ix = _explosion(st)
    if ix is None:
        return []
    t_x = float(st.ts[ix])
    from investigations.detectors.hardware import fault_events  # shared, avoids a cycle

    if any(e.ts <= t_x + 1.0 for e in fault_events(w)):
        return []
    pre = st.loss[:ix]
    i_min = int(np.nanargmin(pre)) if np.isfinite(pre).any() else 0
    t_d = float(st.ts[i_min])
    step_x = st.step[ix]
    f = Finding(
        family="numerical_divergence",
        category=JOB,
        title="Training diverged: loss drifted up then exploded",
        summary="",
        recommendation=(
            "Fix the recipe: lower the learning rate or add warm-up, enable gradient clipping, "
            "and for fp8 use per-tensor (delayed) scaling; resume from the last checkpoint "
            "before the drift."
        ),
        explanation="",
        confidence=0.8,
        interval=(t_d, t_x),
        subject=subject(job=w.job),
    )
    step_txt = f"step {int(step_x)}" if np.isfinite(step_x) else "a logged step"
    e1 = f.add(
        "log: loss",
        (t_d, t_x),
        "nan" if not np.isfinite(st.loss[ix]) else round(float(st.loss[ix]), 4),
        round(float(pre[i_min]), 4),
        f"loss at {step_txt}; baseline: its lowest value before, where the drift began",
        job=w.job,
    )
    cites = [e1]
    loss_cites = [e1]
    g = st.grad_norm[: ix + 1]
    if np.isfinite(g).sum() >= 3:
        loss_cites.append(
            f.add(
                "log: grad norm",
                (t_d, t_x),
                round(float(np.nanmax(g[i_min:])), 4),
                round(float(np.nanmedian(g[: max(1, i_min)])), 4),
                "largest gradient norm during the drift vs its median before",
                job=w.job,
            )
        )
    rerun_txt = ""
    for other, ost in w.related.items():
        ox = _explosion(ost) if len(ost) >= 5 else None
        if ox is None or not np.isfinite(ost.step[ox]) or not np.isfinite(step_x):
            continue
        tol = max(2.0, min(50.0, SAME_STEP_FRAC * max(step_x, ost.step[ox])))
        if abs(ost.step[ox] - step_x) <= tol:
            other_nodes = set(w.related_meta[other].nodes) if other in w.related_meta else set()
            elsewhere = bool(other_nodes) and not other_nodes & set(w.job_nodes())
            where = "on other nodes" if elsewhere else "on the same or unknown nodes"
            relation = (
                "a rerun of this job" if w.meta.rerun_of != other else "the run this job reruns"
            )
            e_r = f.add(
                "log: loss (rerun)",
                (float(ost.ts[0]), float(ost.ts[ox])),
                int(ost.step[ox]),
                int(step_x),
                f"job {other} ({relation}, {where}) diverged at this step; baseline: this "
                "job's divergence step",
                job=other,
            )
            cites.append(e_r)
            rerun_txt = (
                f" Job {other} ({relation}) {where} diverged at step {int(ost.step[ox])} "
                f"[{e_r}]" + (": the recipe, not the hardware." if elsewhere else ".")
            )
            f.confidence = 0.92
    f.summary = (
        f"The loss drifted up from its low of {float(pre[i_min]):.3f} at {hhmmss(t_d)} and "
        f"exploded at {step_txt} ({hhmmss(t_x)}) [{', '.join(loss_cites)}]." + rerun_txt
    )
    f.explanation = (
        "The loss rose gradually before it blew up, the signature of an unstable optimisation "
        "(learning rate, precision scaling) rather than a sudden hardware corruption; no "
        "hardware XID or ECC event hit the job's GPUs before it (the hardware clearance below "
        "lists every counter's change over the job's window)."
    )
    f.gpu_hours_lost = gpu_hours(w.world, max(0.0, w.t1 - t_d))
    return [f]


def _from_scratch(st: StepTable) -> bool:
    """The logged run starts near its step 0. A flat loss is only evidence of not learning
    early in training, where a learning run's loss falls steeply; a run resumed late (step
    3400 of a long schedule) legitimately sits on a plateau. Unknown step numbers count as
    from scratch."""
    steps = st.step[np.isfinite(st.step)]
    if not len(steps):
        return True
    return bool(steps[0] <= max(NO_LEARNING_SCRATCH_STEPS, 0.1 * steps[-1]))


def detect_no_learning(w: JobWindow) -> list[Finding]:
    """A run that completed (exit 0) yet learned nothing."""
    if w.meta.kind == "inference":
        return []
    done = w.meta.state == "completed" or w.meta.exit_code == 0
    done = done or any(e.kind == tp.COMPLETED for e in w.log_events)
    if not done:
        return []
    st = w.steps
    if len(st) < NO_LEARNING_MIN_POINTS:
        return []
    a, b = float(st.ts[0]), float(st.ts[-1])
    f = Finding(
        family="no_learning",
        category=JOB,
        title="Run completed but learned nothing",
        summary="",
        recommendation=(
            "Check the optimizer setup before rerunning: learning-rate schedule (peak and "
            "warm-up), parameters actually passed to the optimizer / not frozen, loss wired to "
            "the model's output, and labels matching inputs."
        ),
        explanation="",
        confidence=0.9,
        interval=(a, b),
        subject=subject(job=w.job),
    )
    lr = st.lr[np.isfinite(st.lr)]
    gn = st.grad_norm[np.isfinite(st.grad_norm)]
    loss = st.loss[np.isfinite(st.loss)]
    if len(lr) >= NO_LEARNING_MIN_POINTS and np.all(lr == 0):
        e = f.add(
            "log: learning rate", (a, b), 0.0, None, "learning rate on every logged step", job=w.job
        )
        f.summary = (
            f"The run completed but its learning rate was 0 on all {len(lr)} logged steps [{e}]."
        )
        f.explanation = "With a zero learning rate no weight changes: the GPU-hours bought nothing."
    elif len(gn) >= NO_LEARNING_MIN_POINTS and np.all(gn == 0):
        e = f.add(
            "log: grad norm", (a, b), 0.0, None, "gradient norm on every logged step", job=w.job
        )
        f.summary = (
            f"The run completed but its gradient norm was 0 on all {len(gn)} logged steps [{e}]."
        )
        f.explanation = (
            "Zero gradients mean the loss does not depend on any trained parameter (frozen "
            "weights, detached graph): nothing was learned."
        )
    elif len(loss) >= NO_LEARNING_MIN_POINTS and _from_scratch(st):
        head = float(np.median(loss[: max(2, len(loss) // 10)]))
        tail = float(np.median(loss[-max(2, len(loss) // 5) :]))
        drop = (head - tail) / abs(head) if head else 0.0
        if drop >= NO_LEARNING_MAX_DROP:
            return []
        e = f.add(
            "log: loss",
            (a, b),
            round(tail, 4),
            round(head, 4),
            "median loss over the last fifth of the run vs the first tenth",
            job=w.job,
        )
        f.summary = (
            f"The run completed but its loss went from {head:.3f} to {tail:.3f} "
            f"({drop:+.1%}) over {len(loss)} logged steps [{e}]."
        )
        f.explanation = (
            "A run that learns lowers its training loss well beyond noise; this one did not."
        )
    else:
        return []
    f.gpu_hours_lost = gpu_hours(w.world, b - a)
    return [f]


def detect_input_starvation(w: JobWindow) -> list[Finding]:
    if w.meta.kind == "inference" or w.worker_cpu is None or w.world < 1:
        return []
    eng = w.gpu.get(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)
    if eng is None or not np.isfinite(eng).any():
        util = w.gpu.get(signals.DCGM_FI_DEV_GPU_UTIL)
        if util is None:
            return []
        eng = util / 100.0
    ok = np.isfinite(eng).all(axis=0) & np.isfinite(w.worker_cpu).all(axis=0)
    # Stepping samples: input workers are producing (they go quiet at a checkpoint, at init).
    wk = np.nan_to_num(w.worker_cpu, nan=0.0).mean(axis=0)
    if not (wk > 0.05).any():
        return []
    ok &= wk > 0.1 * float(np.median(wk[wk > 0.05]))
    if ok.sum() < MIN_SAMPLES:
        return []
    idle = 1.0 - eng[:, ok].mean(axis=0)
    cpu = w.worker_cpu[:, ok]
    times = w.times[ok]
    k = shift_start(idle)
    idle_post = float(idle[k:].mean())
    cpu_post = float(np.median(cpu[:, k:].max(axis=0)))
    if idle_post < STARVE_MIN_IDLE or cpu_post < STARVE_WORKER_SATURATED:
        return []
    a, b = float(times[k]), float(times[-1])
    f = Finding(
        family="input_starvation",
        category=JOB,
        title="GPUs wait for input: the data pipeline is too slow",
        summary="",
        recommendation=(
            "Give the data loader more worker processes (num_workers), pre-tokenize/pre-process "
            "the dataset offline, and enable pinned memory and prefetching."
        ),
        explanation="",
        confidence=round(min(0.95, 0.6 + idle_post), 2),
        interval=(a, b),
        subject=subject(job=w.job),
    )
    e1 = f.add(
        signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        (a, b),
        round(idle_post, 4),
        round(float(idle[:k].mean()), 4) if k >= 10 else None,
        "share of time the GPUs were idle while the job was stepping (1 − engine active)",
        job=w.job,
    )
    e2 = f.add(
        signals.HOST_CPU_UTIL,
        (a, b),
        round(cpu_post, 3),
        1.0,
        "median CPU of each rank's busiest input-worker process (cores); baseline: one "
        "core, the most a single-threaded worker can use",
        job=w.job,
    )
    f.summary = (
        f"Since {hhmmss(a)} the GPUs were idle {idle_post:.0%} of the time between steps [{e1}] "
        f"while the input workers ran at {cpu_post:.0%} of a core [{e2}]."
    )
    f.explanation = (
        "The GPUs finish each step and wait for the next batch; the workers that produce "
        "batches are CPU-saturated, so the data pipeline, not the GPUs, sets the pace."
    )
    f.slowdown_pct = round(100.0 * idle_post / max(1e-6, 1 - idle_post), 1)
    f.gpu_hours_lost = gpu_hours(w.world, (b - a) * idle_post)
    return [f]


def detect_collective_hang(w: JobWindow) -> list[Finding]:
    if w.meta.kind == "inference" or w.world < 2:
        return []
    launches = w.proc.get(signals.CUDA_LAUNCHES)
    sync = w.proc.get(signals.CUDA_SYNC_MS)
    eng = w.gpu.get(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)
    tensor = w.gpu.get(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
    if launches is not None and np.isfinite(launches).any():
        # Only while the processes are alive (reporting): after the watchdog killed the job,
        # its GPUs may still read busy, but nothing is hanging any more.
        alive = np.isfinite(launches).sum(axis=0) >= w.world - 1
        none = (np.nan_to_num(launches, nan=0.0).max(axis=0) <= 0) & alive
        source = signals.CUDA_LAUNCHES
    elif tensor is not None and eng is not None and np.isfinite(tensor).any():
        # Without eBPF: no rank's tensor pipes compute (≤ 2% — an NCCL kernel spinning does
        # not use them) is "nothing launched" as far as the GPUs can tell.
        none = np.nan_to_num(tensor, nan=0.0).max(axis=0) <= 0.02
        source = signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    else:
        return []
    # "Blocked in a collective": the rank's host sits in synchronize for ≥ 90% of the interval,
    # or its GPU spins an NCCL kernel (engine active ≥ 0.9).
    blocked = np.zeros((w.world, len(w.times)), dtype=bool)
    if sync is not None:
        blocked |= np.nan_to_num(sync, nan=0.0) >= 0.9 * w.dt * 1000.0
    if eng is not None:
        blocked |= np.nan_to_num(eng, nan=0.0) >= 0.9
    quorum = blocked.sum(axis=0) >= w.world - 1
    hang = none & quorum
    # Samples where no rank reported at all (a collection gap) neither start nor end a hang.
    seen = launches if source == signals.CUDA_LAUNCHES else tensor
    gap: np.ndarray = (
        ~np.isfinite(seen).any(axis=0) if seen is not None else np.zeros(len(w.times), bool)
    )
    # Longest run of hang samples, bridging collection gaps.
    best = (0, 0)
    i = 0
    n = len(hang)
    while i < n:
        if hang[i]:
            j = i
            last = i
            while j < n and (hang[j] or gap[j]):
                if hang[j]:
                    last = j
                j += 1
            if last + 1 - i > best[1] - best[0]:
                best = (i, last + 1)
            i = last + 1
        else:
            i += 1
    a_i, b_i = best
    step_s = 0.0
    if len(w.steps) >= 3 and np.isfinite(w.steps.iter_ms).any():
        step_s = float(np.nanmedian(w.steps.iter_ms)) / 1000.0
    if (b_i - a_i) * w.dt < max(HANG_MIN_S, HANG_MIN_STEPS * step_s):
        return []
    stuck = blocked[:, a_i:b_i].mean(axis=1)
    row = int(np.argmin(stuck))
    if stuck[row] > 0.5:
        return []
    r = w.ranks[row]
    from investigations.detectors.hardware import fault_events

    if any(e.gpu == r.gpu or (not e.gpu and e.node == r.node) for e in fault_events(w)):
        return []
    a, b = w.ts_at(a_i), w.ts_at(b_i - 1)
    f = Finding(
        family="collective_hang",
        category=JOB,
        title=f"Collective hang: rank {r.rank} never arrived",
        summary="",
        recommendation=(
            f"Dump rank {r.rank}'s Python stack (py-spy dump --pid {r.pid}) to find where it is "
            "stuck; check for rank-dependent code paths (data, logging, checkpoint on rank 0 "
            "only) before a collective. Lower the NCCL timeout so hangs fail fast."
        ),
        explanation="",
        confidence=0.85,
        interval=(a, b),
        subject=subject(job=w.job, node=r.node, gpu=r.gpu, rank=r.rank),
    )
    e1 = f.add(
        source,
        (a, b),
        0,
        None,
        "kernel launches on every rank over the hang"
        if source == signals.CUDA_LAUNCHES
        else "tensor-pipe activity on every rank over the hang (no eBPF: GPU view only)",
        job=w.job,
    )
    e2 = f.add(
        signals.CUDA_SYNC_MS if sync is not None else signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        (a, b),
        round(float(blocked[:, a_i:b_i].all(axis=1).sum()), 0),
        w.world,
        "ranks blocked in a collective for the whole interval; baseline: world size",
        job=w.job,
    )
    e3 = f.add(
        "blocked share",
        (a, b),
        round(float(stuck[row]), 3),
        1.0,
        f"share of the hang rank {r.rank} spent in a collective (the others: ~1)",
        node=r.node,
        gpu=r.gpu,
        rank=r.rank,
        job=w.job,
    )
    cites = [e1, e2, e3]
    watchdog = [e for e in w.log_events if e.kind == tp.NCCL_TIMEOUT]
    if watchdog:
        cites.append(
            f.add(
                "log: NCCL watchdog",
                (watchdog[0].ts, watchdog[-1].ts),
                len(watchdog),
                None,
                watchdog[0].text[:200],
                job=w.job,
            )
        )
    f.summary = (
        f"From {hhmmss(a)} for {b - a:.0f} s no rank launched a kernel [{e1}]; "
        f"{w.world - 1} ranks waited in a collective [{e2}] while rank {r.rank} ({r.node}) "
        f"never entered it [{e3}]."
    )
    f.explanation = (
        "All ranks but one are blocked in the same collective: it completes only when every "
        f"rank joins, and rank {r.rank} is busy elsewhere (its GPU idle, not in NCCL), so the "
        "job is stuck in that rank's own code, not in the network."
    )
    f.gpu_hours_lost = gpu_hours(w.world, b - a)
    return [f]
