"""More detectors on hand-built windows: checkpoint stall vs fast local checkpoints, underfilled
vs saturated inference, input starvation, collective hang, fabric, and missing sources."""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.rows import JobMeta, SeriesData, SeriesInfo
from engine.detectors import (
    detect_checkpoint_stall,
    detect_collective_hang,
    detect_fabric_degraded,
    detect_input_starvation,
    detect_slow_rank,
    detect_underfilled_batches,
)
from engine.tests.synthetic import T0, healthy_sync, window
from engine.verdicts import build_verdicts
from engine.window import Checkpoint, JobWindow, missing_sources

N = 600


def _storage(node: str, mount: str, latency: np.ndarray, written: np.ndarray) -> list[SeriesData]:
    ts = T0 + np.arange(N, dtype=float)
    labels = (("fstype", "nfs4"), ("mount", mount))
    return [
        SeriesData(
            SeriesInfo(signals.STORAGE_WRITE_MS, node, "", None, None, "", None, labels=labels),
            ts,
            latency,
        ),
        SeriesData(
            SeriesInfo(signals.STORAGE_WRITE_BYTES, node, "", None, None, "", None, labels=labels),
            ts,
            np.cumsum(written),
        ),
    ]


def _checkpoint_window(stall_s: int, slow_storage: bool) -> JobWindow:
    rng = np.random.default_rng(7)
    w = window(n=N, sync=healthy_sync(rng, n=N))
    saves = [100, 300, 500]
    launches = w.proc[signals.CUDA_LAUNCHES]
    latency = 2.0 + rng.random(N)
    written = np.full(N, 1e5)
    for s in saves:
        launches[:, s : s + stall_s] = 0  # every rank stops launching during the save
        latency[s : s + stall_s] = 1500.0 if slow_storage else 4.0
        written[s : s + stall_s] = 5e7
    w.checkpoints = [Checkpoint(T0 + s, T0 + s + stall_s, "/shared/ckpt/run1", s) for s in saves]
    w.node_series = {"n0": _storage("n0", "/shared", latency, written)}
    return w


def test_checkpoint_stall_on_slow_shared_mount() -> None:
    found = detect_checkpoint_stall(_checkpoint_window(60, slow_storage=True))
    assert len(found) == 1
    f = found[0]
    assert f.category == "infrastructure" and f.subject["mount"] == "/shared"
    assert abs(f.interval[0] - (T0 + 100)) <= 5
    assert [(c.check, c.result) for c in f.cleared] == [("storage", "implicated")]


def test_fast_local_checkpoint_is_not_a_stall() -> None:
    # Short pauses aligned with the saves, storage latency barely moves: no verdict.
    assert detect_checkpoint_stall(_checkpoint_window(3, slow_storage=False)) == []
    # Even long pauses are not blamed on a mount whose latency stayed normal.
    assert detect_checkpoint_stall(_checkpoint_window(60, slow_storage=False)) == []


def _inference_window(running: float, slots: float, kv: float, waiting: float) -> JobWindow:
    w = window(world=2, n=N)
    w.meta = JobMeta(job="J1", kind="inference")
    rng = np.random.default_rng(8)
    ts = T0 + np.arange(N, dtype=float)

    def s(name: str, values: np.ndarray) -> SeriesData:
        return SeriesData(SeriesInfo(name, "n0", "", None, 4242, "J1", None), ts, values)

    w.inference = [
        s(signals.VLLM_NUM_REQUESTS_RUNNING, np.clip(rng.normal(running, 1.0, N), 0, None)),
        s(signals.INFERENCE_MAX_NUM_SEQS, np.full(N, slots)),
        s(signals.VLLM_KV_CACHE_USAGE_PERC, np.clip(rng.normal(kv, 0.02, N), 0, 1)),
        s(signals.VLLM_NUM_REQUESTS_WAITING, np.full(N, waiting)),
        s(signals.VLLM_REQUEST_PREFILL_TIME_SECONDS_SUM, np.linspace(0, 300, N)),
        s(signals.VLLM_REQUEST_DECODE_TIME_SECONDS_SUM, np.linspace(0, 200, N)),
    ]
    return w


def test_underfilled_vs_saturated_inference() -> None:
    found = detect_underfilled_batches(_inference_window(3, 32, 0.25, 0))
    assert len(found) == 1 and found[0].category == "job"
    assert found[0].details["gpus_needed"] == 1  # 2 GPUs at ~13% occupancy fit on one
    assert detect_underfilled_batches(_inference_window(30, 32, 0.95, 40)) == []  # saturated
    assert detect_underfilled_batches(_inference_window(24, 32, 0.6, 0)) == []  # healthy


def test_input_starvation_needs_idle_gpus_and_saturated_workers() -> None:
    n = 300
    eng = np.full((8, n), 0.97)
    eng[:, 100:] = 0.55  # GPUs idle 45% of the time from t=100 s
    w = window(n=n, gpu={signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE: eng})
    w.worker_cpu = np.full((8, n), 0.6)
    w.worker_cpu[:, 100:] = 0.99
    found = detect_input_starvation(w)
    assert len(found) == 1 and abs(found[0].interval[0] - (T0 + 100)) <= 30
    w.worker_cpu = np.full((8, n), 0.5)  # idle GPUs but relaxed workers: something else
    assert detect_input_starvation(w) == []


def test_collective_hang_names_the_rank_that_never_arrived() -> None:
    rng = np.random.default_rng(9)
    w = window(n=N, sync=healthy_sync(rng, n=N))
    w.proc[signals.CUDA_LAUNCHES][:, 200:] = 0
    w.proc[signals.CUDA_SYNC_MS][:, 200:] = 1000.0  # blocked in the all-reduce …
    w.proc[signals.CUDA_SYNC_MS][5, 200:] = 0.0  # … except rank 5, busy in its own code
    found = detect_collective_hang(w)
    assert len(found) == 1 and found[0].subject["rank"] == 5
    assert found[0].interval[0] == T0 + 200
    healthy = window(n=N, sync=healthy_sync(rng, n=N))
    assert detect_collective_hang(healthy) == []


def test_collective_hang_bridges_a_collection_gap() -> None:
    rng = np.random.default_rng(13)
    w = window(n=N, sync=healthy_sync(rng, n=N))
    w.proc[signals.CUDA_LAUNCHES][:, 200:] = 0
    w.proc[signals.CUDA_SYNC_MS][:, 200:] = 1000.0
    w.proc[signals.CUDA_SYNC_MS][4, 200:] = 0.0
    for name in (signals.CUDA_LAUNCHES, signals.CUDA_SYNC_MS):
        w.proc[name][:, 230:236] = np.nan  # the agent lost six samples in the middle
    found = detect_collective_hang(w)
    assert len(found) == 1 and found[0].interval[0] == T0 + 200 and found[0].subject["rank"] == 4


def test_collective_hang_without_ebpf_from_gpu_activity() -> None:
    rng = np.random.default_rng(12)
    tensor = 0.45 + rng.normal(0, 0.01, (8, N))
    eng = np.full((8, N), 0.97)
    tensor[:, 200:] = 0.0  # nobody computes …
    eng[:, 200:] = 1.0  # … 7 ranks spin in the NCCL kernel …
    eng[2, 200:] = 0.0  # … rank 2's GPU is idle: it never reached the collective
    w = window(
        n=N,
        gpu={
            signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: tensor,
            signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE: eng,
        },
    )
    found = detect_collective_hang(w)
    assert len(found) == 1 and found[0].subject["rank"] == 2


def _ib(node: str, values: np.ndarray) -> SeriesData:
    labels = (("device", "mlx5_3"), ("port", "1"))
    return SeriesData(
        SeriesInfo(signals.IB_SYMBOL_ERROR, node, "", None, None, "", None, labels=labels),
        T0 + np.arange(N, dtype=float),
        values,
    )


def test_fabric_degraded_needs_rising_errors_and_slower_collectives() -> None:
    rng = np.random.default_rng(10)
    errors = np.concatenate([np.zeros(300), np.cumsum(rng.poisson(3, 300))])
    slow = healthy_sync(rng, n=N)
    slow[:, 300:] *= 2.0
    w = window(n=N, sync=slow)
    w.node_series = {"n0": [_ib("n0", errors)], "n1": [_ib("n1", np.zeros(N))]}
    found = detect_fabric_degraded(w)
    assert len(found) == 1 and found[0].subject["node"] == "n0"
    # Same errors, collectives unaffected: no verdict. A flat old count: no verdict.
    w2 = window(n=N, sync=healthy_sync(rng, n=N))
    w2.node_series = {"n0": [_ib("n0", errors)], "n1": [_ib("n1", np.zeros(N))]}
    assert detect_fabric_degraded(w2) == []
    w.node_series = {"n0": [_ib("n0", np.full(N, 5000.0))], "n1": [_ib("n1", np.zeros(N))]}
    assert detect_fabric_degraded(w) == []


def test_straggler_without_ebpf_falls_back_to_tensor_activity_and_says_so() -> None:
    rng = np.random.default_rng(11)
    tensor = 0.5 + rng.normal(0, 0.01, (8, 300))
    tensor[:, 100:] = 0.35 + rng.normal(0, 0.01, (8, 200))  # the others wait …
    tensor[6, 100:] = 0.5  # … for rank 6
    w = window(gpu={signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: tensor})
    w.missing_sources = missing_sources(w)
    assert "ebpf" in w.missing_sources
    found = detect_slow_rank(w)
    assert len(found) == 1 and found[0].subject["rank"] == 6
    verdict = build_verdicts(found, w)[0]
    assert "Could not see" in verdict["explanation"] and "eBPF" in verdict["explanation"]


def test_checkpoint_stall_bridges_a_collection_gap_over_the_save_line() -> None:
    """The agent lost samples just as a save began (its one log line falls in the gap): the
    stall is still found, starting on the first measured idle sample."""
    w = _checkpoint_window(40, slow_storage=True)
    launches = w.proc[signals.CUDA_LAUNCHES]
    launches[:, 97:104] = np.nan  # no rank reported from 97 s to 103 s
    w.checkpoints = [Checkpoint(c.begin, c.begin, c.path, c.step) for c in w.checkpoints]
    found = detect_checkpoint_stall(w)
    assert len(found) == 1
    first = found[0].evidence[0]
    assert first.interval[0] == T0 + 104  # measured idleness starts the stall, not the gap
    assert isinstance(first.observed, float)
    assert 35_000 <= first.observed <= 40_000  # ms: the rest of the 40 s save
