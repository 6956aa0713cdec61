"""Training scenarios: a healthy control (several flavours) and one per docs/design.md §6 family.

Every builder randomises from the scenario RNG (world size, step time, onset, log format, which
rank/GPU/node/port is at fault, the cause of a slow rank, …) and records the ground truth in
`meta.truth` = {"family", "category", "subject": {job, node, gpu, rank, mount}, "onset", …}.
Healthy controls carry {"family": None, "category": None, "subject": None, "onset": None}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import signals
from contract.verdicts import subject
from simulator.fleet import Fleet, make_fleet
from simulator.logs import xid_line
from simulator.run import SimRun
from simulator.scenarios import Builder, ScenarioContext, register
from simulator.training import JobPlan, JobResult, draw_plan, simulate_job

HEALTHY_TRUTH: dict[str, Any] = {"family": None, "category": None, "subject": None, "onset": None}


def _training(*, family: str | None) -> Callable[[Builder], Builder]:
    """Register a training scenario under its builder's name; its docstring is the one-line
    description `proof simulate --list` prints (wrapped here, joined back to one line)."""

    def deco(builder: Builder) -> Builder:
        description = " ".join((builder.__doc__ or "").split())
        add = register(builder.__name__, kind="training", family=family, description=description)
        return add(builder)

    return deco


def _truth(
    family: str, category: str, subject: dict[str, Any], onset: float, **detail: Any
) -> dict[str, Any]:
    t: dict[str, Any] = {
        "family": family,
        "category": category,
        "subject": subject,
        "onset": round(float(onset), 3),
    }
    if detail:
        t["detail"] = detail
    return t


class _Setup:
    def __init__(
        self,
        ctx: ScenarioContext,
        *,
        min_nodes: int = 1,
        copies: int = 1,
        max_nodes: int = 8,
        neighbor_ok: bool = True,
    ) -> None:
        rng = ctx.rng
        self.ctx = ctx
        self.rng = rng
        gpn = ctx.gpus_per_node or 8
        # World sizes 8–64 with 8 GPUs per node unless the caller fixed the node count.
        nodes = ctx.nodes if ctx.nodes is not None else int(rng.choice([1, 1, 2, 2, 3, 4, 4, 6, 8]))
        nodes = min(max(nodes, min_nodes), max(max_nodes, min_nodes, ctx.nodes or 0))
        self.job_nodes = nodes
        # Sometimes another, healthy job shares the fleet: detectors must keep jobs apart.
        self.neighbor_nodes = 1 if neighbor_ok and rng.random() < 0.3 else 0
        self.fleet: Fleet = make_fleet(
            rng,
            seed=ctx.seed,
            # copies > 1: room for a rerun on other nodes
            n_nodes=nodes * copies + self.neighbor_nodes,
            gpus_per_node=gpn,
            n_samples=ctx.n_samples,
            start_ts=ctx.start_ts,
            interval_s=ctx.interval_s,
        )
        self.run = SimRun(
            {
                "source": "proof-sim",
                "seed": ctx.seed,
                "duration_s": ctx.duration_s,
                "interval_s": ctx.interval_s,
                "start_ts": ctx.start_ts,
                "nodes": [n.hostname for n in self.fleet.nodes],
                "gpu_model": self.fleet.spec.name,
            },
            start_ts=ctx.start_ts,
            n_samples=ctx.n_samples,
            interval_s=ctx.interval_s,
        )
        self._preexisting_counters()

    @property
    def duration(self) -> float:
        return self.ctx.duration_s

    def at(self, frac: float) -> float:
        return self.ctx.start_ts + frac * self.ctx.duration_s

    def _preexisting_counters(self) -> None:
        """Old, flat counter values a healthy fleet carries (a detector must use deltas)."""
        rng, f = self.rng, self.fleet
        for g in range(f.n_gpus):
            if rng.random() < 0.3:
                f.faults.set_preexisting(
                    signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, g, int(rng.integers(1, 40))
                )
            if rng.random() < 0.06:
                f.faults.set_preexisting(
                    signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, g, int(rng.integers(1, 5))
                )
            if rng.random() < 0.5:
                f.faults.set_preexisting(
                    signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER, g, int(rng.integers(0, 150))
                )
            if rng.random() < 0.2:
                f.faults.set_preexisting(
                    signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                    g,
                    int(rng.integers(1, 60)),
                )
        if rng.random() < 0.2:  # a lone replay now and then is normal
            f.faults.bump(
                signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
                int(rng.integers(f.n_gpus)),
                int(rng.integers(f.n_samples)),
            )

    def plan(
        self,
        *,
        node_ids: list[int] | None = None,
        start_frac: float | None = None,
        prestart_ok: bool = True,
        **kw: Any,
    ) -> JobPlan:
        """A random job. Unless told when it starts, 30% of jobs were already running when the
        recording began (resumed from a checkpoint; the agent first sees them at the start)."""
        prestart = start_frac is None and prestart_ok and self.rng.random() < 0.3
        if start_frac is not None:
            start = self.at(start_frac)
        elif prestart:
            start = self.ctx.start_ts - float(self.rng.uniform(60, 1800))
        else:
            start = self.at(float(self.rng.uniform(0.003, 0.04)))
        plan = draw_plan(
            self.rng,
            self.fleet,
            node_ids=node_ids if node_ids is not None else list(range(self.job_nodes)),
            start_t=start,
            **kw,
        )
        if prestart:
            plan.first_step = int(self.rng.integers(10, 400)) * 100
            plan.loss_start = float(self.rng.uniform(2.6, 4.0))
        return plan

    def first_step_after(self, res: JobResult, t: float) -> float:
        """Start of the first step at or after `t` that the recording saw."""
        return _first_step_after(res, max(t, self.ctx.start_ts))

    def simulate(self, plan: JobPlan, pid_base: int = 0, role: str = "primary") -> JobResult:
        """Run `plan`; `meta.jobs` records each job's role: the job the scenario is about
        ("primary"), a "rerun" of it, or an unrelated healthy "neighbor"."""
        self.run.meta.setdefault("jobs", {})[plan.job_id] = role
        base = pid_base or int(self.rng.integers(20000, 3_000_000))
        return simulate_job(plan, self.fleet, self.run, self.rng, pid_base=base)

    def finish(self, truth: dict[str, Any]) -> SimRun:
        if self.neighbor_nodes:
            first = len(self.fleet.nodes) - self.neighbor_nodes
            neighbor = self.plan(node_ids=list(range(first, len(self.fleet.nodes))))
            self.simulate(neighbor, role="neighbor")
        self.fleet.emit(self.run, self.rng)
        n = self.run.n_samples
        if n > 60 and self.rng.random() < 0.25:
            # The recording agent stalled once or twice (a busy node, a slow spool flush):
            # a few seconds with no samples at all.
            for _ in range(int(self.rng.integers(1, 3))):
                at = int(self.rng.integers(10, n - 10))
                self.run.stalled.update(range(at, min(n, at + int(self.rng.integers(2, 9)))))
        self.run.meta["truth"] = truth
        return self.run

    def event(
        self,
        name: str,
        ts: float,
        *,
        gpu_global: int | None = None,
        node: int | None = None,
        **extra: Any,
    ) -> None:
        rec: dict[str, Any] = {"type": "event", "ts": float(ts), "name": name}
        if gpu_global is not None:
            ni, li = divmod(gpu_global, self.fleet.gpus_per_node)
            rec.update(
                node=self.fleet.nodes[ni].hostname,
                gpu=self.fleet.nodes[ni].gpu_uuids[li],
                gpu_index=li,
            )
        elif node is not None:
            rec["node"] = self.fleet.nodes[node].hostname
        rec.update(extra)
        self.run.add(rec)


def _first_step_after(res: JobResult, t: float) -> float:
    ends = res.ckpt_end[np.isfinite(res.ckpt_end)]
    starts = res.step_start[: len(ends)]
    after = starts[starts >= t]
    return float(after[0]) if len(after) else t


def _rank_subject(res: JobResult, rank: int) -> dict[str, Any]:
    """The subject of a fault on one rank: its job, node, GPU and rank."""
    rk = res.ranks[rank]
    return subject(job=res.plan.job_id, node=rk["node"], gpu=rk["gpu"], rank=rank)


# --- healthy controls -------------------------------------------------------------------------


@_training(family=None)
def healthy_training(ctx: ScenarioContext) -> SimRun:
    """healthy multi-node training job (random framework/log format); may complete with exit 0 —
    learns normally; a good detector reports nothing"""
    s = _Setup(ctx)
    if s.rng.random() < 0.4:
        # A fine-tune that runs to completion inside the window (exit 0, loss clearly drops).
        plan = s.plan(prestart_ok=False)
        plan.as_finetune(s.rng)
        end = s.at(float(s.rng.uniform(0.6, 0.9)))
        steps = (end - plan.start_t - plan.init_s) / plan.step_time_s
        plan.complete_after(max(5, int(steps * 0.85)), epochs=float(s.rng.choice([1, 2, 3])))
    else:
        plan = s.plan()
    s.simulate(plan)
    return s.finish(dict(HEALTHY_TRUTH))


@_training(family=None)
def healthy_local_checkpoint(ctx: ScenarioContext) -> SimRun:
    """healthy job checkpointing to fast local NVMe: short pauses aligned with save lines, storage
    fast (twin of checkpoint_stall)"""
    s = _Setup(ctx)
    plan = s.plan(ckpt_mount=None)
    plan.ckpt_mount = s.fleet.local
    n_steps = ctx.duration_s / plan.step_time_s
    plan.ckpt_every = int(max(5, n_steps / s.rng.uniform(3.5, 6.0)))
    s.simulate(plan)
    return s.finish(dict(HEALTHY_TRUTH))


@_training(family=None)
def healthy_preexisting_counter(ctx: ScenarioContext) -> SimRun:
    """healthy job on a GPU with an old, flat row-remap/SBE count (twin of gpu_degrading: a flat
    counter is not evidence)"""
    s = _Setup(ctx)
    plan = s.plan()
    g = s.fleet.gpu(int(s.rng.integers(s.job_nodes)), int(s.rng.integers(s.fleet.gpus_per_node)))
    s.fleet.faults.set_preexisting(
        signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, g, int(s.rng.integers(2, 9))
    )
    s.fleet.faults.set_preexisting(
        signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, g, int(s.rng.integers(50, 4000))
    )
    s.fleet.faults.set_preexisting(
        signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, g, int(s.rng.integers(100, 3000))
    )
    s.simulate(plan)
    return s.finish(dict(HEALTHY_TRUTH))


# --- job-side families ------------------------------------------------------------------------


@_training(family="sequence_imbalance")
def sequence_imbalance(ctx: ScenarioContext) -> SimRun:
    """rotating straggler: variable-length sequences, the slowest rank changes every step (twin of
    slow_rank)"""
    s = _Setup(ctx, min_nodes=2 if (ctx.nodes or 2) >= 2 else 1)
    plan = s.plan()
    plan.imbalance_seqs = int(s.rng.choice([2, 3, 4, 6]))
    if s.rng.random() < 0.35:  # a data-mix change part-way through
        plan.imbalance_from = s.at(float(s.rng.uniform(0.2, 0.5)))
    res = s.simulate(plan)
    onset = s.first_step_after(
        res, plan.imbalance_from if np.isfinite(plan.imbalance_from) else plan.start_t
    )
    return s.finish(_truth("sequence_imbalance", "job", subject(job=plan.job_id), onset))


@_training(family="input_starvation")
def input_starvation(ctx: ScenarioContext) -> SimRun:
    """data pipeline too slow: GPUs idle between steps while the input workers' CPU is saturated"""
    s = _Setup(ctx)
    plan = s.plan()
    plan.n_workers = int(s.rng.choice([1, 2, 4]))
    onset_t = plan.start_t if s.rng.random() < 0.4 else s.at(float(s.rng.uniform(0.2, 0.5)))
    plan.starve = (onset_t, float(s.rng.uniform(1.6, 4.0)) / plan.data_frac)
    res = s.simulate(plan)
    return s.finish(
        _truth(
            "input_starvation", "job", subject(job=plan.job_id), s.first_step_after(res, onset_t)
        )
    )


@_training(family="no_learning")
def no_learning(ctx: ScenarioContext) -> SimRun:
    """run completes with exit 0 but learned nothing: loss flat, or learning rate / grad norm zero
    throughout (twin: healthy_training)"""
    s = _Setup(ctx)
    mode = str(s.rng.choice(["flat", "zero_lr", "zero_grad"]))
    fw = str(s.rng.choice(["megatron", "hf_trainer"])) if mode != "flat" else None
    plan = s.plan(framework=fw, prestart_ok=False)
    plan.as_finetune(s.rng)
    plan.no_learning = mode
    if s.rng.random() < 0.5:  # from scratch: stuck at the uniform-prediction loss ln(vocab)
        plan.loss_start = float(np.log(s.rng.choice([32000, 50257, 128256])))
    end = s.at(float(s.rng.uniform(0.6, 0.9)))
    window = (end - plan.start_t - plan.init_s) / plan.step_time_s
    plan.complete_after(max(12, int(window * 0.85)), epochs=float(s.rng.choice([1, 2, 3])))
    res = s.simulate(plan)
    return s.finish(
        _truth(
            "no_learning",
            "job",
            subject(job=plan.job_id),
            s.first_step_after(res, plan.start_t),
            mode=mode,
        )
    )


@_training(family="numerical_divergence")
def numerical_divergence(ctx: ScenarioContext) -> SimRun:
    """loss drifts then explodes/NaN on clean hardware (an old flat row-remap on one GPU); a rerun
    on other nodes diverges at the same step"""
    s = _Setup(ctx, max_nodes=4, copies=2)
    nodes = s.job_nodes
    step = float(
        np.exp(s.rng.uniform(np.log(0.3), np.log(max(0.31, min(5.0, ctx.duration_s * 0.3 / 40)))))
    )
    plan = s.plan(node_ids=list(range(nodes)), step_time_s=step, prestart_ok=False)
    plan.precision = "fp8"
    plan.ckpt_every = 10**9
    span = int(max(20, (ctx.duration_s * 0.3 - plan.init_s) / step))
    k_x = plan.first_step + span
    k_d = k_x - int(max(8, span * s.rng.uniform(0.2, 0.45)))
    plan.divergence = (k_d, k_x)
    # Steps run at their nominal time here (no checkpoints, clean hardware): the user cancels
    # the run a minute or two after the loss exploded.
    plan.cancel_at = plan.start_t + plan.init_s + span * step * 1.01 + float(s.rng.uniform(40, 120))
    # Clean hardware, except an old row remap that stays flat: pre-existing, not the cause.
    g_old = s.fleet.gpu(int(s.rng.integers(nodes)), int(s.rng.integers(s.fleet.gpus_per_node)))
    s.fleet.faults.set_preexisting(
        signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, g_old, int(s.rng.integers(1, 4))
    )
    res = s.simulate(plan)
    onset = float(res.step_start[min(k_d - plan.first_step - 1, len(res.step_start) - 1)])
    rerun = s.plan(
        node_ids=list(range(nodes, 2 * nodes)),
        step_time_s=plan.step_time_s,
        framework=plan.framework,
        prestart_ok=False,
    )
    rerun.start_t = plan.cancel_at + float(s.rng.uniform(20, 90))
    for attr in (
        "first_step",
        "divergence",
        "precision",
        "loss_start",
        "loss_floor",
        "loss_k0",
        "loss_alpha",
        "lr_peak",
        "warmup",
        "model",
        "params_b",
        "name",
        "ckpt_every",
        "total_steps",
        "global_batch",
        "seq_len",
        "tokens_per_step",
    ):
        setattr(rerun, attr, getattr(plan, attr))
    rerun.rerun_of = plan.job_id
    s.simulate(rerun, role="rerun")
    return s.finish(
        _truth(
            "numerical_divergence",
            "job",
            subject(job=plan.job_id),
            onset,
            rerun=rerun.job_id,
            diverge_step=k_x,
        )
    )


@_training(family="collective_hang")
def collective_hang(ctx: ScenarioContext) -> SimRun:
    """one rank stops launching (stuck in its own code); all others block in the all-reduce until
    the NCCL watchdog kills the job"""
    s = _Setup(ctx)
    plan = s.plan()
    plan.nccl_timeout_s = float(s.rng.choice([300.0, 600.0, 600.0, 1800.0]))
    r = int(s.rng.integers(plan.world_size))
    t_h = s.at(float(s.rng.uniform(0.2, 0.55)))
    plan.hang = (r, t_h)
    res = s.simulate(plan)
    onset = float(res.step_start[res.hang_step]) if res.hang_step is not None else t_h
    return s.finish(_truth("collective_hang", "job", _rank_subject(res, r), onset))


# --- infrastructure families ------------------------------------------------------------------


@_training(family="slow_rank")
def slow_rank(ctx: ScenarioContext) -> SimRun:
    """persistent straggler: the same rank is slowest every step; cause: clock throttle, power cap,
    PCIe downgrade+replays or NVLink errors"""
    s = _Setup(ctx)
    plan = s.plan()
    r = int(s.rng.integers(plan.world_size))
    node_id = plan.node_ids[r // plan.gpus_per_node]
    g = s.fleet.gpu(node_id, r % plan.gpus_per_node)
    t0 = s.at(float(s.rng.uniform(0.15, 0.5)))
    i0 = s.fleet.index_at(t0)
    cause = str(s.rng.choice(["clock_throttle", "power_cap", "pcie", "nvlink"]))
    f = s.fleet.faults
    if cause == "clock_throttle":
        bits = int(
            s.rng.choice(
                [
                    signals.THROTTLE_HW_SLOWDOWN,
                    signals.THROTTLE_HW_THERMAL,
                    signals.THROTTLE_HW_POWER_BRAKE,
                ]
            )
        )
        max_mhz = s.fleet.spec.sm_clock_max_mhz
        f.throttle(g, i0, None, bits=bits, clock_mhz=max_mhz * float(s.rng.uniform(0.5, 0.75)))
        if bits == signals.THROTTLE_HW_THERMAL:
            f.thermal(g, i0, None, float(s.rng.uniform(14, 22)))
        s.event(signals.EVENT_THROTTLE, t0, gpu_global=g, value=bits)
    elif cause == "power_cap":
        # A cap well under what this job's compute draws (a mis-set or inherited limit).
        lvl = plan.compute_level
        demand = 0.08 * lvl[0] + 0.25 * lvl[1] + 0.85 * lvl[3] + 0.2 * lvl[4]
        spec = s.fleet.spec
        draw = spec.idle_w + spec.context_w + (spec.tdp_w - spec.idle_w) * demand
        cap = max(spec.min_power_limit_w, min(draw, spec.tdp_w) * float(s.rng.uniform(0.5, 0.7)))
        f.power_cap(g, i0, None, cap)
    elif cause == "pcie":
        gen, width = (
            (int(s.rng.choice([3, 4])), int(s.rng.choice([8, 16])))
            if s.rng.random() < 0.5
            else (int(s.rng.choice([3, 4, 5])), int(s.rng.choice([4, 8])))
        )
        f.pcie_downgrade(
            g, i0, None, gen=gen, width=width, replays_per_s=float(s.rng.uniform(0.5, 20))
        )
        ratio = s.fleet.spec.pcie_bandwidth_ratio(np.array([gen]), np.array([width]))[0]
        plan.pcie_rank = (r, t0, float(max(ratio, 0.05)) * 0.25)
    else:
        f.rate(
            signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            g,
            i0,
            None,
            float(s.rng.uniform(3, 80)),
        )
        plan.slow_eff[r] = (t0, float(s.rng.uniform(0.7, 0.85)))
    res = s.simulate(plan)
    onset = s.first_step_after(res, t0)
    return s.finish(
        _truth(
            "slow_rank",
            "infrastructure",
            _rank_subject(res, r),
            onset,
            cause=cause,
        )
    )


@_training(family="checkpoint_stall")
def checkpoint_stall(ctx: ScenarioContext) -> SimRun:
    """checkpoints to the shared NFS mount stall for minutes: all ranks stop launching at every
    save, NFS write throughput collapses, latency soars, no errors (twin: healthy_local_checkpoint)
    """
    s = _Setup(ctx)
    step = float(np.exp(s.rng.uniform(np.log(0.3), np.log(5.0))))
    plan = s.plan(step_time_s=step)
    plan.ckpt_mount = s.fleet.shared
    onset_t = s.at(float(s.rng.uniform(0.0, 0.3)))
    bw = float(s.rng.uniform(25e6, 150e6))
    plan.ckpt_write_bw = (onset_t, bw)
    plan.ckpt_latency_ms = (onset_t, float(s.rng.uniform(250, 3000)))
    usable = ctx.duration_s * 0.9 - plan.init_s
    saves = int(s.rng.integers(2, 5))
    # A save takes 30 s – 4 min once the storage is slow, at most ~40% of the save interval.
    target = min(float(s.rng.uniform(30, 240)), usable / saves * 0.4)
    plan.ckpt_bytes *= target / (plan.ckpt_bytes / len(plan.node_ids) / bw)
    plan.ckpt_every = int(max(3, (usable / saves - target) / step))
    res = s.simulate(plan)
    # Onset: the first save that began once the mount was slow.
    ckpt_starts = res.coll_end[(res.ckpt_end - res.coll_end) > 1.0]
    slow = ckpt_starts[ckpt_starts >= onset_t]
    onset = float(slow[0]) if len(slow) else onset_t
    return s.finish(
        _truth(
            "checkpoint_stall",
            "infrastructure",
            subject(job=plan.job_id, mount=s.fleet.shared.path),
            onset,
        )
    )


@_training(family="hardware_fault")
def hardware_fault(ctx: ScenarioContext) -> SimRun:
    """XID/ECC event on one of the job's GPUs, then the loss goes NaN/explodes (silent corruption)
    or the rank crashes and the job dies (twin of numerical_divergence)"""
    s = _Setup(ctx)
    plan = s.plan()
    r = int(s.rng.integers(plan.world_size))
    node_id = plan.node_ids[r // plan.gpus_per_node]
    li = r % plan.gpus_per_node
    g = s.fleet.gpu(node_id, li)
    t_e = s.at(float(s.rng.uniform(0.25, 0.6)))
    i_e = s.fleet.index_at(t_e)
    variant = str(s.rng.choice(["corruption", "crash"]))
    f = s.fleet.faults
    if variant == "corruption":
        # Fault XIDs only (engine/detectors/xids.py): 63 (remap recorded) and 92 (high
        # single-bit rate) are warnings that leave the job running — see xid92_warning.
        code = int(s.rng.choice([94, 48]))
        plan.corruption_t = t_e
    else:
        code = int(s.rng.choice([79, 48, 95, 119]))
        msg = {
            79: "unspecified launch failure",
            48: "uncorrectable ECC error encountered",
            95: "uncorrectable ECC error encountered",
            119: "unspecified launch failure",
        }[code]
        plan.crash = (r, t_e + 0.3, msg)
    if code in (48, 94, 95):
        f.bump(signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, g, i_e)
        f.bump(signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, g, i_e + 1)
    if code == 79:
        f.lose(g, i_e + 1)
    res = s.simulate(plan)
    pid = res.ranks[r]["pid"]
    s.event(
        signals.EVENT_XID,
        t_e,
        gpu_global=g,
        value=code,
        text=xid_line(code, li, pid if code not in (63, 79) else None),
    )
    if code in (48, 94, 95):
        s.event(signals.EVENT_ECC_DBE, t_e + 0.001, gpu_global=g, value=1)
        # The driver records the row remap for the bad row right after (NVIDIA: "If Xid 48 is
        # followed by Xid 63 or 64 …"): a warning XID next to the fault changes nothing.
        s.event(signals.EVENT_XID, t_e + 0.2, gpu_global=g, value=63, text=xid_line(63, li, None))
    if code == 79:
        s.event(signals.EVENT_GPU_LOST, t_e + 0.5, gpu_global=g)
    return s.finish(
        _truth(
            "hardware_fault",
            "infrastructure",
            _rank_subject(res, r),
            t_e,
            xid=code,
            variant=variant,
        )
    )


@_training(family="fabric_degraded")
def fabric_degraded(ctx: ScenarioContext) -> SimRun:
    """InfiniBand symbol/link errors rising on one node's port (sometimes a link flap) while the
    job's all-reduces slow down"""
    s = _Setup(ctx, min_nodes=2)
    plan = s.plan()
    plan.comm_frac = float(s.rng.uniform(0.08, 0.16))
    t0 = s.at(float(s.rng.uniform(0.15, 0.5)))
    i0 = s.fleet.index_at(t0)
    plan.fabric = (t0, float(s.rng.uniform(1.8, 4.0)))
    node_id = int(s.rng.choice(plan.node_ids))
    port = int(s.rng.integers(8))
    n = s.fleet.n_samples
    ramp = np.clip((np.arange(n) - i0) / max(1, n - i0), 0, None) * (np.arange(n) >= i0)
    sym = s.fleet.ib_errors[signals.IB_SYMBOL_ERROR]
    sym[node_id, port] += s.rng.poisson(s.rng.uniform(0.5, 3.0) + 40 * ramp) * (np.arange(n) >= i0)
    s.fleet.ib_errors[signals.IB_PORT_RCV_ERRORS][node_id, port] += s.rng.poisson(
        0.2 + 5 * ramp
    ) * (np.arange(n) >= i0)
    rec = s.fleet.ib_errors[signals.IB_LINK_ERROR_RECOVERY]
    for j in s.rng.choice(
        np.arange(i0, n), size=min(n - i0, int(s.rng.integers(1, 5))), replace=False
    ):
        rec[node_id, port, j] += 1
    dev = s.fleet.nodes[node_id].ib_devices[port]
    if s.rng.random() < 0.5 and n - i0 > 10:
        j = int(s.rng.integers(i0 + 5, n))
        s.fleet.ib_errors[signals.IB_LINK_DOWNED][node_id, port, j] += 1
        s.event(
            signals.EVENT_LINK_DOWN,
            s.fleet.start_ts + j * s.fleet.interval_s + 0.3,
            node=node_id,
            labels={"device": dev, "port": "1"},
        )
    for nid in plan.node_ids:
        s.fleet.ib_wait[nid] += 0  # congestion added from the slower collectives below
    res = s.simulate(plan)
    after = np.arange(n) >= i0
    s.fleet.ib_wait[node_id, port] += after * s.rng.uniform(2e5, 2e6)
    return s.finish(
        _truth(
            "fabric_degraded",
            "infrastructure",
            subject(job=plan.job_id, node=s.fleet.nodes[node_id].hostname),
            s.first_step_after(res, t0),
            device=dev,
            port="1",
        )
    )


@dataclass
class _SbeRise:
    node_id: int
    li: int  # local GPU index on the node
    g: int  # global GPU index
    t0: float  # onset
    i0: int  # onset sample
    profile: np.ndarray  # corrected-error rate per sample


def _sbe_rise(
    s: _Setup, plan: JobPlan, *, onset_max: float, preexisting_max: int, rate: tuple[float, float]
) -> _SbeRise:
    """One GPU of the job whose corrected (single-bit) ECC error rate rises exponentially from
    a random onset, over a flat pre-existing count (the start of a failing GPU)."""
    node_id = int(s.rng.choice(plan.node_ids))
    li = int(s.rng.integers(s.fleet.gpus_per_node))
    g = s.fleet.gpu(node_id, li)
    n = s.fleet.n_samples
    t0 = s.at(float(s.rng.uniform(0.05, onset_max)))
    i0 = s.fleet.index_at(t0)
    f = s.fleet.faults
    f.set_preexisting(
        signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, g, int(s.rng.integers(0, preexisting_max))
    )
    tau = max(30.0, (n - i0) * s.rng.uniform(0.25, 0.5))
    profile = np.where(
        np.arange(n) >= i0, s.rng.uniform(*rate) * np.exp((np.arange(n) - i0) / tau), 0.0
    )
    f.rate_profile(signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, g, np.minimum(profile, 200.0))
    return _SbeRise(node_id, li, g, t0, i0, profile)


def _gpu_degrading_truth(s: _Setup, rise: _SbeRise, **detail: Any) -> SimRun:
    ni = s.fleet.nodes[rise.node_id]
    subj = subject(node=ni.hostname, gpu=ni.gpu_uuids[rise.li])
    return s.finish(_truth("gpu_degrading", "infrastructure", subj, rise.t0, **detail))


@_training(family="gpu_degrading")
def gpu_degrading(ctx: ScenarioContext) -> SimRun:
    """one GPU heading for failure while its job still runs: rising SBE rate, growing correctable
    remaps, recurring throttling (twin: healthy_preexisting_counter)"""
    s = _Setup(ctx)
    plan = s.plan()
    rise = _sbe_rise(s, plan, onset_max=0.4, preexisting_max=30, rate=(0.02, 0.1))
    g, i0, profile = rise.g, rise.i0, rise.profile
    n = s.fleet.n_samples
    f = s.fleet.faults
    for j in np.sort(
        s.rng.choice(np.arange(i0, n), size=min(n - i0, int(s.rng.integers(2, 6))), replace=False)
    ):
        f.bump(signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, g, int(j))
    # Recurring throttle episodes of 10–60 s.
    bits = int(s.rng.choice([signals.THROTTLE_HW_SLOWDOWN, signals.THROTTLE_SW_THERMAL]))
    j = i0 + int(s.rng.integers(5, 60))
    while j < n:
        length = int(s.rng.integers(10, 60))
        max_mhz = s.fleet.spec.sm_clock_max_mhz
        f.throttle(g, j, j + length, bits=bits, clock_mhz=max_mhz * float(s.rng.uniform(0.55, 0.8)))
        if bits == signals.THROTTLE_SW_THERMAL:
            f.thermal(g, j, j + length, float(s.rng.uniform(12, 20)))
        s.event(
            signals.EVENT_THROTTLE,
            s.fleet.start_ts + j * s.fleet.interval_s + 0.5,
            gpu_global=g,
            value=bits,
        )
        j += length + int(s.rng.integers(90, 400))
    if s.rng.random() < 0.5:
        f.rate_profile(
            signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            g,
            np.minimum(profile * 0.5, 50.0),
        )
    s.simulate(plan)
    return _gpu_degrading_truth(s, rise)


@_training(family="gpu_degrading")
def xid92_warning(ctx: ScenarioContext) -> SimRun:
    """a healthy job on a GPU whose corrected (single-bit) ECC errors accelerate, with XID 92 (high
    single-bit ECC error rate) warnings: fleet health, not a hardware_fault on the job (twin of
    hardware_fault)"""
    s = _Setup(ctx)
    plan = s.plan()
    rise = _sbe_rise(s, plan, onset_max=0.35, preexisting_max=60, rate=(0.05, 0.3))
    g, li, i0 = rise.g, rise.li, rise.i0
    n = s.fleet.n_samples
    res = s.simulate(plan)
    # The driver warns once the corrected-error rate crosses its threshold, again while it
    # stays high: 1–4 XID 92s in the second half of the rise.
    first = i0 + (n - i0) // 2
    k = min(max(1, n - first), int(s.rng.integers(1, 5)))
    pid = int(res.ranks[0]["pid"])
    for j in np.sort(s.rng.choice(np.arange(first, n), size=k, replace=False)):
        rank = next((rk for rk in res.ranks if rk["gpu_global"] == g), None)
        s.event(
            signals.EVENT_XID,
            s.fleet.start_ts + int(j) * s.fleet.interval_s + 0.4,
            gpu_global=g,
            value=92,
            text=xid_line(92, li, int(rank["pid"]) if rank else pid),
        )
    return _gpu_degrading_truth(s, rise, xid=92)
