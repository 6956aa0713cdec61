"""Choosing an inference deployment and its traffic per scenario kind, from the seed.

`plan()` picks the GPU count, a model at its minimal tensor-parallel size, the batch slots,
prefix caching, the vLLM version and a traffic shape, then calibrates the arrival rate so the
batch holds the intended number of running requests (Little's law with the engine's own step
time model). Scenario kinds: "healthy", "underfilled", "saturated".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator import hardware
from simulator.inference_engine import (
    H100_SXM as H100_PERF,
)
from simulator.inference_engine import (
    MODELS,
    EngineConfig,
    GpuPerf,
    ModelSpec,
    StepModel,
    Workload,
    simulate_engine,
)
from simulator.scenarios import ScenarioContext

SLOT_CHOICES = (16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
VLLM_NEW = "0.10.1.1"  # V1 engine, `vllm:kv_cache_usage_perc`, "(APIServer pid=N)" log prefix
VLLM_OLD = "0.8.5.post1"  # V1 engine before the rename: `vllm:gpu_cache_usage_perc`
LLAMA_405B_FP8 = ModelSpec("meta-llama/Llama-3.1-405B-Instruct-FP8", 405e9, 126, 16384, 8, 128, 1)
ALL_MODELS = (*MODELS, LLAMA_405B_FP8)


@dataclass(frozen=True)
class Deployment:
    """What a scenario decided: where the endpoint runs and how it is configured."""

    cfg: EngineConfig
    replicas: int
    n_nodes: int
    gpus_per_node: int
    server_gpus: list[list[tuple[int, int]]]  # per server: (node index, gpu index) of each rank
    job: str
    scheduler: str
    vllm_version: str
    launch_s: int  # sample index the server process starts
    ready_s: int  # sample index it starts serving
    weights_on_shared_mount: bool  # where the server reads the checkpoint from at start
    sla_ttft_p95_s: float = 0.0  # set once the run's latencies are known (see inference.py)
    sla_e2e_p95_s: float = 0.0

    @property
    def old_vllm(self) -> bool:
        return self.vllm_version == VLLM_OLD


# --- deployment choice ------------------------------------------------------------------------


# Throughput figures the hardware model does not carry: (FP8 dense peak, HBM bytes/s, NVLink
# bytes/s per direction). The A100 has no FP8 tensor cores: FP8 checkpoints run weight-only
# (the memory saving, not the FLOPs).
_PERF_BY_GPU: dict[str, tuple[float, float, float]] = {
    hardware.H100_SXM.name: (1979e12, 3.35e12, 450e9),
    hardware.H200_SXM.name: (1979e12, 4.8e12, 450e9),
    hardware.A100_SXM.name: (312e12, 2.039e12, 300e9),
}


def gpu_perf(spec: hardware.GpuSpec) -> GpuPerf:
    """The engine's view of the fleet's GPU model (memory from the spec NVML reports)."""
    fp8, hbm, nvlink = _PERF_BY_GPU.get(
        spec.name,
        (
            spec.bf16_flops / H100_PERF.bf16_flops * H100_PERF.fp8_flops,
            H100_PERF.hbm_bytes_per_s,
            H100_PERF.nvlink_bytes_per_s,
        ),
    )
    return GpuPerf(spec.name, spec.fb_total_mib * 2**20, spec.bf16_flops, fp8, hbm, nvlink)


def min_tp(model: ModelSpec, gpu: GpuPerf) -> int:
    """The smallest tensor-parallel size that holds the weights with room for a KV cache."""
    for tp in (1, 2, 4, 8):
        if EngineConfig(model, gpu, tp, 64, 8192, True).fits():
            return tp
    return 16


def _endpoint_gpus(ctx: ScenarioContext, rng: np.random.Generator) -> tuple[int, int, int]:
    """(nodes, gpus per node, GPUs the endpoint uses)."""
    gpn = ctx.gpus_per_node or 8
    if ctx.nodes is not None:
        return ctx.nodes, gpn, ctx.nodes * gpn
    total = min(gpn, int(rng.choice([1, 2, 2, 4, 4, 6, 8, 8, 8])))
    return 1, gpn, total


def _choose_model_tp(
    rng: np.random.Generator, gpu: GpuPerf, gpus: int, gpn: int
) -> tuple[ModelSpec, int]:
    """A model deployed at its minimal TP (as operators do), the TP dividing the GPU count."""
    options = []
    for m in ALL_MODELS:
        tp = min_tp(m, gpu)
        if tp <= min(gpus, gpn) and gpus % tp == 0 and gpn % tp == 0:
            options.append((m, tp))
    if not options:
        options = [(ALL_MODELS[0], 1)]
    m, tp = options[int(rng.integers(len(options)))]
    return m, tp


def _nice_slots(x: float) -> int:
    return min(SLOT_CHOICES, key=lambda s: abs(math.log(s / max(x, 1e-9))))


def _ctx_stats(w: Workload, rng: np.random.Generator, caching: bool) -> tuple[float, float, float]:
    """(mean output, size-biased mean KV tokens a running request holds privately, size-biased
    mean context a decode step reads for it). Long requests stay longer in the batch, so the
    running mix is weighted by output length."""
    n = 4000
    unique = w.prompt_median * np.exp(rng.normal(0, w.prompt_sigma, n))
    idx = rng.choice(len(w.prefix_len), n, p=np.asarray(w.prefix_weights) / sum(w.prefix_weights))
    prefix = np.asarray(w.prefix_len)[idx]
    prompt = np.minimum(unique + prefix, w.max_model_len)
    out = np.clip(w.output_median * np.exp(rng.normal(0, w.output_sigma, n)), 1, w.output_max)
    held = prompt - (prefix if caching else 0) + out / 2
    read = prompt + out / 2
    return (
        float(out.mean()),
        float((held * out).sum() / out.sum()),
        float((read * out).sum() / out.sum()),
    )


def _prefill_work(step: StepModel, w: Workload, rng: np.random.Generator, caching: bool) -> float:
    n = 4000
    unique = w.prompt_median * np.exp(rng.normal(0, w.prompt_sigma, n))
    idx = rng.choice(len(w.prefix_len), n, p=np.asarray(w.prefix_weights) / sum(w.prefix_weights))
    prefix = np.asarray(w.prefix_len)[idx]
    prompt = np.minimum(unique + prefix, w.max_model_len)
    cached = prefix * 0.95 if caching else np.zeros(n)
    return float(step.prefill_work_s(prompt, cached).mean())


def _rate_for_running(
    cfg: EngineConfig, w: Workload, running: float, rng: np.random.Generator
) -> float:
    """Arrival rate (req/s per server) that keeps `running` requests in the batch: Little's law
    with the decode step time at that batch, prefill work taking its share of engine time
    (see docs/simulator.md)."""
    step = StepModel.of(cfg)
    out, _, read = _ctx_stats(w, rng, cfg.enable_prefix_caching)
    t_d = step.decode_step_s(running, running * read)
    w_pf = _prefill_work(step, w, rng, cfg.enable_prefix_caching)
    # running = rate * (time in prefill queue + out * t_d / (1 - rate * w_pf)), solved for rate
    # (the extra TICK-sized wait between admission and decoding included)
    t_extra = w_pf + 0.4
    a = t_extra * w_pf
    b = -(out * t_d + running * w_pf + t_extra)
    c = running
    disc = max(b * b - 4 * a * c, 0.0)
    return float((-b - math.sqrt(disc)) / (2 * a)) if a > 0 else running / (out * t_d)


def _probe(
    cfg: EngineConfig, w: Workload, rate: float, rng: np.random.Generator
) -> tuple[float, float]:
    """(mean running, mean waiting) of one server at a constant `rate` (no cycle, no bursts)."""
    flat = Workload(
        **{
            **w.__dict__,
            "rate_peak": rate,
            "trough_ratio": 1.0,
            "burst_mult": 1.0,
            "period_s": 1e9,
        }
    )
    es = simulate_engine(cfg, [flat], 150, rng)
    return float(es.running[0, 50:].mean()), float(es.waiting[0, 50:].mean())


def _probe_saturated(
    cfg: EngineConfig, w: Workload, rate: float, rng: np.random.Generator
) -> tuple[float, float]:
    """(mean running, mean KV usage) of one overloaded server once its queue has built up."""
    flat = Workload(**{**w.__dict__, "rate_peak": rate, "trough_ratio": 1.0, "period_s": 1e9})
    es = simulate_engine(cfg, [flat], 150, rng)
    return float(es.running[0, 60:].mean()), float(es.kv_usage[0, 60:].mean())


def _healthy_rate(
    cfg: EngineConfig, w: Workload, rng: np.random.Generator, probe_rng: np.random.Generator
) -> float:
    """Peak rate for a busy but healthy endpoint: at the very top of the run (peak x burst) the
    batch is 65-85% full without a queue. Near a full batch the engine is close to its
    throughput limit and the running count climbs steeply with the rate, so the analytic
    estimate (off by up to ~30% there) is refined by short runs of the engine itself."""
    slots = cfg.max_num_seqs
    rate = _rate_for_running(cfg, w, slots * 0.8, rng)  # at peak x burst
    good: float | None = None
    bad: float | None = None
    for _ in range(5):
        running, waiting = _probe(cfg, w, rate, probe_rng)
        if waiting > 0.2 or running > 0.88 * slots:
            bad = rate
            rate = (good + rate) / 2 if good is not None else rate * 0.8
            continue
        good = rate
        if running >= 0.7 * slots:
            break
        step_up = rate * (0.8 * slots / max(running, 0.5)) ** 0.8
        rate = min(step_up, (rate + bad) / 2) if bad is not None else step_up
    # a 150 s probe of heavy-tailed traffic reads a little low: keep some margin
    return 0.95 * (good if good is not None else rate * 0.8) / w.burst_mult


def _workload(
    rng: np.random.Generator,
    kind: str,
    duration: float,
    ready: float,
    max_model_len: int,
) -> Workload:
    """Traffic shape for a scenario kind (rate filled in later)."""
    serve = duration - ready
    common = dict(
        rate_peak=1.0,
        period_s=float(rng.uniform(0.7, 1.3) * max(serve, 60.0)),
        peak_at_s=float(ready + rng.uniform(0.35, 0.65) * serve),
        burst_every_s=float(rng.uniform(120, 400)),
        burst_len_s=float(rng.uniform(8, 30)),
        max_model_len=max_model_len,
    )
    n_prefix = int(rng.integers(1, 5))
    weights = tuple(float(x) for x in rng.dirichlet(np.ones(n_prefix) * 2))
    if kind == "rag":
        return Workload(
            trough_ratio=float(rng.uniform(0.35, 0.6)),
            burst_mult=float(rng.uniform(1.1, 1.4)),
            prompt_median=float(rng.uniform(8000, 15000)),
            prompt_sigma=float(rng.uniform(0.4, 0.6)),
            output_median=float(rng.uniform(15, 50)),
            output_sigma=float(rng.uniform(0.4, 0.6)),
            output_max=int(rng.choice([256, 512, 1024])),
            prefix_len=tuple(int(x) for x in rng.uniform(400, 1600, n_prefix)),
            prefix_weights=weights,
            **common,  # type: ignore[arg-type]
        )
    saturated = kind == "saturated"  # chat and agent traffic with long generations
    return Workload(
        trough_ratio=float(rng.uniform(0.75, 0.9) if saturated else rng.uniform(0.5, 0.7)),
        burst_mult=float(rng.uniform(1.1, 1.3) if saturated else rng.uniform(1.05, 1.2)),
        prompt_median=float(rng.uniform(250, 900)),
        prompt_sigma=float(rng.uniform(0.7, 1.0)),
        output_median=float(rng.uniform(400, 800) if saturated else rng.uniform(200, 500)),
        output_sigma=float(rng.uniform(0.6, 0.85)),
        output_max=int(rng.choice([2048, 4096])),
        prefix_len=tuple(int(x) for x in rng.uniform(100, 800, n_prefix)),
        prefix_weights=weights,
        **common,  # type: ignore[arg-type]
    )


def _scale_lengths(w: Workload, factor: float, *, outputs: bool = True) -> Workload:
    """Longer (or shorter) conversations: prompts (and outputs) scaled alike."""
    changes: dict[str, Any] = {
        "prompt_median": w.prompt_median * factor,
        "prefix_len": tuple(max(16, int(p * factor)) for p in w.prefix_len),
    }
    if outputs:
        changes["output_median"] = max(16.0, w.output_median * factor)
        changes["output_max"] = int(min(8192, max(256, w.output_max * factor)))
    return Workload(**{**w.__dict__, **changes})


def _with_rate(w: Workload, rate: float) -> Workload:
    return Workload(**{**w.__dict__, "rate_peak": rate})


def endpoint_size(ctx: ScenarioContext) -> tuple[int, int, int]:
    """(nodes, GPUs per node, GPUs the endpoint uses): what the caller fixed, else 1–8 GPUs."""
    return _endpoint_gpus(ctx, ctx.rng)


def plan(
    ctx: ScenarioContext, kind: str, spec: hardware.GpuSpec, size: tuple[int, int, int]
) -> tuple[Deployment, Workload]:
    """Randomise a deployment and its traffic for `kind` (healthy / underfilled / saturated)
    on `size` = `endpoint_size(ctx)` GPUs of model `spec` (the fleet's)."""
    rng = ctx.rng
    gpu = gpu_perf(spec)
    n_nodes, gpn, gpus = size
    model, tp = _choose_model_tp(rng, gpu, gpus, gpn)
    duration = ctx.n_samples
    launch = int(rng.uniform(0, 0.05) * duration)
    ready = min(launch + int(rng.uniform(40, 150)), launch + int(0.15 * duration))
    ready = max(ready, launch + 1)
    ready = min(ready, duration - 1)  # at least one second of serving, however short the run
    launch = min(launch, ready)
    caching = kind != "underfilled"
    if kind == "saturated":
        caching = bool(rng.random() < 0.6)
    base = _workload(
        rng, "rag" if kind == "underfilled" else kind, duration, ready, model.max_model_len
    )
    probe = EngineConfig(model, gpu, tp, 64, 8192, caching)
    kv_tokens = probe.kv_tokens

    old = rng.random() < 0.3
    budget = 2048 if old else 8192
    probe_rng = np.random.default_rng(rng.integers(2**32))

    if kind == "underfilled":
        # The traffic keeps the GPUs only partly busy (prefill takes 25-45% of the time: the
        # same SLA would hold on far fewer GPUs); the operator configured several times more
        # batch slots than ever fill. Long prompts, short answers, no prefix caching.
        w = base
        step = StepModel.of(EngineConfig(model, gpu, tp, 64, budget, caching))
        for _ in range(6):
            out, held, read = _ctx_stats(w, rng, caching)
            w_pf = _prefill_work(step, w, rng, caching)
            rate = float(rng.uniform(0.25, 0.45)) / w_pf
            running = rate * (1.3 * w_pf + out * step.decode_step_s(2.0, 2.0 * read))
            # the cache stays mostly free even at a bursty peak (several times the mean batch)
            if max(4.0, 5.0 * running) * held <= 0.3 * kv_tokens or w.prompt_median < 2500:
                break
            w = _scale_lengths(w, 0.7, outputs=False)
        # (the estimate above runs ~2x high at these small batches)
        least = float(rng.choice([16, 24, 32, 32, 48, 64]))
        slots = _nice_slots(min(max(0.5 * running / rng.uniform(0.05, 0.12), least), 256))
        cfg = EngineConfig(model, gpu, tp, slots, budget, caching)
    else:
        # Slots sized so a full batch fills the KV cache to a target — well used (healthy),
        # just about full (saturated: slots and KV both bind) — scaling conversation lengths
        # when the model's cache is very large or small for 32-256 slots.
        target = rng.uniform(0.55, 0.8) if kind == "healthy" else rng.uniform(0.93, 1.02)
        slots_lo, slots_hi = (32, 256) if kind == "healthy" else (48, 256)
        w = base
        for _ in range(6):
            _, ctx_mean, _ = _ctx_stats(w, rng, caching)
            want = kv_tokens * target / ctx_mean
            if slots_lo <= want <= slots_hi:
                break
            clipped = min(max(want, slots_lo), slots_hi)
            w = _scale_lengths(w, min(max(want / clipped, 0.25), 8.0))
        _, ctx_mean, _ = _ctx_stats(w, rng, caching)
        slots = _nice_slots(min(max(kv_tokens * target / ctx_mean, slots_lo), slots_hi))
        cfg = EngineConfig(model, gpu, tp, slots, budget, caching)
        if kind == "healthy":
            rate = _healthy_rate(cfg, w, rng, probe_rng)
        else:
            # Both limits should bind: overloaded runs of the engine say which binds first,
            # and conversation lengths are nudged so the other is nearly reached too.
            over = rng.uniform(1.4, 2.2)
            for attempt in range(4):
                _, ctx_mean, _ = _ctx_stats(w, rng, caching)
                cap = min(slots, 0.97 * cfg.kv_tokens / ctx_mean)
                rate = _rate_for_running(cfg, w, cap, rng) * over
                if attempt == 3:
                    break
                running, kv = _probe_saturated(cfg, w, rate, probe_rng)
                if running < 0.9 * slots:
                    w = _scale_lengths(w, max(0.6, running / (0.95 * slots)))
                elif kv < 0.93:
                    w = _scale_lengths(w, min(1.4, 0.97 / max(kv, 0.1)))
                else:
                    break
    w = _with_rate(w, rate)

    server_gpus: list[list[tuple[int, int]]] = []
    per_node = gpus // n_nodes if ctx.nodes is not None else gpus
    for n_i in range(n_nodes):
        for first in range(0, per_node, tp):
            server_gpus.append([(n_i, first + r) for r in range(tp)])
    scheduler = "kubernetes" if rng.random() < 0.6 else "slurm"
    short = model.name.split("/")[-1].lower().replace(".", "-")[:24].rstrip("-")
    if scheduler == "kubernetes":
        job = f"vllm-{short}-{rng.integers(0, 16**6):06x}"
    else:
        job = str(int(rng.integers(200000, 999999)))
    dep = Deployment(
        cfg=cfg,
        replicas=len(server_gpus),
        n_nodes=n_nodes,
        gpus_per_node=gpn,
        server_gpus=server_gpus,
        job=job,
        scheduler=scheduler,
        vllm_version=VLLM_OLD if old else VLLM_NEW,
        launch_s=launch,
        ready_s=ready,
        weights_on_shared_mount=bool(rng.random() < 0.4),
    )
    return dep, w
