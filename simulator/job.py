"""A training job's plan (everything random about it, and the fault knobs) and its result
(the per-rank step timeline), shared by the timeline, signal and record modules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.fleet import Fleet, Mount
from simulator.logs import FRAMEWORKS

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


# Healthy per-rank per-step compute jitter drawn per job (relative sd): docs/detectors.md
# "Materiality" — real all-reduce jobs show a few percent step to step.
COMPUTE_JITTER_MIN = 0.015
COMPUTE_JITTER_MAX = 0.04


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
    # Per-rank per-step compute jitter (relative sd of one rank's compute time from one step
    # to the next on healthy hardware with balanced work). draw_plan draws 1.5–4%: a "few
    # percent", see docs/detectors.md "Materiality".
    compute_jitter: float = 0.008
    # Persistent per-rank speed offset (sd): GPU-to-GPU variation of sustained clocks.
    rank_offset_sd: float = 0.012
    samples_per_epoch: float = 5e6
    rerun_of: str | None = None
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
    tokens = mfu * fleet.spec.bf16_flops * world * step / (6 * params_b * 1e9)
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
    plan = JobPlan(
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
        fb_used_mib=float(rng.uniform(0.52, 0.94) * fleet.spec.fb_usable_mib),
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
    plan.compute_jitter = float(rng.uniform(COMPUTE_JITTER_MIN, COMPUTE_JITTER_MAX))
    return plan


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


def _worker_spawn_t(plan: JobPlan) -> float:
    return plan.start_t + plan.init_s * 0.8


def _stop_time(plan: JobPlan) -> float:
    """When the hung or crashed rank stopped launching."""
    if plan.hang is not None:
        return plan.hang[1]
    if plan.crash is not None:
        return plan.crash[1]
    raise ValueError("job has neither a hang nor a crash")


def _sample_span(fleet: Fleet, t0: float, t1: float) -> tuple[int, int]:
    i0 = int(np.clip(np.ceil((t0 - fleet.start_ts) / fleet.interval_s), 0, fleet.n_samples))
    i1 = (
        int(np.clip(np.ceil((t1 - fleet.start_ts) / fleet.interval_s), 0, fleet.n_samples))
        if np.isfinite(t1)
        else fleet.n_samples
    )
    return i0, max(i0, i1)
