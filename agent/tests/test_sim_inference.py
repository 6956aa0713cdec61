"""The inference simulator: the vLLM-like engine's physics and the three inference scenarios
(healthy control, underfilled batches, its saturated twin) as traces."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract import signals
from contract.trace import validate_trace
from simulator import SimRun, simulate
from simulator.inference_engine import (
    H100_SXM,
    MODELS,
    EngineConfig,
    StepModel,
    Workload,
    simulate_engine,
)

INFERENCE = ("healthy_inference", "underfilled_batches", "saturated_inference")
LLAMA_8B = MODELS[0]
VLLM_GAUGES = (
    signals.VLLM_NUM_REQUESTS_RUNNING,
    signals.VLLM_NUM_REQUESTS_WAITING,
)
VLLM_COUNTERS = (
    signals.VLLM_PROMPT_TOKENS_TOTAL,
    signals.VLLM_GENERATION_TOKENS_TOTAL,
    signals.VLLM_REQUEST_PREFILL_TIME_SECONDS_SUM,
    signals.VLLM_REQUEST_DECODE_TIME_SECONDS_SUM,
    signals.VLLM_PREFIX_CACHE_QUERIES_TOTAL,
    signals.VLLM_PREFIX_CACHE_HITS_TOTAL,
)


def _workload(rate: float, **kw: Any) -> Workload:
    base: dict[str, Any] = dict(
        rate_peak=rate,
        trough_ratio=1.0,
        period_s=1e9,
        peak_at_s=0.0,
        burst_every_s=1e9,
        burst_len_s=1.0,
        burst_mult=1.0,
        prompt_median=800.0,
        prompt_sigma=0.8,
        output_median=250.0,
        output_sigma=0.7,
        output_max=2048,
        prefix_len=(600, 1200),
        prefix_weights=(0.6, 0.4),
    )
    base.update(kw)
    return Workload(**base)


# --- engine -------------------------------------------------------------------------------------


def test_step_time_model_matches_hopper_figures() -> None:
    cfg = EngineConfig(LLAMA_8B, H100_SXM, 1, 128, 8192, True)
    step = StepModel.of(cfg)
    # An 8B model streams ~16 GB of weights per decode step: ~7 ms, ~140 tokens/s one stream.
    assert 0.005 < step.decode_step_s(1, 2000) < 0.009
    # A large batch costs more per step but far less per token.
    big = step.decode_step_s(128, 128 * 2000)
    assert step.decode_step_s(1, 2000) < big < 0.03
    # Prefill is compute-bound: 8k tokens in ~0.2-0.35 s (tens of thousands of tokens/s).
    assert 0.15 < step.prefill_work_s(np.array([8192.0]), np.zeros(1))[0] < 0.4
    # KV capacity: 90% of 80 GB minus 16 GB of weights, 128 KiB per token.
    assert 400_000 < cfg.kv_tokens < 470_000
    # Tensor parallelism splits the weights: a 70B model fits on 4 GPUs, not on 1.
    assert not EngineConfig(MODELS[4], H100_SXM, 1, 64, 8192, True).fits()
    assert EngineConfig(MODELS[4], H100_SXM, 4, 64, 8192, True).fits()


def test_engine_invariants_and_little_law() -> None:
    cfg = EngineConfig(LLAMA_8B, H100_SXM, 1, 64, 8192, True)
    es = simulate_engine(cfg, [_workload(4.0)] * 2, 600, np.random.default_rng(3))
    assert (es.running <= cfg.max_num_seqs).all() and es.running.max() > 0
    assert ((es.kv_usage >= 0) & (es.kv_usage <= 1)).all()
    for counter in (
        es.prompt_tokens,
        es.generation_tokens,
        es.prefill_time_sum,
        es.decode_time_sum,
        es.prefix_queries,
        es.prefix_hits,
        es.finished,
    ):
        assert (np.diff(counter, axis=1) >= -1e-9).all()
    assert (es.prefix_hits <= es.prefix_queries).all()
    # Little's law: requests in the system = arrival rate x time in system.
    lat = es.latencies
    in_system = es.running[:, 120:].mean() + es.waiting[:, 120:].mean()
    assert in_system == pytest.approx(4.0 * lat[:, 2].mean(), rel=0.2)
    # Every finished request generated its tokens: decode throughput = finished x mean output.
    per_req = es.generation_tokens[:, -1].sum() / es.finished[:, -1].sum()
    assert 150 < per_req < 400
    # GPU time: the engine is busy while it holds requests; busy <= 1 s per second.
    assert (es.busy_s <= 1.0).all() and es.busy_s.mean() > 0.5


def test_generation_rate_is_batch_times_step_rate() -> None:
    """Tokens generated per second = decoding requests x decode steps per second, where a step
    can never be faster than streaming the weights once."""
    cfg = EngineConfig(LLAMA_8B, H100_SXM, 1, 128, 8192, False)
    es = simulate_engine(
        cfg,
        [_workload(3.0, prompt_median=300.0, prefix_len=(50,), prefix_weights=(1.0,))],
        400,
        np.random.default_rng(5),
    )
    step = StepModel.of(cfg)
    gen = np.diff(es.generation_tokens[0])
    running = np.maximum(es.running[0, 1:], es.running[0, :-1])
    fastest = 1.0 / step.decode_step_s(1, 0)
    assert (gen <= (running + 3) * fastest).all()
    # ... and with a full second of decoding at that batch, close to it.
    window = slice(100, 400)
    est = es.running[0, window].mean() / step.decode_step_s(
        es.running[0, window].mean(), es.running[0, window].mean() * 550
    )
    assert np.diff(es.generation_tokens[0, 99:400]).mean() == pytest.approx(est, rel=0.35)


def test_prefix_caching_hits_the_shared_prefix_only_when_on() -> None:
    w = _workload(3.0, prompt_median=400.0, prefix_len=(1600,), prefix_weights=(1.0,))
    on = simulate_engine(
        EngineConfig(LLAMA_8B, H100_SXM, 1, 64, 8192, True), [w], 300, np.random.default_rng(1)
    )
    off = simulate_engine(
        EngineConfig(LLAMA_8B, H100_SXM, 1, 64, 8192, False), [w], 300, np.random.default_rng(1)
    )
    rate = on.prefix_hits[0, -1] / on.prefix_queries[0, -1]
    assert 0.6 < rate < 0.85  # a 1600-token prefix of ~2000-token prompts, whole blocks only
    assert off.prefix_queries[0, -1] == 0 and off.prefix_hits[0, -1] == 0
    # Cached prefixes are not recomputed: less prefill time per request.
    pf_on = on.prefill_time_sum[0, -1] / on.finished[0, -1]
    pf_off = off.prefill_time_sum[0, -1] / off.finished[0, -1]
    assert pf_on < 0.6 * pf_off


def test_overload_queues_and_preempts_but_kv_never_exceeds_capacity() -> None:
    cfg = EngineConfig(LLAMA_8B, H100_SXM, 1, 256, 8192, False)
    w = _workload(60.0, prompt_median=2500.0, output_median=600.0)
    es = simulate_engine(cfg, [w], 240, np.random.default_rng(2))
    assert es.waiting[0, -1] > es.waiting[0, 60] > 50  # the queue grows
    assert es.kv_usage[0, 60:].mean() > 0.9 and es.kv_usage.max() <= 1.0
    assert es.preemptions[0, -1] > 0


def test_workload_rejects_mismatched_prefixes() -> None:
    with pytest.raises(ValueError, match="prefix weights"):
        _workload(1.0, prefix_len=(100, 200), prefix_weights=(1.0,))


def test_engine_is_deterministic_for_a_seed() -> None:
    cfg = EngineConfig(LLAMA_8B, H100_SXM, 1, 64, 8192, True)
    a = simulate_engine(cfg, [_workload(4.0)], 200, np.random.default_rng(9))
    b = simulate_engine(cfg, [_workload(4.0)], 200, np.random.default_rng(9))
    c = simulate_engine(cfg, [_workload(4.0)], 200, np.random.default_rng(10))
    assert np.array_equal(a.generation_tokens, b.generation_tokens)
    assert np.array_equal(a.kv_usage, b.kv_usage)
    assert not np.array_equal(a.generation_tokens, c.generation_tokens)


# --- scenarios ----------------------------------------------------------------------------------

DURATION = 600.0
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], SimRun]:
    return {(n, s): simulate(n, seed=s, duration_s=DURATION) for n in INFERENCE for s in SEEDS}


def _series(run: SimRun, name: str) -> list[tuple[dict[str, Any], np.ndarray]]:
    return run.series(name, key=("node", "pid"))


def _served(values: np.ndarray) -> np.ndarray:
    served: np.ndarray = values[~np.isnan(values)]
    return served


@pytest.mark.parametrize("name", INFERENCE)
def test_inference_trace_validates_with_truth(name: str, tmp_path: Path) -> None:
    run = simulate(name, seed=4, duration_s=300)
    path = tmp_path / "t.jsonl.gz"
    written = run.write(path)
    report = validate_trace(path)
    assert report.ok, report.problems[:5]
    assert report.records == written
    meta = report.meta
    assert meta is not None and meta["scenario"] == name and meta["kind"] == "inference"
    truth = meta["truth"]
    if name == "underfilled_batches":
        assert truth["family"] == "underfilled_batches" and truth["category"] == "job"
        job = next(r for r in run.discrete if r["type"] == "job")
        assert truth["subject"] == {
            "job": job["job"],
            "node": None,
            "gpu": None,
            "rank": None,
            "mount": None,
        }
        assert meta["start_ts"] < truth["onset"] < meta["start_ts"] + 300
    else:
        assert truth["family"] is None and truth["detail"]["control_for"] == "underfilled_batches"
    kinds = report.counts
    assert kinds["job"] == 1 and kinds["process"] >= 2 and kinds["log"] >= 5


def test_scenario_records_are_consistent(runs: dict[tuple[str, int], SimRun]) -> None:
    for (name, seed), run in runs.items():
        job = next(r for r in run.discrete if r["type"] == "job")
        cfg = job["config"]
        assert job["kind"] == "inference"
        slots = cfg["max_num_seqs"]
        assert 16 <= slots <= 256 and cfg["tensor_parallel_size"] in (1, 2, 4, 8)
        procs = [r for r in run.discrete if r["type"] == "process"]
        servers = [p for p in procs if str(p.get("cmd", "")).startswith("vllm serve")]
        assert len(servers) == cfg["replicas"]
        for p in servers:
            assert f"--max-num-seqs {slots} " in p["cmd"]
            assert f"--tensor-parallel-size {cfg['tensor_parallel_size']} " in p["cmd"]
        gpu_procs = [p for p in procs if "gpu" in p]
        assert len(gpu_procs) == job["world_size"] == cfg["replicas"] * cfg["tensor_parallel_size"]
        for _, slot_values in _series(run, signals.INFERENCE_MAX_NUM_SEQS):
            assert (_served(slot_values) == slots).all()
        for ident, running in _series(run, signals.VLLM_NUM_REQUESTS_RUNNING):
            assert ident["job"] == job["job"] and ident["labels"]["model_name"] == cfg["model"]
            assert (_served(running) <= slots).all(), (name, seed)
        usage = [signals.VLLM_KV_CACHE_USAGE_PERC, signals.VLLM_GPU_CACHE_USAGE_PERC]
        present = [u for u in usage if _series(run, u)]
        assert len(present) == 1  # one vLLM version per endpoint
        for _, kv in _series(run, present[0]):
            assert ((_served(kv) >= 0) & (_served(kv) <= 1)).all()
        for counter in VLLM_COUNTERS:
            for _, values in _series(run, counter):
                assert (np.diff(_served(values)) >= 0).all(), (name, seed, counter)
        # GPU signals of the endpoint's GPUs carry the job and agree with the engine: tensor
        # pipes never more active than the engine; FB holds vLLM's 90% preallocation.
        eng = run.series(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE, job=job["job"])
        ten = run.series(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, job=job["job"])
        fb = run.series(signals.DCGM_FI_DEV_FB_USED, job=job["job"])
        assert len(eng) == job["world_size"]
        for (_, e), (_, t), (_, f) in zip(eng, ten, fb, strict=True):
            ok = ~np.isnan(e)
            assert (t[ok] <= e[ok] + 1e-9).all()
            assert f[ok][-1] > 0.85 * 81559


def _mean_over(runs: dict[tuple[str, int], SimRun], name: str, key: str) -> list[float]:
    return [runs[(name, s)].meta["inference"][key] for s in SEEDS]


def test_underfilled_vs_saturated_vs_healthy(runs: dict[tuple[str, int], SimRun]) -> None:
    """The twins differ where the detector looks: batch occupancy, KV usage, prefill share."""
    for seed in SEEDS:
        u = runs[("underfilled_batches", seed)]
        sat = runs[("saturated_inference", seed)]
        occ: dict[str, float] = {}
        for label, run in (("u", u), ("s", sat)):
            job = next(r for r in run.discrete if r["type"] == "job")
            slots = job["config"]["max_num_seqs"]
            running = np.concatenate(
                [_served(v) for _, v in _series(run, signals.VLLM_NUM_REQUESTS_RUNNING)]
            )
            occ[label] = float(running.mean()) / slots
        assert occ["u"] < 0.15 and occ["s"] > 0.8 and occ["u"] < occ["s"] / 5
        um, sm = u.meta["inference"], sat.meta["inference"]
        assert um["kv_usage_p95"] < 0.6 < 0.9 < sm["kv_usage_p95"]
        assert um["prefill_share_of_busy"] > sm["prefill_share_of_busy"]
        assert um["prefill_share_of_request_time"] > 5 * sm["prefill_share_of_request_time"]
        # The underfilled endpoint meets its SLA; the saturated one queues far past it.
        assert um["ttft_p95_s"] <= um["sla_ttft_p95_s"]
        assert sm["ttft_p95_s"] > sm["sla_ttft_p95_s"]
        waiting = np.concatenate(
            [_served(v) for _, v in _series(sat, signals.VLLM_NUM_REQUESTS_WAITING)]
        )
        assert waiting.max() > 20
        # Prefix caching is off in the underfilled config, so its counters stay at zero.
        for _, hits in _series(u, signals.VLLM_PREFIX_CACHE_QUERIES_TOTAL):
            assert np.nanmax(hits) == 0
    # The healthy control is busy at peak but not overloaded.
    for seed in SEEDS:
        h = runs[("healthy_inference", seed)].meta["inference"]
        assert h["running_over_slots_p95"] > 0.4 and h["running_over_slots_mean"] > 0.2
        assert h["ttft_p95_s"] < 5.0 and h["kv_usage_p95"] > 0.3


def test_vllm_log_lines_follow_the_real_format(runs: dict[tuple[str, int], SimRun]) -> None:
    new = re.compile(
        r"^\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[loggers\.py:\d+\] Engine 000: "
        r"Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: [\d.]+ tokens/s, "
        r"Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: [\d.]+%, "
        r"Prefix cache hit rate: [\d.]+%$"
    )
    old = re.compile(
        r"^INFO \d\d-\d\d \d\d:\d\d:\d\d \[loggers\.py:\d+\] Avg prompt throughput: [\d.]+ "
        r"tokens/s, Avg generation throughput: [\d.]+ tokens/s, Running: \d+ reqs, Waiting: \d+ "
        r"reqs, GPU KV cache usage: [\d.]+%, Prefix cache hit rate: [\d.]+%$"
    )
    versions = set()
    for run in runs.values():
        version = next(r for r in run.discrete if r["type"] == "job")["config"]["vllm_version"]
        versions.add(version)
        stats = [
            r["line"] for r in run.discrete if r["type"] == "log" and "Avg prompt" in r["line"]
        ]
        assert stats
        pattern = old if version.startswith("0.8") else new
        assert all(pattern.match(line) for line in stats), stats[0]
        sizes = [r["line"] for r in run.discrete if "GPU KV cache size:" in r.get("line", "")]
        assert sizes and re.search(r"GPU KV cache size: [\d,]+ tokens$", sizes[0])
    assert len(versions) == 2  # both the old and the new vLLM appear across seeds


def test_scenarios_are_randomised_and_deterministic(tmp_path: Path) -> None:
    seen = set()
    for seed in range(6):
        run = simulate("underfilled_batches", seed=seed, duration_s=200)
        cfg = next(r for r in run.discrete if r["type"] == "job")["config"]
        seen.add((cfg["model"], cfg["max_num_seqs"], cfg["replicas"] * cfg["tensor_parallel_size"]))
    assert len(seen) >= 4
    a = simulate("healthy_inference", seed=7, duration_s=200)
    b = simulate("healthy_inference", seed=7, duration_s=200)
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write(pa)
    b.write(pb)
    assert hashlib.sha256(pa.read_bytes()).digest() == hashlib.sha256(pb.read_bytes()).digest()


def test_caller_fixes_nodes_and_gpus() -> None:
    run = simulate("healthy_inference", seed=3, duration_s=200, nodes=2, gpus_per_node=4)
    job = next(r for r in run.discrete if r["type"] == "job")
    assert len(job["nodes"]) == 2 and job["world_size"] == 8
    gpus = {i["gpu"] for i, _ in run.series(signals.DCGM_FI_DEV_POWER_USAGE)}
    assert len(gpus) == 8


@pytest.mark.parametrize("duration", [1.0, 3.0, 90.0])
def test_short_runs_stay_inside_the_window(duration: float) -> None:
    for name in INFERENCE:
        run = simulate(name, seed=2, duration_s=duration)
        ts = [r["ts"] for r in run.discrete]
        assert run.start_ts <= min(ts) and max(ts) < run.start_ts + duration
        assert _series(run, signals.VLLM_NUM_REQUESTS_RUNNING)  # at least one scrape


def test_engine_rejects_an_empty_run() -> None:
    cfg = EngineConfig(LLAMA_8B, H100_SXM, 1, 64, 8192, True)
    with pytest.raises(ValueError, match="at least one server and one second"):
        simulate_engine(cfg, [_workload(1.0)], 0, np.random.default_rng(1))
