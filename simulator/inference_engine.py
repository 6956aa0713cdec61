"""A vLLM-like serving engine on simulated GPUs: request arrivals, continuous batching, paged KV
cache, chunked prefill, prefix caching, preemption — integrated into 1 s series.

The engine runs on a fixed internal tick (`TICK_S`), vectorised over every server (replica /
tensor-parallel group) of an endpoint and every batch slot of each server. Inside a tick the
work is fluid: the engine runs "mixed" steps (all decoding requests plus a chunk of pending
prefill, as vLLM's chunked-prefill scheduler does) until the pending prefill is done, then pure
decode steps. Each step's duration follows a roofline: the larger of the time to stream the
weights and the KV cache from HBM and the time to do the matmuls, plus scheduler overhead and,
with tensor parallelism, two all-reduces per layer. From that one timeline come the server's
Prometheus series (running, waiting, KV usage, token and prefill/decode-time counters) and the
GPUs' activity (engine busy, FLOPs, HBM bytes), so the two agree with each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

TICK_S = 0.5  # engine integration step; decode steps are 5-40 ms, so a tick holds many
SUBSTEPS_PER_S = round(1.0 / TICK_S)


@dataclass(frozen=True)
class ModelSpec:
    """The architecture figures that decide a model's memory and compute cost."""

    name: str  # the Hugging Face id `vllm serve` is given
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float  # 2 for bf16, 1 for fp8 checkpoints
    max_model_len: int = 32768

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, bf16 cache."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 8, 128, 2),
    ModelSpec("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 32, 4096, 8, 128, 2),
    ModelSpec("Qwen/Qwen2.5-14B-Instruct", 14.7e9, 48, 5120, 8, 128, 2),
    ModelSpec("Qwen/Qwen2.5-32B-Instruct", 32.8e9, 64, 5120, 8, 128, 2),
    ModelSpec("meta-llama/Llama-3.3-70B-Instruct", 70.6e9, 80, 8192, 8, 128, 2),
    ModelSpec("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", 70.6e9, 80, 8192, 8, 128, 1),
)


@dataclass(frozen=True)
class GpuPerf:
    """The throughput figures of one GPU the step-time model needs."""

    name: str
    memory_bytes: float
    bf16_flops: float  # dense peak
    fp8_flops: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per direction, all links


H100_SXM = GpuPerf("NVIDIA H100 80GB HBM3", 81559 * 2**20, 989e12, 1979e12, 3.35e12, 450e9)

# Efficiencies a well-tuned vLLM reaches on Hopper (large GEMMs ~60-65% of peak; HBM ~80%).
MATMUL_EFFICIENCY = 0.62
HBM_EFFICIENCY = 0.82
STEP_OVERHEAD_S = 0.0016  # scheduler + input preparation per engine step (CPU side)
ALLREDUCE_LATENCY_S = 7e-6  # per all-reduce on NVLink, small messages
ACTIVATION_RESERVE_BYTES = 2.5 * 2**30  # profiling peak + CUDA graphs, taken before KV blocks


@dataclass(frozen=True)
class EngineConfig:
    """One vLLM server: a model on `tp` GPUs with its scheduler limits."""

    model: ModelSpec
    gpu: GpuPerf
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    gpu_memory_utilization: float = 0.9
    block_size: int = 16

    @property
    def kv_cache_bytes_per_gpu(self) -> float:
        budget = self.gpu.memory_bytes * self.gpu_memory_utilization
        return budget - self.model.weight_bytes / self.tp - ACTIVATION_RESERVE_BYTES

    @property
    def num_gpu_blocks(self) -> int:
        per_block = self.model.kv_bytes_per_token * self.block_size / self.tp
        return max(0, int(self.kv_cache_bytes_per_gpu // per_block))

    @property
    def kv_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def fits(self) -> bool:
        """Whether the weights fit with a KV cache worth serving from (128k tokens)."""
        return self.kv_tokens >= 131072


@dataclass(frozen=True)
class StepModel:
    """Per-GPU costs of one engine step of one server (all seconds at achievable rates)."""

    weight_read_s: float  # stream the weight shard once
    kv_read_s_per_token: float  # stream one token of KV cache (this GPU's heads)
    matmul_s_per_token: float  # dense matmuls of one token through this GPU's shard
    attn_s_per_token_pos: float  # attention FLOPs of one query token per context position
    tp: int
    layers: int
    hidden: int
    nvlink_bytes_per_s: float
    peak_flops: float
    hbm_bytes_per_s: float
    weight_bytes: float
    kv_bytes_per_token: float

    @classmethod
    def of(cls, cfg: EngineConfig) -> StepModel:
        m, g = cfg.model, cfg.gpu
        peak = g.fp8_flops if m.bytes_per_param <= 1 else g.bf16_flops
        flops_rate = peak * MATMUL_EFFICIENCY
        bw = g.hbm_bytes_per_s * HBM_EFFICIENCY
        return cls(
            weight_read_s=m.weight_bytes / cfg.tp / bw,
            kv_read_s_per_token=m.kv_bytes_per_token / cfg.tp / bw,
            matmul_s_per_token=2.0 * m.params / cfg.tp / flops_rate,
            # QK^T and AV: 2 matmuls x 2 FLOPs per MAC x hidden per layer, bf16 peak.
            attn_s_per_token_pos=4.0 * m.layers * m.hidden / cfg.tp / (g.bf16_flops * 0.5),
            tp=cfg.tp,
            layers=m.layers,
            hidden=m.hidden,
            nvlink_bytes_per_s=g.nvlink_bytes_per_s,
            peak_flops=peak,
            hbm_bytes_per_s=g.hbm_bytes_per_s,
            weight_bytes=m.weight_bytes / cfg.tp,
            kv_bytes_per_token=m.kv_bytes_per_token / cfg.tp,
        )

    def comm_s(self, tokens: np.ndarray) -> np.ndarray:
        """Two all-reduces per layer of the step's activations (zero without TP)."""
        if self.tp == 1:
            return np.zeros_like(tokens, dtype=float)
        ring = 2.0 * (self.tp - 1) / self.tp
        per = ALLREDUCE_LATENCY_S + tokens * self.hidden * 2.0 * ring / self.nvlink_bytes_per_s
        return 2.0 * self.layers * per

    @property
    def comm_s_per_token(self) -> float:
        """All-reduce bandwidth time per token of a large (prefill) step; zero without TP."""
        if self.tp == 1:
            return 0.0
        ring = 2.0 * (self.tp - 1) / self.tp
        return 2.0 * self.layers * self.hidden * 2.0 * ring / self.nvlink_bytes_per_s

    def prefill_work_s(self, prompt: np.ndarray, cached: np.ndarray) -> np.ndarray:
        """Engine seconds to prefill the uncached part of prompts: matmuls, attention over every
        earlier position (long prompts are super-linear) and the TP all-reduces."""
        new = (prompt - cached).astype(float)
        mean_pos = (prompt + cached) / 2.0
        work_s: np.ndarray = new * (
            self.matmul_s_per_token + self.comm_s_per_token + self.attn_s_per_token_pos * mean_pos
        )
        return work_s

    @property
    def prefill_compute_fraction(self) -> float:
        """Share of prefill work that is arithmetic (the rest waits on all-reduces), at a
        typical 2k-token position."""
        comp = self.matmul_s_per_token + self.attn_s_per_token_pos * 2000.0
        return comp / (comp + self.comm_s_per_token)

    def decode_step_s(self, batch: float, ctx_tokens: float) -> float:
        """Duration of one pure-decode step at this batch and total context."""
        mem = self.weight_read_s + ctx_tokens * self.kv_read_s_per_token
        comp = batch * self.matmul_s_per_token + ctx_tokens * self.attn_s_per_token_pos
        comm = float(self.comm_s(np.asarray([batch]))[0])
        return STEP_OVERHEAD_S + comm + max(mem, comp)


@dataclass(frozen=True)
class Workload:
    """Traffic one server receives: arrival rate over time and request shapes."""

    rate_peak: float  # requests/s at the top of the daily cycle (before bursts)
    trough_ratio: float  # rate at the bottom of the cycle / peak
    period_s: float  # length of one load cycle (compressed diurnal pattern)
    peak_at_s: float  # offset of a peak from the start of the trace
    burst_every_s: float  # mean gap between bursts
    burst_len_s: float
    burst_mult: float
    prompt_median: float  # tokens, excluding the shared prefix
    prompt_sigma: float  # lognormal shape
    output_median: float
    output_sigma: float
    output_max: int
    prefix_len: tuple[int, ...]  # shared prefix (system prompt / template) per prefix group
    prefix_weights: tuple[float, ...]
    max_model_len: int = 32768

    def __post_init__(self) -> None:
        if len(self.prefix_len) != len(self.prefix_weights) or not self.prefix_len:
            raise ValueError(
                f"Workload: {len(self.prefix_len)} prefix lengths but "
                f"{len(self.prefix_weights)} prefix weights (need one weight per prefix)"
            )
        for name in ("rate_peak", "period_s", "prompt_median", "output_median"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Workload: {name} must be positive, got {getattr(self, name)}")


def rate_curve(w: Workload, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival rate (req/s) per tick: a compressed diurnal cosine times random bursts."""
    n = math.ceil(duration_s / TICK_S)
    t = np.arange(n) * TICK_S
    cycle = 0.5 + 0.5 * np.cos(2 * np.pi * (t - w.peak_at_s) / w.period_s)
    rate = w.rate_peak * (w.trough_ratio + (1.0 - w.trough_ratio) * cycle)
    burst = np.ones(n)
    pos = float(rng.exponential(w.burst_every_s))
    while pos < duration_s:
        length = float(rng.exponential(w.burst_len_s)) + 2.0
        lo, hi = int(pos / TICK_S), int((pos + length) / TICK_S)
        burst[lo:hi] = w.burst_mult
        pos += length + float(rng.exponential(w.burst_every_s))
    rates: np.ndarray = rate * burst
    return rates


@dataclass
class Requests:
    """The arrivals of one server, in arrival order."""

    arrival: np.ndarray  # s since the start
    prompt: np.ndarray  # tokens, shared prefix included
    output: np.ndarray  # tokens to generate (>= 1)
    group: np.ndarray  # prefix group id
    prefix: np.ndarray  # tokens of shared prefix
    cache_draw: np.ndarray  # uniform draw deciding whether the prefix was still cached


def draw_requests(w: Workload, rates: np.ndarray, rng: np.random.Generator) -> Requests:
    counts = rng.poisson(rates * TICK_S)
    n = int(counts.sum())
    tick = np.repeat(np.arange(len(counts)), counts)
    arrival = (tick + rng.random(n)) * TICK_S
    arrival.sort()
    n_groups = len(w.prefix_len)
    group = rng.choice(n_groups, size=n, p=np.asarray(w.prefix_weights) / sum(w.prefix_weights))
    prefix = np.asarray(w.prefix_len, dtype=np.int64)[group]
    unique = np.maximum(1, rng.lognormal(math.log(w.prompt_median), w.prompt_sigma, n))
    out = np.clip(rng.lognormal(math.log(w.output_median), w.output_sigma, n), 1, w.output_max)
    output = out.astype(np.int64)
    prompt = np.minimum(prefix + unique.astype(np.int64), w.max_model_len - output - 1)
    prompt = np.maximum(prompt, 2)
    prefix = np.minimum(prefix, prompt - 1)
    return Requests(arrival, prompt, output, group, prefix, rng.random(n))


@dataclass
class EngineSeries:
    """Per-second results of an endpoint's servers; arrays are (servers, seconds)."""

    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray
    prompt_tokens: np.ndarray  # cumulative counters from here on
    generation_tokens: np.ndarray
    prefill_time_sum: np.ndarray
    decode_time_sum: np.ndarray
    prefix_queries: np.ndarray
    prefix_hits: np.ndarray
    preemptions: np.ndarray
    finished: np.ndarray
    # GPU-side integrals over each second, per GPU of the server (seconds or ratios)
    busy_s: np.ndarray  # GPU kernels running
    prefill_busy_s: np.ndarray  # share of busy time spent on prefill chunks
    flops: np.ndarray  # FLOPs done per GPU
    hbm_bytes: np.ndarray  # bytes moved per GPU
    # per finished request, for latency checks: (server, ttft, e2e, tpot)
    latencies: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))


def simulate_engine(
    cfg: EngineConfig,
    workloads: list[Workload],
    duration_s: int,
    rng: np.random.Generator,
) -> EngineSeries:
    """Run `len(workloads)` identical servers of config `cfg` for `duration_s` seconds.

    Per-request state lives in (servers x slots) arrays, but a tick touches them only for
    events (admissions, prefill completions, finishes, preemptions): a decoding request's
    progress is implicit — its server counts decode steps `D`, and a request that started
    decoding at step `d0` with `gen0` tokens has generated `gen0 + D - d0` — and the batch's
    context and KV size are kept as per-server sums, so a tick costs O(servers) otherwise.
    """
    if int(duration_s) < 1 or not workloads:
        raise ValueError(
            f"simulate_engine needs at least one server and one second, got "
            f"{len(workloads)} servers for {duration_s} s"
        )
    step = StepModel.of(cfg)
    n_srv, slots, bs = len(workloads), cfg.max_num_seqs, cfg.block_size
    n_ticks = int(duration_s) * SUBSTEPS_PER_S
    secs = int(duration_s)
    reqs = [draw_requests(w, rate_curve(w, duration_s, rng), rng) for w in workloads]
    n_max = max(1, max(len(r.arrival) for r in reqs))
    stride = n_max + slots

    def pad(get: str, fill: float, dtype: type) -> np.ndarray:
        out: np.ndarray = np.full((n_srv, stride), fill, dtype=dtype)
        for s_i, r in enumerate(reqs):
            v = getattr(r, get)
            out[s_i, : len(v)] = v
        return out

    q_arrival = pad("arrival", np.inf, float)
    q_prompt = pad("prompt", 1, np.int64)
    q_output = pad("output", 1, np.int64)
    q_group = pad("group", 0, np.int64)
    q_prefix = pad("prefix", 0, np.int64)
    q_draw = pad("cache_draw", 1.0, float)
    tick_starts = np.arange(n_ticks) * TICK_S
    arrived_by_tick = np.stack(
        [np.searchsorted(r.arrival, tick_starts, side="right") for r in reqs]
    )  # requests that arrived by the start of each tick
    row_base = (np.arange(n_srv) * stride)[:, None]
    srv_of = np.repeat(np.arange(n_srv)[:, None], slots, axis=1)

    # Per request, what admitting it costs, precomputed for the two prefix-cache states a
    # server can be in (cache < 85% used: the shared prefix is still cached with p=0.97;
    # fuller: p=0.55 — evicted more often): cached tokens, KV blocks needed, prefill work.
    variants = (0.97, 0.55) if cfg.enable_prefix_caching else (0.0, 0.0)
    q_hit = np.stack([np.where(q_draw < p, (q_prefix // bs) * bs, 0) for p in variants])
    q_need = np.ceil((q_prompt[None] - q_hit) / bs)
    q_work = np.stack([step.prefill_work_s(q_prompt.astype(float), h.astype(float)) for h in q_hit])
    q_hit_f, q_need_f, q_work_f = q_hit.ravel(), q_need.ravel(), q_work.ravel()
    variant_stride = n_srv * stride

    n_groups = int(q_group.max()) + 1
    group_prefix_blocks = np.zeros(n_groups)
    for g in range(n_groups):
        sel = q_group == g
        group_prefix_blocks[g] = (q_prefix[sel].max() // bs) if sel.any() else 0
    total_blocks = cfg.num_gpu_blocks
    caching = cfg.enable_prefix_caching
    budget = cfg.max_num_batched_tokens

    # --- slot state (servers x slots) ---------------------------------------------------------
    occ = np.zeros((n_srv, slots), bool)
    dec = np.zeros((n_srv, slots), bool)
    fin_at = np.full((n_srv, slots), np.inf)  # decode-step count at which the request is done
    pf_end = np.full((n_srv, slots), np.inf)  # prefill work position at which prefill is done
    prompt = np.zeros((n_srv, slots))
    hit = np.zeros((n_srv, slots))
    out = np.zeros((n_srv, slots))
    gen0 = np.zeros((n_srv, slots))  # tokens generated when decoding (re)started
    d0 = np.zeros((n_srv, slots))
    pf_tok = np.zeros((n_srv, slots))
    grp = np.zeros((n_srv, slots), np.int64)
    rid = np.zeros((n_srv, slots), np.int64)
    admit_t = np.zeros((n_srv, slots))
    first_t = np.zeros((n_srv, slots))
    arrive_t = np.zeros((n_srv, slots))
    # --- per-server aggregates ----------------------------------------------------------------
    dsteps = np.zeros(n_srv)  # decode steps run so far
    n_dec = np.zeros(n_srv)
    n_occ = np.zeros(n_srv)
    held_base = np.zeros(n_srv)  # sum over slots of (prompt - hit + gen0)
    ctx_base = np.zeros(n_srv)  # sum over decoding slots of (prompt + gen0)
    d0_sum = np.zeros(n_srv)  # sum over decoding slots of d0
    grp_cnt = np.zeros((n_srv, n_groups))  # running requests using each cached prefix
    q_next = np.zeros(n_srv, np.int64)
    w_enq = np.zeros(n_srv)  # prefill work queued so far (engine seconds)
    w_done = np.zeros(n_srv)
    pend_tok = np.zeros(n_srv)
    # per server, stack of preempted requests: (rid, tokens generated, first token time,
    # first scheduled time) — vLLM keeps a request's timestamps across a preemption
    preempted: list[list[tuple[int, int, float, float]]] = [[] for _ in range(n_srv)]

    cum = {k: np.zeros(n_srv) for k in _COUNTERS}
    series = {k: np.zeros((n_srv, secs)) for k in (*_COUNTERS, *_GAUGES, *_GPU)}
    lat: list[np.ndarray] = []
    kv_usage_now = np.zeros(n_srv)
    used = np.zeros(n_srv)

    def used_blocks() -> np.ndarray:
        held = held_base + n_dec * dsteps - d0_sum
        blocks = (held + n_occ * (bs / 2.0)) / bs  # each request's last block is half full
        if caching:
            blocks = blocks + (grp_cnt > 0) @ group_prefix_blocks
        return blocks

    def bsum(si: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.bincount(si, weights=w, minlength=n_srv)

    for k in range(n_ticks):
        t0 = k * TICK_S
        arrived = arrived_by_tick[:, k]
        free_slots = slots - n_occ
        waiting_q = arrived - q_next
        if any(preempted) or ((free_slots > 0) & (waiting_q > 0)).any():
            free_blocks = total_blocks - used
            # Preempted requests go first (vLLM puts them back at the head of the queue).
            for s in range(n_srv):
                while preempted[s] and free_slots[s] > 0:
                    r, g_done, t_first, t_sched = preempted[s][-1]
                    redo = float(q_prompt[s, r] + g_done)
                    need = math.ceil(redo / bs)
                    if need > free_blocks[s]:
                        break
                    preempted[s].pop()
                    v = int(np.flatnonzero(~occ[s])[0])
                    # recompute preemption: the prompt and the tokens generated so far are
                    # prefilled again, then generation resumes where it stopped
                    occ[s, v], dec[s, v], rid[s, v] = True, False, r
                    prompt[s, v], hit[s, v] = q_prompt[s, r], 0.0
                    out[s, v], gen0[s, v] = q_output[s, r], g_done
                    grp[s, v] = q_group[s, r]
                    w_enq[s] += float(step.prefill_work_s(np.asarray([redo]), np.zeros(1))[0])
                    pf_end[s, v] = w_enq[s]
                    pf_tok[s, v] = redo
                    pend_tok[s] += redo
                    first_t[s, v], admit_t[s, v] = t_first, t_sched
                    arrive_t[s, v] = q_arrival[s, r]
                    held_base[s] += redo
                    n_occ[s] += 1
                    free_slots[s] -= 1
                    free_blocks[s] -= need
            # look ahead only as far as any server could admit this tick
            win = int(max(1, min(slots, np.minimum(free_slots, waiting_q).max())))
            ar = np.arange(win)[None, :]
            cand = q_next[:, None] + ar
            flat = cand + row_base
            vflat = flat + (kv_usage_now >= 0.85).astype(np.int64)[:, None] * variant_stride
            c_hit = q_hit_f[vflat]
            valid = cand < arrived[:, None]
            fits = ar < free_slots[:, None]
            if any(preempted):  # a preempted request at the head of the queue blocks the rest
                fits &= np.array([not p for p in preempted])[:, None]
            ok = (
                valid
                & (np.cumsum(np.where(valid, q_need_f[vflat], 0), axis=1) <= free_blocks[:, None])
                & fits
            )
            n_admit = np.cumprod(ok, axis=1).sum(axis=1)  # FCFS: stop at the first misfit
            if n_admit.any():
                order = np.argsort(occ, axis=1, kind="stable")[:, :win]  # free slots first
                take = ar < n_admit[:, None]
                si = srv_of[:, :win][take]
                sj = order[take]
                src = cand[take]
                p_new = q_prompt.ravel()[flat[take]].astype(float)
                h_new = c_hit[take].astype(float)
                work_new = q_work_f[vflat[take]]
                # Each server's prefill queue is FIFO: a request's prefill is done once the
                # server has worked through everything queued before it, and itself.
                work_mat = np.zeros((n_srv, win))
                work_mat[take] = work_new
                ends = w_enq[:, None] + np.cumsum(work_mat, axis=1)
                occ[si, sj], dec[si, sj], rid[si, sj] = True, False, src
                prompt[si, sj], hit[si, sj] = p_new, h_new
                out[si, sj] = q_output[si, src]
                gen0[si, sj] = 0.0
                grp[si, sj] = q_group[si, src]
                pf_end[si, sj] = ends[take]
                pf_tok[si, sj] = p_new - h_new
                admit_t[si, sj] = t0
                arrive_t[si, sj] = q_arrival[si, src]
                w_enq += work_mat.sum(axis=1)
                pend_tok += bsum(si, p_new - h_new)
                held_base += bsum(si, p_new - h_new)
                n_occ += n_admit
                q_next += n_admit
                if caching:
                    cum["pq"] += bsum(si, p_new)
                    cum["ph"] += bsum(si, h_new)
                    with_hit = h_new > 0
                    np.add.at(grp_cnt, (si[with_hit], grp[si, sj][with_hit]), 1.0)

        # --- vLLM's gauges, as a scrape at this instant sees them (after the scheduler ran) ---
        if k % SUBSTEPS_PER_S == 0 and k > 0:
            rec = k // SUBSTEPS_PER_S - 1
            series["running"][:, rec] = n_occ
            series["waiting"][:, rec] = (arrived - q_next) + np.array([len(p) for p in preempted])
            series["kv"][:, rec] = np.clip(used_blocks() / max(total_blocks, 1), 0.0, 1.0)
            for key in _COUNTERS:
                series[key][:, rec] = cum[key]

        # --- one tick of engine time (per server) -------------------------------------------
        batch = n_dec
        ctx = ctx_base + n_dec * dsteps - d0_sum
        w_pend = np.maximum(w_enq - w_done, 0.0)
        has_pf = w_pend > 1e-12
        mem_s = step.weight_read_s + ctx * step.kv_read_s_per_token
        dec_comp = batch * step.matmul_s_per_token + ctx * step.attn_s_per_token_pos
        chunk_tok = np.maximum(budget - batch, 1.0)
        afac = np.where(pend_tok > 0, w_pend / np.maximum(pend_tok, 1.0), step.matmul_s_per_token)
        x_max = chunk_tok * afac  # prefill work one mixed step can take
        # The scheduler takes all pending prefill up to the token budget each step, so pending
        # work splits into ceil(pending / budget) equal mixed steps. (The chunk's all-reduce
        # time is part of the prefill work: see prefill_work_s.)
        n_chunks = np.maximum(np.ceil(w_pend / x_max - 1e-9), 1.0)
        x_step = np.where(has_pf, w_pend / n_chunks, 0.0)
        comm = step.comm_s(batch)
        t_m = STEP_OVERHEAD_S + comm + np.maximum(mem_s, dec_comp + x_step)
        t_mixed = np.where(has_pf, np.minimum(TICK_S, n_chunks * t_m), 0.0)
        n_m = t_mixed / t_m
        pf_work = np.minimum(n_m * x_step, w_pend)
        w_new = w_done + pf_work

        # prefills that complete in this tick: their request decodes from the next step on
        done = pf_end <= w_new[:, None] + 1e-12
        new_i = new_j = np.zeros(0, np.int64)
        n_new = np.zeros(n_srv)
        if done.any():
            new_i, new_j = np.nonzero(done)
            n_new = np.bincount(new_i, minlength=n_srv).astype(float)
        live = (batch + n_new) > 0
        t_d = STEP_OVERHEAD_S + comm + np.maximum(mem_s, dec_comp)
        t_dec = np.where(live, TICK_S - t_mixed, 0.0)
        n_d = t_dec / t_d
        steps_total = np.where(live, n_m + n_d, 0.0)
        d_new = dsteps + steps_total
        gen_tick = batch * steps_total
        if len(new_i):
            si, sj = new_i, new_j
            # mixed step (1-based) in which this request's last prefill chunk ran
            c = np.clip(
                np.ceil((pf_end[si, sj] - w_done[si]) / np.maximum(x_step[si], 1e-12) - 1e-9),
                1.0,
                np.maximum(n_m[si], 1.0),
            )
            fresh = gen0[si, sj] == 0  # a re-prefill after preemption emits no new token
            first_t[si, sj] = np.where(fresh, t0 + c * t_m[si], first_t[si, sj])
            gen0[si, sj] = np.where(fresh, 1.0, gen0[si, sj])  # the prefill step's token
            cum["gen"] += bsum(si, fresh.astype(float))
            cum["prompt"] += bsum(si, np.where(fresh, prompt[si, sj], 0.0))
            held_base += bsum(si, fresh.astype(float))
            pend_tok -= bsum(si, pf_tok[si, sj])
            pf_end[si, sj] = np.inf
            start = dsteps[si] + c
            dec[si, sj] = True
            d0[si, sj] = start
            fin_at[si, sj] = start + out[si, sj] - gen0[si, sj]
            n_dec += n_new
            ctx_base += bsum(si, prompt[si, sj] + gen0[si, sj])
            d0_sum += bsum(si, start)
            gen_tick = gen_tick + bsum(si, np.maximum(d_new[si] - start, 0.0))

        # GPU accounting (per GPU of each server): kernels run except in the CPU-side part of
        # the step overhead that is not overlapped
        gpu_busy = t_mixed + t_dec - (n_m + n_d) * STEP_OVERHEAD_S * 0.6
        flops = (pf_work * step.prefill_compute_fraction + steps_total * dec_comp) * (
            step.peak_flops * MATMUL_EFFICIENCY
        )
        hbm = (n_m + n_d) * (step.weight_bytes + ctx * step.kv_bytes_per_token)
        pf_share = np.where(
            has_pf, np.minimum(x_step / np.maximum(dec_comp + x_step, 1e-12), 1.0), 0.0
        )
        sec = k // SUBSTEPS_PER_S
        series["busy"][:, sec] += gpu_busy
        series["pf_busy"][:, sec] += t_mixed * pf_share
        series["flops"][:, sec] += flops
        series["bytes"][:, sec] += hbm

        # --- finishes (requests that decoded their last token in this tick) -----------------
        fin = fin_at <= d_new[:, None] + 1e-9
        if fin.any():
            si, sj = np.nonzero(fin)
            left = fin_at[si, sj] - dsteps[si]  # steps from the tick start to the last token
            t_fin = np.where(
                left <= n_m[si],
                t0 + left * t_m[si],
                t0 + t_mixed[si] + (left - n_m[si]) * t_d[si],
            )
            t_fin = np.maximum(t_fin, first_t[si, sj])
            gen_tick = gen_tick - bsum(si, d_new[si] - fin_at[si, sj])  # steps past the end
            n_dec -= bsum(si, np.ones(len(si)))
            ctx_base -= bsum(si, prompt[si, sj] + gen0[si, sj])
            d0_sum -= bsum(si, d0[si, sj])
            _finish(si, sj, t_fin, occ, dec, fin_at, admit_t, first_t, arrive_t, out, cum, lat)
            _release(si, sj, n_srv, prompt, hit, gen0, grp, held_base, n_occ, grp_cnt)
        cum["gen"] += gen_tick
        w_done = w_new
        pend_tok = np.maximum(pend_tok, 0.0)
        dsteps = d_new

        # --- KV cache: preempt the newest requests when decode growth overflows it -----------
        used = used_blocks()
        for s_np in np.flatnonzero(used > total_blocks):
            s = int(s_np)
            while used[s] > total_blocks and n_dec[s] > 1:
                cands = np.flatnonzero(dec[s])
                v = int(cands[np.argmax(arrive_t[s, cands])])  # the latest arrival goes
                g_now = gen0[s, v] + dsteps[s] - d0[s, v]
                preempted[s].append(
                    (int(rid[s, v]), int(g_now), float(first_t[s, v]), float(admit_t[s, v]))
                )
                n_dec[s] -= 1
                ctx_base[s] -= prompt[s, v] + gen0[s, v]
                d0_sum[s] -= d0[s, v]
                # what it generated since d0 leaves the KV sum with it
                held_base[s] -= dsteps[s] - d0[s, v]
                occ[s, v] = dec[s, v] = False
                fin_at[s, v] = np.inf
                _release(
                    np.asarray([s]),
                    np.asarray([v]),
                    n_srv,
                    prompt,
                    hit,
                    gen0,
                    grp,
                    held_base,
                    n_occ,
                    grp_cnt,
                )
                cum["preempt"][s] += 1
                used = used_blocks()
        kv_usage_now = used / max(total_blocks, 1)

    # the scrape at the end of the last second
    series["running"][:, secs - 1] = n_occ
    series["waiting"][:, secs - 1] = (arrived_by_tick[:, -1] - q_next) + np.array(
        [len(p) for p in preempted]
    )
    series["kv"][:, secs - 1] = np.clip(used_blocks() / max(total_blocks, 1), 0.0, 1.0)
    for key in _COUNTERS:
        series[key][:, secs - 1] = cum[key]

    return EngineSeries(
        running=series["running"],
        waiting=np.maximum(series["waiting"], 0),
        kv_usage=series["kv"],
        prompt_tokens=series["prompt"],
        generation_tokens=np.floor(series["gen"] + 1e-6),
        prefill_time_sum=series["pf"],
        decode_time_sum=series["dec"],
        prefix_queries=series["pq"],
        prefix_hits=series["ph"],
        preemptions=series["preempt"],
        finished=series["finished"],
        busy_s=np.clip(series["busy"], 0.0, 1.0),
        prefill_busy_s=np.clip(series["pf_busy"], 0.0, 1.0),
        flops=series["flops"],
        hbm_bytes=series["bytes"],
        latencies=np.concatenate(lat) if lat else np.zeros((0, 4)),
    )


_COUNTERS = ("prompt", "gen", "pf", "dec", "pq", "ph", "preempt", "finished")
_GAUGES = ("running", "waiting", "kv")
_GPU = ("busy", "pf_busy", "flops", "bytes")


def _finish(
    si: np.ndarray,
    sj: np.ndarray,
    t_fin: np.ndarray,
    occ: np.ndarray,
    dec: np.ndarray,
    fin_at: np.ndarray,
    admit_t: np.ndarray,
    first_t: np.ndarray,
    arrive_t: np.ndarray,
    out: np.ndarray,
    cum: dict[str, np.ndarray],
    lat: list[np.ndarray],
) -> None:
    """Book finished requests into vLLM's per-request histogram sums (observed at the end of
    a request, as vLLM does) and the latency records; free their slots."""
    n_srv = occ.shape[0]
    pf = first_t[si, sj] - admit_t[si, sj]
    dec_t = np.maximum(t_fin - first_t[si, sj], 0.0)
    cum["pf"] += np.bincount(si, weights=pf, minlength=n_srv)
    cum["dec"] += np.bincount(si, weights=dec_t, minlength=n_srv)
    cum["finished"] += np.bincount(si, minlength=n_srv)
    ttft = first_t[si, sj] - arrive_t[si, sj]
    e2e = t_fin - arrive_t[si, sj]
    tpot = dec_t / np.maximum(out[si, sj] - 1, 1)
    lat.append(np.stack([si.astype(float), ttft, e2e, tpot], axis=1))
    occ[si, sj] = False
    dec[si, sj] = False
    fin_at[si, sj] = np.inf


def _release(
    si: np.ndarray,
    sj: np.ndarray,
    n_srv: int,
    prompt: np.ndarray,
    hit: np.ndarray,
    gen0: np.ndarray,
    grp: np.ndarray,
    held_base: np.ndarray,
    n_occ: np.ndarray,
    grp_cnt: np.ndarray,
) -> None:
    """Take freed slots out of the per-server KV sums."""
    held_base -= np.bincount(
        si, weights=prompt[si, sj] - hit[si, sj] + gen0[si, sj], minlength=n_srv
    )
    n_occ -= np.bincount(si, minlength=n_srv)
    with_hit = hit[si, sj] > 0
    if with_hit.any():
        np.add.at(grp_cnt, (si[with_hit], grp[si, sj][with_hit]), -1.0)
