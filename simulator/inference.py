"""Inference scenarios: a vLLM endpoint (1–8 GPUs, one server per tensor-parallel group) serving
simulated traffic, written as the trace the agent would record.

    healthy_inference      well-utilised endpoint — the healthy control (no verdict)
    underfilled_batches    docs/design.md §1 case 3: meets its SLA with ~10% of batch slots in
                           use, KV cache mostly free, long RAG prompts, prefix caching off
    saturated_inference    the twin: slots full, queue growing, KV cache near full — overloaded,
                           not underfilled (no §6 family, so truth family is null)

`inference_plan.py` picks a randomised deployment per seed, `inference_engine.py` runs the
vLLM-like engine; this module turns the engine's 1 s series into trace records on a simulated
fleet (`fleet.py`): vLLM's own Prometheus names per server (with the labels the agent's scraper
attaches), GPU activity through the physical model of `hardware.py`, host CPU/memory and the
checkpoint read at start-up, process/job records and vLLM's server log lines.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

from contract import signals
from simulator.fleet import Fleet, make_fleet
from simulator.inference_engine import EngineSeries, StepModel, simulate_engine
from simulator.inference_plan import Deployment, endpoint_size, plan
from simulator.run import SimRun
from simulator.scenarios import ScenarioContext, register

FAMILY_UNDERFILLED = "underfilled_batches"
LOG_INTERVAL_S = 10  # vLLM's default stats-logging interval


# --- records ------------------------------------------------------------------------------------


def _nice_ceiling(x: float) -> float:
    for v in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0):
        if v >= x:
            return v
    return float(math.ceil(x / 30.0) * 30.0)


def _log_prefix(dep: Deployment, pid: int, proc: str, ts: float, src: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime(ts))
    if dep.old_vllm:
        return f"INFO {stamp} [{src}]"
    return f"({proc} pid={pid}) INFO {stamp} [{src}]"


def _cmd(dep: Deployment, port: int) -> str:
    c = dep.cfg
    parts = [
        "vllm",
        "serve",
        c.model.name,
        "--tensor-parallel-size",
        str(c.tp),
        "--max-num-seqs",
        str(c.max_num_seqs),
        "--max-num-batched-tokens",
        str(c.max_num_batched_tokens),
        "--gpu-memory-utilization",
        f"{c.gpu_memory_utilization}",
        "--max-model-len",
        str(c.model.max_model_len),
        "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching",
        "--port",
        str(port),
        "--disable-log-requests",
        "--disable-uvicorn-access-log",
    ]
    return " ".join(parts)


def build_inference(ctx: ScenarioContext, kind: str) -> SimRun:
    rng = ctx.rng
    n = ctx.n_samples
    size = endpoint_size(ctx)
    fleet = make_fleet(
        rng,
        seed=ctx.seed,
        n_nodes=size[0],
        gpus_per_node=size[1],
        n_samples=n,
        start_ts=ctx.start_ts,
        interval_s=ctx.interval_s,
    )
    dep, w = plan(ctx, kind, fleet.spec, size)
    eng = simulate_engine(dep.cfg, [w] * dep.replicas, n - dep.ready_s, rng)
    lat = eng.latencies
    if len(lat) == 0:
        ttft_sla, e2e_sla = 1.0, 10.0
    elif kind == "saturated":
        # The SLA an unloaded endpoint would meet; the overloaded one misses it.
        ttft_sla = _nice_ceiling(float(np.percentile(lat[:, 1], 10)) * 3 + 0.5)
        e2e_sla = _nice_ceiling(float(np.percentile(lat[:, 2], 50)) * 1.5)
    else:
        # The endpoint meets its SLA: the target sits above the p95 it achieves.
        ttft_sla = _nice_ceiling(float(np.percentile(lat[:, 1], 95)) * rng.uniform(1.2, 1.8))
        e2e_sla = _nice_ceiling(float(np.percentile(lat[:, 2], 95)) * rng.uniform(1.2, 1.8))
    dep = Deployment(**{**dep.__dict__, "sla_ttft_p95_s": ttft_sla, "sla_e2e_p95_s": e2e_sla})
    start = ctx.start_ts
    truth: dict[str, Any]
    if kind == "underfilled":
        truth = {
            "family": FAMILY_UNDERFILLED,
            "category": "job",
            "subject": {"job": dep.job, "node": None, "gpu": None, "rank": None, "mount": None},
            "onset": round(start + dep.ready_s, 3),
            "detail": {
                "cause": "batching config: few requests per server for the batch slots, long "
                "prompts prefilled without prefix caching",
                "max_num_seqs": dep.cfg.max_num_seqs,
                "enable_prefix_caching": False,
            },
        }
    else:
        truth = {"family": None, "category": None, "subject": None, "onset": None}
        truth["detail"] = {"control_for": FAMILY_UNDERFILLED}
        if kind == "saturated":
            truth["detail"]["note"] = (
                "overloaded endpoint (slots full, queue growing, KV cache near full): saturation "
                "is not a docs/design.md §6 family; no underfilled_batches verdict is expected"
            )
    meta: dict[str, Any] = {
        "source": "proof-sim",
        "seed": ctx.seed,
        "duration_s": ctx.duration_s,
        "interval_s": ctx.interval_s,
        "start_ts": start,
        "nodes": [nd.hostname for nd in fleet.nodes],
        "gpu_model": fleet.spec.name,
        "jobs": {dep.job: "primary"},
        "inference": _summary(eng, dep, lat),
    }
    run = SimRun(meta, start_ts=start, n_samples=n, interval_s=ctx.interval_s)
    _emit(run, ctx, fleet, dep, eng)
    fleet.emit(run, rng)
    run.meta["truth"] = truth
    return run


def _summary(eng: EngineSeries, dep: Deployment, lat: np.ndarray) -> dict[str, Any]:
    """Figures of the simulated run, for tests and people reading a trace (not for detectors)."""
    slots = dep.cfg.max_num_seqs
    busy = float(eng.busy_s.sum())
    pf = float(eng.prefill_time_sum[:, -1].sum()) if eng.finished.size else 0.0
    dec = float(eng.decode_time_sum[:, -1].sum()) if eng.finished.size else 0.0
    return {
        "model": dep.cfg.model.name,
        "tp": dep.cfg.tp,
        "replicas": dep.replicas,
        "max_num_seqs": slots,
        "kv_cache_tokens": dep.cfg.kv_tokens,
        "vllm_version": dep.vllm_version,
        "running_over_slots_mean": round(float(eng.running.mean()) / slots, 4),
        "running_over_slots_p95": round(float(np.percentile(eng.running, 95)) / slots, 4),
        "kv_usage_p95": round(float(np.percentile(eng.kv_usage, 95)), 4),
        "prefill_share_of_busy": round(float(eng.prefill_busy_s.sum()) / max(busy, 1e-9), 4),
        "prefill_share_of_request_time": round(pf / max(pf + dec, 1e-9), 4),
        "requests_finished": int(eng.finished[:, -1].sum()) if eng.finished.size else 0,
        "ttft_p95_s": round(float(np.percentile(lat[:, 1], 95)), 3) if len(lat) else None,
        "e2e_p95_s": round(float(np.percentile(lat[:, 2], 95)), 3) if len(lat) else None,
        "sla_ttft_p95_s": dep.sla_ttft_p95_s,
        "sla_e2e_p95_s": dep.sla_e2e_p95_s,
        "preemptions": int(eng.preemptions[:, -1].sum()) if eng.preemptions.size else 0,
    }


def _gpu_activity(
    fleet: Fleet, dep: Deployment, eng: EngineSeries, rng: np.random.Generator
) -> None:
    """Per-GPU DCGM activity ratios from the engine's timeline, into the fleet. Every TP rank
    does the same share of each step; the load phase shows the CUDA context, the weights
    streaming in, vLLM's profiling forward pass and the KV cache allocation."""
    act, spec, n = fleet.activity, fleet.spec, fleet.n_samples
    step = StepModel.of(dep.cfg)
    r0, launch = dep.ready_s, dep.launch_s
    # vLLM takes gpu_memory_utilization of the whole card; a little more is outside torch
    fb_full = dep.cfg.gpu_memory_utilization * spec.fb_total_mib + rng.uniform(350, 650)
    weights_mib = step.weight_bytes / 2**20
    busy = eng.busy_s
    tensor = np.minimum(np.clip(eng.flops / step.peak_flops * 0.95, 0, None), busy * 0.92)
    dram = np.minimum(eng.hbm_bytes / step.hbm_bytes_per_s + 0.12 * eng.prefill_busy_s, busy)
    safe = np.maximum(busy, 1e-9)
    sm = busy * np.clip(0.6 + 0.45 * tensor / safe, 0, 0.97)
    occupancy = sm * np.clip(0.22 + 0.25 * dram / safe, 0, 0.6)
    load = max(1, r0 - launch)
    fb = np.zeros(n)
    fb[launch:] = fb_full
    ramp_len = max(1, int(load * 0.6))
    fb[launch : launch + ramp_len] = np.linspace(500.0, weights_mib + 500.0, ramp_len)[: n - launch]
    prof = launch + ramp_len  # the profiling run happens once the weights are in
    for s, ranks in enumerate(dep.server_gpus):
        for rank_i, (ni, li) in enumerate(ranks):
            g = fleet.gpu(ni, li)
            jitter = 1.0 + rng.normal(0, 0.01, n - r0)
            act.engine_active[g, r0:] = np.clip(busy[s] * jitter, 0, 1)
            act.sm_active[g, r0:] = np.clip(sm[s] * jitter, 0, 1)
            act.sm_occupancy[g, r0:] = np.clip(occupancy[s], 0, 1)
            act.tensor_active[g, r0:] = np.clip(tensor[s] * jitter, 0, 1)
            act.dram_active[g, r0:] = np.clip(dram[s] * jitter, 0, 1)
            if prof < r0:
                span = slice(prof, min(prof + 3, r0))
                act.engine_active[g, span] = 0.9
                act.sm_active[g, span] = 0.85
                act.sm_occupancy[g, span] = 0.3
                act.tensor_active[g, span] = 0.5
                act.dram_active[g, span] = 0.35
            act.fb_used_mib[g] = fb + rank_i * rng.uniform(0, 40)


def _host_load(fleet: Fleet, dep: Deployment, eng: EngineSeries, rng: np.random.Generator) -> None:
    """Host CPU (the API server, the engine-core busy loop, one process per TP worker), host
    memory of the server processes, and the checkpoint read from disk while loading."""
    n, r0, launch = fleet.n_samples, dep.ready_s, dep.launch_s
    mount = fleet.shared if dep.weights_on_shared_mount else fleet.local
    read_s = max(1, int((r0 - launch) * 0.6))
    per_node_bytes = np.zeros(dep.n_nodes)
    for s, ranks in enumerate(dep.server_gpus):
        ni = ranks[0][0]
        cores = np.zeros(n)
        cores[launch:r0] = 1.0 + 0.8 * len(ranks)
        cores[r0:] = 1.2 + 0.9 * len(ranks) + 0.6 * eng.busy_s[s] + rng.gamma(2.0, 0.05, n - r0)
        fleet.host_cores_used[ni] += cores
        mem = np.zeros(n)
        mem[launch:] = (6e9 + 3e9 * len(ranks)) * rng.uniform(0.9, 1.1)
        fleet.host_mem_used[ni] += mem
        per_node_bytes[ni] += dep.cfg.model.weight_bytes
    for ni in range(dep.n_nodes):
        rate = per_node_bytes[ni] / read_s
        span = slice(launch, min(launch + read_s, n))
        fleet.storage_read[mount.path][ni, span] += rate * rng.uniform(0.8, 1.2, span.stop - launch)


def _emit(
    run: SimRun, ctx: ScenarioContext, fleet: Fleet, dep: Deployment, eng: EngineSeries
) -> None:
    rng = ctx.rng
    n = ctx.n_samples
    cfg = dep.cfg
    _gpu_activity(fleet, dep, eng, rng)
    _host_load(fleet, dep, eng, rng)

    launch_ts = ctx.start_ts + dep.launch_s
    pids = rng.choice(np.arange(2000, 400000), size=len(dep.server_gpus) * 10, replace=False)
    server_rows: list[dict[str, Any]] = []
    for s, ranks in enumerate(dep.server_gpus):
        node = fleet.nodes[ranks[0][0]].hostname
        api_pid, core_pid = int(pids[s * 10]), int(pids[s * 10 + 1])
        port = 8000 + (s % (dep.gpus_per_node // cfg.tp))
        run.add(
            {
                "type": "process",
                "ts": launch_ts,
                "node": node,
                "pid": api_pid,
                "job": dep.job,
                "cmd": _cmd(dep, port),
            }
        )
        # The processes holding the GPUs: the engine core (TP 1) or one worker per TP rank.
        for r, (ni, li) in enumerate(ranks):
            pid = core_pid if cfg.tp == 1 else int(pids[s * 10 + 2 + r])
            g = fleet.gpu(ni, li)
            uuid = fleet.nodes[ni].gpu_uuids[li]
            run.add(
                {
                    "type": "process",
                    "ts": launch_ts + 1.0,
                    "node": node,
                    "pid": pid,
                    "job": dep.job,
                    "local_rank": r,
                    "gpu": uuid,
                    "gpu_index": li,
                    "cmd": "VLLM::EngineCore" if cfg.tp == 1 else f"VLLM::Worker_TP{r}",
                }
            )
            fleet.gpu_owner.setdefault(g, []).append(
                (dep.launch_s, n, {"pid": pid, "job": dep.job})
            )
        row: dict[str, Any] = {signals.NODE: node, signals.PID: api_pid, signals.JOB: dep.job}
        if cfg.tp == 1:
            row[signals.GPU] = fleet.nodes[ranks[0][0]].gpu_uuids[ranks[0][1]]
            row[signals.GPU_INDEX] = ranks[0][1]
        labels = {"model_name": cfg.model.name, "server": "vllm"}
        if not dep.old_vllm:
            labels["engine"] = "0"
        row["labels"] = labels
        server_rows.append(row)
        _startup_logs(run, dep, node, api_pid, core_pid, port)
        _stats_logs(run, dep, s, node, api_pid, eng)

    run.add(
        {
            "type": "job",
            "ts": launch_ts,
            "job": dep.job,
            "kind": "inference",
            "name": f"vllm-{cfg.model.name.split('/')[-1]}",
            "nodes": [nd.hostname for nd in fleet.nodes],
            "world_size": sum(len(r) for r in dep.server_gpus),
            "scheduler": dep.scheduler,
            "state": "running",
            "config": {
                "engine": "vllm",
                "vllm_version": dep.vllm_version,
                "model": cfg.model.name,
                "max_num_seqs": cfg.max_num_seqs,
                "tensor_parallel_size": cfg.tp,
                "replicas": dep.replicas,
                "enable_prefix_caching": cfg.enable_prefix_caching,
                "max_num_batched_tokens": cfg.max_num_batched_tokens,
                "gpu_memory_utilization": cfg.gpu_memory_utilization,
                "max_model_len": cfg.model.max_model_len,
                "sla_target_latency_s": dep.sla_e2e_p95_s,
                "sla_ttft_p95_s": dep.sla_ttft_p95_s,
            },
        }
    )

    # vLLM metrics, from the first scrape after the server is up
    r0 = dep.ready_s
    usage_name = (
        signals.VLLM_GPU_CACHE_USAGE_PERC if dep.old_vllm else signals.VLLM_KV_CACHE_USAGE_PERC
    )
    series = (
        (signals.VLLM_NUM_REQUESTS_RUNNING, eng.running),
        (signals.VLLM_NUM_REQUESTS_WAITING, eng.waiting),
        (usage_name, np.round(eng.kv_usage, 6)),
        (signals.VLLM_PROMPT_TOKENS_TOTAL, eng.prompt_tokens),
        (signals.VLLM_GENERATION_TOKENS_TOTAL, eng.generation_tokens),
        (signals.VLLM_REQUEST_PREFILL_TIME_SECONDS_SUM, np.round(eng.prefill_time_sum, 6)),
        (signals.VLLM_REQUEST_DECODE_TIME_SECONDS_SUM, np.round(eng.decode_time_sum, 6)),
        (signals.VLLM_PREFIX_CACHE_QUERIES_TOTAL, eng.prefix_queries),
        (signals.VLLM_PREFIX_CACHE_HITS_TOTAL, eng.prefix_hits),
    )
    for name, values in series:
        run.add_samples(name, values, server_rows, start=r0)
    # inference.max_num_seqs comes from the command line, as the agent's collector reads it
    slot_rows = [
        {**{k: v for k, v in r.items() if k != "labels"}, "labels": {"server": "vllm"}}
        for r in server_rows
    ]
    slots = np.full((len(server_rows), n - r0), cfg.max_num_seqs, dtype=np.int64)
    run.add_samples(signals.INFERENCE_MAX_NUM_SEQS, slots, slot_rows, start=r0)


def _line(dep: Deployment, pid: int, proc: str, ts: float, src: str, msg: str) -> str:
    return f"{_log_prefix(dep, pid, proc, ts, src)} {msg}"


def _log(run: SimRun, ts: float, node: str, pid: int, job: str, line: str) -> None:
    run.add(
        {
            "type": "log",
            "ts": ts,
            "node": node,
            "pid": pid,
            "job": job,
            "line": line,
            "stream": "stdout",
        }
    )


def _startup_logs(
    run: SimRun, dep: Deployment, node: str, api_pid: int, core_pid: int, port: int
) -> None:
    cfg = dep.cfg
    t0 = run.start_ts + dep.launch_s
    t1 = run.start_ts + dep.ready_s
    old = dep.old_vllm
    core = "EngineCore_0" if not old else "EngineCore"
    kv_gib = cfg.kv_cache_bytes_per_gpu / 2**30
    conc = cfg.kv_tokens / cfg.model.max_model_len
    api_src = "api_server.py:1043" if old else "api_server.py:1805"
    lines = [
        (t0, api_pid, "APIServer", api_src, f"vLLM API server version {dep.vllm_version}"),
        (
            t0 + 0.4,
            api_pid,
            "APIServer",
            "utils.py:326",
            f"non-default args: {{'model': '{cfg.model.name}', 'max_num_seqs': "
            f"{cfg.max_num_seqs}, 'tensor_parallel_size': {cfg.tp}, "
            f"'max_num_batched_tokens': {cfg.max_num_batched_tokens}, "
            f"'enable_prefix_caching': {cfg.enable_prefix_caching}}}",
        ),
        (
            t0 + (t1 - t0) * 0.6,
            core_pid,
            core,
            "gpu_model_runner.py:1892",
            f"Model loading took {cfg.model.weight_bytes / cfg.tp / 2**30:.4f} GiB and "
            f"{(t1 - t0) * 0.55:.2f} seconds",
        ),
        (
            t1 - 3.0,
            core_pid,
            core,
            "gpu_worker.py:276",
            f"Available KV cache memory: {kv_gib:.2f} GiB",
        ),
        (
            t1 - 2.9,
            core_pid,
            core,
            "kv_cache_utils.py:849",
            f"GPU KV cache size: {cfg.kv_tokens:,} tokens",
        ),
        (
            t1 - 2.9,
            core_pid,
            core,
            "kv_cache_utils.py:853",
            f"Maximum concurrency for {cfg.model.max_model_len:,} tokens per request: {conc:.2f}x",
        ),
        (
            t1 - 0.5,
            api_pid,
            "APIServer",
            "api_server.py:1857",
            f"Starting vLLM API server 0 on http://0.0.0.0:{port}",
        ),
    ]
    for ts, pid, proc, src, msg in sorted(lines, key=lambda x: x[0]):
        _log(run, max(ts, t0), node, pid, dep.job, _line(dep, pid, proc, ts, src, msg))
    _log(run, max(t1 - 0.2, t0), node, api_pid, dep.job, "INFO:     Application startup complete.")


def _stats_logs(
    run: SimRun, dep: Deployment, s: int, node: str, api_pid: int, eng: EngineSeries
) -> None:
    """vLLM's periodic engine-stats line (every 10 s), values over the window since the last."""
    old = dep.old_vllm
    src = "loggers.py:80" if old else "loggers.py:123"
    serve = eng.running.shape[1]
    prev = -1
    for i in range(LOG_INTERVAL_S - 1, serve, LOG_INTERVAL_S):

        def delta(a: np.ndarray, i: int = i, prev: int = prev) -> float:
            return float(a[s, i] - (a[s, prev] if prev >= 0 else 0.0))

        el = float(i - prev)
        pt, gt = delta(eng.prompt_tokens) / el, delta(eng.generation_tokens) / el
        running, waiting = int(eng.running[s, i]), int(eng.waiting[s, i])
        prev = i
        if pt == 0 and gt == 0 and running == 0 and waiting == 0:
            continue  # vLLM stays quiet while idle
        q = delta(eng.prefix_queries)
        hit_rate = 100.0 * delta(eng.prefix_hits) / q if q > 0 else 0.0
        msg = (
            f"Avg prompt throughput: {pt:.1f} tokens/s, Avg generation throughput: {gt:.1f} "
            f"tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: "
            f"{100.0 * eng.kv_usage[s, i]:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%"
        )
        if not old:
            msg = "Engine 000: " + msg
        ts = run.start_ts + dep.ready_s + i + 0.5
        _log(run, ts, node, api_pid, dep.job, _line(dep, api_pid, "APIServer", ts, src, msg))


# (scenario, build_inference kind, family, description)
_SCENARIOS: tuple[tuple[str, str, str | None, str], ...] = (
    (
        "healthy_inference",
        "healthy",
        None,
        "vLLM endpoint (1-8 GPUs) busy at peak: batch slots nearly full, KV cache well used, "
        "prefix caching on — healthy control, no verdict",
    ),
    (
        "underfilled_batches",
        "underfilled",
        FAMILY_UNDERFILLED,
        "vLLM endpoint meets its SLA with ~10% of batch slots in use, KV cache mostly free, long "
        "RAG prompts so prefill dominates, prefix caching off (docs/design.md §1, case 3)",
    ),
    (
        "saturated_inference",
        "saturated",
        None,
        "the underfilled twin: vLLM endpoint overloaded, slots full, queue growing, KV cache "
        "near full — not underfilled (saturation is no §6 family: truth family null)",
    ),
)
for _name, _kind, _family, _description in _SCENARIOS:
    register(_name, kind="inference", family=_family, description=_description)(
        functools.partial(build_inference, kind=_kind)
    )
