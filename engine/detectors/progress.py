"""Job-side families read from training progress and per-rank activity:
`numerical_divergence`, `no_learning`, `input_starvation`, `collective_hang`."""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.parsers import training as tp
from engine.detectors.common import gpu_hours, hhmmss, new_finding, shift_start, step_seconds
from engine.detectors.hardware import fault_events
from engine.findings import JOB, Finding
from engine.window import JobWindow, StepTable

# A loss has "exploded" when it is not finite or at least doubles its best value so far and
# stays up (median of the next 3 logged points ≥ 1.5× the best). Healthy noise and single
# spikes that recover are far smaller/shorter; a divergence does not come back. A loss that
# climbs by orders of magnitude passes this long before it overflows to NaN, so a recipe that
# never prints NaN still diverges here.
EXPLODE_RATIO = 2.0
EXPLODE_HOLD_RATIO = 1.5
# A gradient norm printed non-finite (nan/inf) on 3 logged lines in a row (or on every line to
# the end of the run, at least 2) is a divergence even when the printed loss looks fine: the
# Hugging Face Trainer leaves non-finite losses out of the average it logs, so a run of NaN
# steps prints `'loss': '0'` next to `'grad_norm': 'nan'` — that pair on one line is enough
# (a real loss is never exactly 0 with NaN gradients). One inf on its own, next to a real
# loss, is an fp16 overflow step that the loss scaler skipped, which healthy runs print.
GRAD_NONFINITE_RUN = 3
# A loss that doubled its low needs a low worth the name: ≥ 5 logged losses. A line that
# printed a non-finite loss after a finite one, or the Trainer's loss 0 beside a non-finite
# gradient norm, is the divergence itself, and needs only the line before it: a job logging
# every 40 s (long steps, or a sparse logging interval) waited 41 and 84 s more for the count
# (`proof eval --time-to-verdict --nodes 0`, seeds 1 and 3: the NaN on the 3rd and 4th line).
EXPLODE_MIN_POINTS = 5
# The loss "drifted up" before exploding when the last point before the explosion is ≥ 10%
# above the low; otherwise it blew up abruptly (the summary says which).
DRIFT_RATIO = 1.1
# Two reruns diverge "at the same step" when their explosion steps differ by ≤ 5% of the step
# count (and ≤ 50 steps): the same recipe and data order diverge within a few logging periods.
SAME_STEP_FRAC = 0.05
# No learning: the loss's median over the last fifth of the run is not ≥ 2% below its median
# over the first tenth. Any run that learns — even a fine-tune from a good checkpoint — drops
# its training loss by more than that over a full run. A loss that explodes is a divergence,
# never no_learning (the two are decided by the same `_explosion` test, so they exclude each
# other).
NO_LEARNING_MAX_DROP = 0.02
NO_LEARNING_MIN_POINTS = 6
# "From scratch": the first logged step is ≤ 100 or ≤ 10% of the last one.
NO_LEARNING_SCRATCH_STEPS = 100
# Input starvation: GPUs idle ≥ 15% of the stepping time while the busiest input worker of
# each rank uses ≥ 90% of a core (a Python data-loader worker is single-threaded: it cannot go
# faster, so the GPUs wait on it).
STARVE_MIN_IDLE = 0.15
STARVE_WORKER_SATURATED = 0.9
# …judged on ≥ 5 stepping samples after the idle share's change point (5 s at 1 s) and ≥ 3 of
# the job's steps (its log's cadence; a long step's data wait falls in one part of it): the
# idle share of one sample of a healthy job is a few % with an sd of ~1–2%, so a 5-sample mean
# has an sd ≤ 1% and 15% is > 10 sd out; the saturated-worker condition must hold on the same
# samples. Measured: `proof eval --time-to-verdict --prefix-step 1` input_starvation 10/10 s
# → see docs/detectors.md. (Was 10 samples; before that MIN_SAMPLES, 20.)
STARVE_MIN_SAMPLES = 5
STARVE_MIN_STEPS = 3.0
# Hang: while all but one rank sit in a collective (blocked in synchronize / NCCL kernel
# spinning ≥ 90% of every sample) and no rank launches a kernel, the job makes no progress.
# Judged against the job's own step time (the log's cadence): the rank that never arrived has
# launched nothing for ≥ 2 of the job's steps and ≥ 4 s, and the others have been blocked for
# ≥ 3 samples (3 s at 1 s). A healthy job launches kernels on every rank every step, so two
# steps of silence on one rank with every other rank blocked waiting for it is outside its
# rhythm; the 4 s / 3-sample floors are above a collection hiccup (a late sample, one sample
# where a rank's kernels straddle the boundary). The blocked quorum, not the length, is what
# tells a hang from a pause (a save, an input stall: ranks idle, not blocked), and a checkpoint
# save in progress (its begin line logged, no end yet) is never a hang: a rank-0-only save
# holds the others in a barrier exactly so. Without a known step time the old fixed floor
# holds: ≥ 15 s of hang samples. Measured: `proof eval --time-to-verdict --prefix-step 1`
# collective_hang 18/18 s → see docs/detectors.md. (Was 15 s and 5 steps of hang samples for
# every job; before that 30 s and 20 steps.)
HANG_MIN_S = 4.0
HANG_MIN_STEPS = 2.0
HANG_MIN_BLOCKED_SAMPLES = 3
HANG_UNKNOWN_STEP_MIN_S = 15.0

# How the loss diverged (`_explosion`'s second value).
LOSS_NONFINITE = "loss_nonfinite"
GRAD_NONFINITE = "grad_nonfinite"
LOSS_ROSE = "loss_rose"


def _explosion(st: StepTable) -> tuple[int, str] | None:
    """(row, how) of the first logged point where training diverged, on a table of rows that
    printed a loss (`StepTable.with_loss()`); None when it did not."""
    loss = st.loss
    bad_grad = st.grad_nonfinite()
    n = len(loss)
    best = np.inf
    for i in range(n):
        x = loss[i]
        if not np.isfinite(x):
            return (i, LOSS_NONFINITE) if i > 0 else None
        if i > 0 and bad_grad[i]:
            if x == 0.0:
                return i, GRAD_NONFINITE  # every step of the window was NaN (see above)
            run = bad_grad[i : i + GRAD_NONFINITE_RUN]
            if run.all() and (len(run) == GRAD_NONFINITE_RUN or (i + len(run) == n > i + 1)):
                return i, GRAD_NONFINITE
        if best < np.inf and x >= EXPLODE_RATIO * best:
            nxt = loss[i + 1 : i + 4]
            if (
                not len(nxt)
                or np.any(~np.isfinite(nxt))
                or np.median(nxt) >= EXPLODE_HOLD_RATIO * best
            ):
                return i, LOSS_ROSE
        best = min(best, x)
    return None


def _num(x: float) -> str:
    """A loss as a sentence prints it: 4 significant digits, thousands separated."""
    return f"{x:,.4g}"


def times(ratio: float) -> str:
    """`3.6×`, `27×`, `1,318×`."""
    if ratio < 10:
        return f"{ratio:.1f}×"
    return f"{ratio:,.0f}×"


def describe_change(before: float, after: float) -> str:
    """How a loss moved from `before` to `after`, with the right sign and a sane scale:
    `fell 12.3%`, `rose 4.1%`, `rose 27× (from 5.4 to 146)`, `stayed at 4.05`."""
    if after == before or (before and abs(after - before) < 5e-4 * abs(before)):
        return f"stayed at {_num(before)}"
    if before > 0 and after >= 2 * before:
        return f"rose {times(after / before)} (from {_num(before)} to {_num(after)})"
    if before:
        rel = (after - before) / abs(before)
        verb = "rose" if rel > 0 else "fell"
        return f"{verb} {abs(rel):.1%} (from {_num(before)} to {_num(after)})"
    verb = "rose" if after > before else "fell"
    return f"{verb} from {_num(before)} to {_num(after)}"


def _step_txt(st: StepTable, i: int) -> str:
    s = st.step[i]
    if np.isfinite(s):
        return f"step {int(s)}"
    if st.epoch is not None and np.isfinite(st.epoch[i]) and st.epoch[i] > 0:
        return f"the line logged at epoch {st.epoch[i]:g}"
    return "a logged step"


def detect_numerical_divergence(w: JobWindow) -> list[Finding]:
    """The loss explodes, goes NaN, or the gradients stay non-finite; the verdict builder adds
    the hardware clearance. If an XID/ECC event hit the job's GPUs before the explosion,
    `hardware_fault` owns it instead."""
    st = w.steps.with_loss()
    if w.meta.kind == "inference" or len(st) < 2:
        return []
    found = _explosion(st)
    if found is None:
        return []
    ix, how = found
    if how == LOSS_ROSE and len(st) < EXPLODE_MIN_POINTS:
        return []
    t_x = float(st.ts[ix])
    if any(e.ts <= t_x + 1.0 for e in fault_events(w)):
        return []
    pre = st.loss[:ix]
    i_min = int(np.nanargmin(pre)) if np.isfinite(pre).any() else 0
    low = float(pre[i_min])
    t_d = float(st.ts[i_min])
    step_x = st.step[ix]
    x = float(st.loss[ix])
    drifted = ix - 1 > i_min and float(st.loss[ix - 1]) >= DRIFT_RATIO * low > 0
    title = {
        LOSS_NONFINITE: "Training diverged: the loss went non-finite",
        GRAD_NONFINITE: "Training diverged: the gradients went non-finite",
        LOSS_ROSE: "Training diverged: the loss exploded",
    }[how]
    f = new_finding(
        "numerical_divergence",
        JOB,
        title,
        (t_d, t_x),
        0.8,
        "Fix the recipe: lower the learning rate or add warm-up, enable gradient clipping, "
        "and for fp8 use per-tensor (delayed) scaling; resume from the last checkpoint "
        "before the drift.",
        job=w.job,
    )
    step_txt = _step_txt(st, ix)
    low_txt = f"{_step_txt(st, i_min)}, {hhmmss(t_d)}"
    x_obs: float | str = round(x, 4) if np.isfinite(x) else ("nan" if x != x else "inf")
    e1 = f.add_job(
        "log: loss",
        x_obs,
        round(low, 4),
        f"loss at {step_txt}; baseline: its lowest value before ({low_txt})",
    )
    cites = [e1]
    loss_cites = [e1]
    g = st.grad_norm[: ix + 1]
    if how == GRAD_NONFINITE:
        bad = st.grad_nonfinite()
        k = ix
        while k < len(bad) and bad[k]:
            k += 1
        gfin = st.grad_norm[:ix][np.isfinite(st.grad_norm[:ix])]
        gv = float(st.grad_norm[ix])
        e_g = f.add(
            "log: grad norm",
            (t_x, float(st.ts[k - 1])),
            "nan" if gv != gv else "inf",
            round(float(np.median(gfin)), 4) if len(gfin) else None,
            f"gradient norm from {step_txt} on ({k - ix} logged line(s) in a row); baseline: "
            "its median before",
            job=w.job,
        )
        loss_cites.insert(0, e_g)
        stayed = f" and stayed so on {k - ix} logged lines in a row" if k - ix > 1 else ""
        what = (
            f"The gradient norm went non-finite at {step_txt} ({hhmmss(t_x)}){stayed} "
            f"[{e_g}]; the loss printed there was {_num(x)}, against a low of {_num(low)} "
            f"before [{e1}]."
        )
        if x == 0.0:
            what += (
                " A loss of exactly 0 next to a non-finite gradient is not a real value: the "
                "Hugging Face Trainer, for one, leaves non-finite losses out of the average "
                "it prints."
            )
    elif how == LOSS_NONFINITE:
        prev = float(st.loss[ix - 1])
        what = f"The loss went {x_obs} at {step_txt} ({hhmmss(t_x)}) [{e1}]" + (
            f" after drifting up from its low of {_num(low)} ({low_txt}) to {_num(prev)}."
            if drifted
            else f"; it was {_num(prev)} on the line before (low {_num(low)})."
        )
    else:
        rest = st.loss[ix:]
        j = int(np.nanargmax(np.where(np.isfinite(rest), rest, -np.inf)))
        peak = float(rest[j])
        t_p = float(st.ts[ix + j])
        e_p = f.add(
            "log: loss",
            (t_x, t_p),
            round(peak, 4),
            round(low, 4),
            f"highest loss after the explosion, at {_step_txt(st, ix + j)}; baseline: the low",
            job=w.job,
        )
        loss_cites.append(e_p)
        start = (
            f"The loss drifted up from its low of {_num(low)} ({low_txt}) and exploded"
            if drifted
            else f"The loss exploded from its low of {_num(low)} ({low_txt})"
        )
        what = (
            f"{start} to {_num(x)} at {step_txt} ({hhmmss(t_x)}), {times(x / low)} the low [{e1}]"
            if low > 0
            else f"{start} to {_num(x)} at {step_txt} ({hhmmss(t_x)}) [{e1}]"
        )
        if j > 0:
            what += f", and kept climbing to {_num(peak)} at {_step_txt(st, ix + j)}" + (
                f" ({times(peak / low)} the low) [{e_p}]." if low > 0 else f" [{e_p}]."
            )
        else:
            what += f" [{e_p}]."
    if how != GRAD_NONFINITE and np.isfinite(g).sum() >= 3:
        loss_cites.append(
            f.add_job(
                "log: grad norm",
                round(float(np.nanmax(g[i_min:])), 4),
                round(float(np.nanmedian(g[: max(1, i_min)])), 4),
                "largest gradient norm from the low to the explosion vs its median before",
            )
        )
        if what.endswith("]."):
            what = what[:-2] + f", {loss_cites[-1]}]."
    rerun_txt = ""
    for other, ost_all in w.related.items():
        ost = ost_all.with_loss()
        found_o = _explosion(ost) if len(ost) >= 5 else None
        if found_o is None:
            continue
        ox = found_o[0]
        if not np.isfinite(ost.step[ox]) or not np.isfinite(step_x):
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
    f.summary = what + rerun_txt
    if drifted:
        cause = (
            "The loss rose gradually before it blew up, the signature of an unstable "
            "optimisation (learning rate, precision scaling) rather than a sudden hardware "
            "corruption"
        )
    else:
        cause = (
            "The run diverged without a hardware event: an unstable optimisation (learning "
            "rate, missing warm-up or clipping, precision scaling) or a numerical fault in the "
            "recipe (a division by zero, the log of 0, an overflow)"
        )
    f.explanation = (
        f"{cause}; no hardware XID or ECC event hit the job's GPUs before it (the hardware "
        "clearance below lists every counter's change over the job's window)."
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
    """A run that completed (exit 0) yet learned nothing — and did not diverge (a loss that
    explodes is `numerical_divergence`, whichever way its median moved)."""
    if w.meta.kind == "inference":
        return []
    done = w.meta.state == "completed" or w.meta.exit_code == 0
    done = done or any(e.kind == tp.COMPLETED for e in w.log_events)
    if not done:
        return []
    st = w.steps
    with_loss = st.with_loss()
    if len(st) < NO_LEARNING_MIN_POINTS:
        return []
    if len(with_loss) >= 2 and _explosion(with_loss) is not None:
        return []
    a, b = float(st.ts[0]), float(st.ts[-1])
    f = new_finding(
        "no_learning",
        JOB,
        "Run completed but learned nothing",
        (a, b),
        0.9,
        "Check the optimizer setup before rerunning: learning-rate schedule (peak and "
        "warm-up), parameters actually passed to the optimizer / not frozen, loss wired to "
        "the model's output, and labels matching inputs.",
        job=w.job,
    )
    lr = st.lr[np.isfinite(st.lr)]
    gn = st.grad_norm[np.isfinite(st.grad_norm)]
    loss = with_loss.loss[np.isfinite(with_loss.loss)]
    if len(lr) >= NO_LEARNING_MIN_POINTS and np.all(lr == 0):
        e = f.add_job("log: learning rate", 0.0, None, "learning rate on every logged step")
        f.summary = (
            f"The run completed but its learning rate was 0 on all {len(lr)} logged steps [{e}]."
        )
        f.explanation = "With a zero learning rate no weight changes: the GPU-hours bought nothing."
    elif len(gn) >= NO_LEARNING_MIN_POINTS and np.all(gn == 0):
        e = f.add_job("log: grad norm", 0.0, None, "gradient norm on every logged step")
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
        e = f.add_job(
            "log: loss",
            round(tail, 4),
            round(head, 4),
            "median loss over the last fifth of the run vs the first tenth",
        )
        f.summary = (
            f"The run completed but its loss {describe_change(head, tail)} over "
            f"{len(loss)} logged steps (median of the first tenth vs the last fifth) [{e}]."
        )
        f.explanation = (
            "A run that learns lowers its training loss well beyond noise (here: at least "
            f"{NO_LEARNING_MAX_DROP:.0%}); this one did not."
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
    step_s = step_seconds(w)
    min_n = STARVE_MIN_SAMPLES
    if np.isfinite(step_s):
        min_n = max(min_n, int(np.ceil(STARVE_MIN_STEPS * step_s / w.dt)))
    if ok.sum() < min_n:
        return []
    idle = 1.0 - eng[:, ok].mean(axis=0)
    cpu = w.worker_cpu[:, ok]
    times = w.times[ok]
    k = shift_start(idle, min_len=min_n)
    idle_post = float(idle[k:].mean())
    cpu_post = float(np.median(cpu[:, k:].max(axis=0)))
    if idle_post < STARVE_MIN_IDLE or cpu_post < STARVE_WORKER_SATURATED:
        return []
    a, b = float(times[k]), float(times[-1])
    f = new_finding(
        "input_starvation",
        JOB,
        "GPUs wait for input: the data pipeline is too slow",
        (a, b),
        round(min(0.95, 0.6 + idle_post), 2),
        "Give the data loader more worker processes (num_workers), pre-tokenize/pre-process "
        "the dataset offline, and enable pinned memory and prefetching.",
        job=w.job,
    )
    e1 = f.add_job(
        signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        round(idle_post, 4),
        round(float(idle[:k].mean()), 4) if k >= 10 else None,
        "share of time the GPUs were idle while the job was stepping (1 − engine active)",
    )
    e2 = f.add_job(
        signals.HOST_CPU_UTIL,
        round(cpu_post, 3),
        1.0,
        "median CPU of each rank's busiest input-worker process (cores); baseline: one "
        "core, the most a single-threaded worker can use",
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


def _hang_from_timeouts(w: JobWindow) -> list[Finding]:
    """Without a GPU view of the ranks (no eBPF launches, no DCGM profiling: a CPU job, or a
    node without either), a hang is seen only when the communication library itself says a
    collective timed out (gloo's "Timed out waiting Nms for recv operation", NCCL's watchdog):
    that is the evidence that every waiting rank sat in it for the whole timeout. The rank
    that never arrived is the one rank of the world that did not time out, when the output
    says which ranks did; else the job alone is the subject."""
    timeouts = [(e, found) for e in w.log_events if (found := tp.collective_timeout(e.text))]
    if not timeouts:
        return []
    if fault_events(w):
        return []  # a GPU/driver fault explains the hang: hardware_fault owns it
    first, (op, timeout_ms) = timeouts[0]
    world = w.meta.world_size or w.world
    timed_out = {e.rank for e, _ in timeouts if e.rank is not None}
    missing = sorted(set(range(world)) - timed_out) if world and timed_out else []
    culprit = missing[0] if len(missing) == 1 else None
    rank_info = next((r for r in w.ranks if r.rank == culprit), None)
    a, b = first.ts - timeout_ms / 1000.0, timeouts[-1][0].ts
    before = w.steps.step[(w.steps.ts <= first.ts) & np.isfinite(w.steps.step)]
    last_step = int(before.max()) if len(before) else None
    who = f"rank {culprit}" if culprit is not None else "one rank"
    f = new_finding(
        "collective_hang",
        JOB,
        f"Collective hang: {who} never arrived",
        (a, b),
        0.75 if culprit is not None else 0.6,
        (
            f"Dump rank {culprit}'s Python stack (py-spy dump --pid {rank_info.pid}) "
            if rank_info is not None and rank_info.pid is not None
            else "Dump the stuck ranks' Python stacks (py-spy dump --pid PID) "
        )
        + "to find where it stopped; check for rank-dependent code paths (data, logging, "
        "checkpoint on rank 0 only, an early exit) before a collective.",
        job=w.job,
        node=rank_info.node if rank_info else None,
        gpu=rank_info.gpu if rank_info else None,
        rank=culprit,
    )
    e1 = f.add(
        "log: collective timeout",
        (first.ts, b),
        len(timeouts),
        None,
        first.text[:200],
        job=w.job,
    )
    cites = [e1]
    if last_step is not None:
        cites.append(
            f.add(
                "log: last step before the hang",
                (a, first.ts),
                last_step,
                None,
                "the last training step printed before the timeout",
                job=w.job,
            )
        )
    ranks_txt = (
        f"rank{'s' if len(timed_out) > 1 else ''} {', '.join(map(str, sorted(timed_out)))}"
        if timed_out
        else "a rank"
    )
    step_txt = f" after step {last_step} [{cites[1]}]" if last_step is not None else ""
    tail = (
        f"; rank {culprit}, the only rank of {world} that did not time out, never arrived"
        if culprit is not None
        else "; the output does not say which rank never arrived"
    )
    f.summary = (
        f"At {hhmmss(first.ts)} {ranks_txt} timed out after {timeout_ms / 1000:.0f} s waiting "
        f"in a {op} operation [{e1}]{step_txt}{tail}."
    )
    f.explanation = (
        "The communication library gave up on a collective after its timeout: every rank "
        "that reached it waited the whole time for one that never came. Proof saw this from "
        "the job's output alone (no GPU kernel view of the ranks on this job)."
    )
    return [f]


def detect_collective_hang(w: JobWindow) -> list[Finding]:
    if w.meta.kind == "inference":
        return []
    if w.world < 2:
        # No ranks with a GPU (a CPU job): only the library's own timeout can show a hang.
        return _hang_from_timeouts(w) if (w.meta.world_size or 0) >= 2 else []
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
        return _hang_from_timeouts(w)
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
    if b_i - a_i < HANG_MIN_BLOCKED_SAMPLES:
        return []
    stuck = blocked[:, a_i:b_i].mean(axis=1)
    row = int(np.argmin(stuck))
    if stuck[row] > 0.5:
        return []
    step_s = step_seconds(w)
    if not np.isfinite(step_s) and len(w.steps) >= 3 and np.isfinite(w.steps.iter_ms).any():
        step_s = float(np.nanmedian(w.steps.iter_ms)) / 1000.0
    if np.isfinite(step_s) and step_s > 0:
        # No progress since the rank that never arrived last launched a kernel.
        own = (
            np.nan_to_num(launches[row], nan=0.0) > 0
            if source == signals.CUDA_LAUNCHES and launches is not None
            else np.nan_to_num(tensor[row], nan=0.0) > 0.02
            if tensor is not None
            else np.zeros(len(w.times), dtype=bool)
        )
        went = np.flatnonzero(own[:a_i])
        silent_from = int(went[-1]) + 1 if len(went) else 0
        if (b_i - silent_from) * w.dt < max(HANG_MIN_S, HANG_MIN_STEPS * step_s):
            return []
    elif (b_i - a_i) * w.dt < HANG_UNKNOWN_STEP_MIN_S:
        return []
    t_a = w.ts_at(a_i)
    for c in w.checkpoints:
        c0 = c.begin if c.begin is not None else c.end
        c1 = c.end
        if c1 is None and c.begin is not None:
            # No end line (some recipes print only the begin): the save ended by the next
            # logged step; with none since, it is still in progress.
            later = w.steps.ts[w.steps.ts > c.begin] if len(w.steps) else np.array([])
            c1 = float(later[0]) if len(later) else w.t1
        if c0 is not None and c1 is not None and c0 <= w.ts_at(b_i - 1) and c1 >= t_a - w.dt:
            return []  # a save in progress holds the ranks; checkpoint_stall judges it
    r = w.ranks[row]
    if any(e.gpu == r.gpu or (not e.gpu and e.node == r.node) for e in fault_events(w)):
        return []
    a, b = w.ts_at(a_i), w.ts_at(b_i - 1)
    f = new_finding(
        "collective_hang",
        JOB,
        f"Collective hang: rank {r.rank} never arrived",
        (a, b),
        0.85,
        f"Dump rank {r.rank}'s Python stack (py-spy dump --pid {r.pid}) to find where it is "
        "stuck; check for rank-dependent code paths (data, logging, checkpoint on rank 0 "
        "only) before a collective. Lower the NCCL timeout so hangs fail fast.",
        job=w.job,
        node=r.node,
        gpu=r.gpu,
        rank=r.rank,
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
