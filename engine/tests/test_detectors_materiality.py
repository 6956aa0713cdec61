"""Materiality: every slowdown verdict states its impact (slowdown %, GPU-hours lost, backed by
evidence), and below the floor set from healthy jitter there is no verdict."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract import signals
from engine.detectors import (
    detect_sequence_imbalance,
    detect_slow_rank,
    detect_underfilled_batches,
    run_detectors,
)
from engine.detectors.common import (
    HEALTHY_JITTER_SD,
    MATERIAL_MIN_SLOWDOWN_PCT,
    is_material,
    jitter_wait,
    state_impact,
)
from engine.detectors.stragglers import imbalance_stats
from engine.findings import Finding
from engine.store import TraceStore
from engine.tests.synthetic import window
from engine.tests.test_detectors_more import (
    _checkpoint_window,
    _ib,
    _inference_window,
)
from engine.verdicts import build_verdicts
from engine.window import JobWindow, build_job_window
from simulator import simulate


def _sync_from_compute(compute: np.ndarray) -> np.ndarray:
    """Per-sample synchronize time (ms) of ranks computing `compute` seconds of each 1 s
    sample and waiting in the all-reduce for the rest."""
    sync_ms: np.ndarray = 1000.0 * (1.0 - np.clip(compute, 0.0, 0.99))
    return sync_ms


def _jittery(sd: float, world: int = 8, n: int = 300, seed: int = 0) -> np.ndarray:
    """Balanced work, each rank's compute varying `sd` (relative) sample to sample."""
    rng = np.random.default_rng(seed)
    return 0.8 * (1.0 + rng.normal(0.0, sd, (world, n)))


def _cited(v: Mapping[str, Any]) -> set[str]:
    return set(re.findall(r"\be\d+\b", v["summary"]))


def _assert_states_impact(f: Finding, w: JobWindow, *, slowdown: bool = True) -> None:
    v = build_verdicts([f], w)[0]
    imp = v["impact"]
    assert imp["gpu_hours_lost"] is not None and imp["gpu_hours_lost"] > 0
    if slowdown:
        assert imp["slowdown_pct"] is not None and imp["slowdown_pct"] >= MATERIAL_MIN_SLOWDOWN_PCT
    assert "Impact:" in v["summary"]
    ids = {e["id"] for e in v["evidence"]}
    assert _cited(v) <= ids  # every id the summary cites exists
    by_signal = {e["signal"]: e for e in v["evidence"]}
    assert by_signal["impact: GPU-hours lost"]["observed"] == pytest.approx(imp["gpu_hours_lost"])
    assert f"{imp['gpu_hours_lost']:.2f} GPU-hours lost" in v["summary"]
    if slowdown:
        e = by_signal["impact: slowdown"]
        assert e["observed"] == pytest.approx(imp["slowdown_pct"])
        assert e["baseline"] == MATERIAL_MIN_SLOWDOWN_PCT
        assert f"{imp['slowdown_pct']:.1f}% slower" in v["summary"]


def test_jitter_wait_grows_with_world_size() -> None:
    waits = [jitter_wait(n) for n in (2, 8, 64)]
    assert waits == sorted(waits)
    assert 0.05 < jitter_wait(8) < 0.065 and 0.09 < jitter_wait(64) < 0.10
    assert jitter_wait(1) == 0.0


def test_healthy_jitter_alone_gives_no_verdict() -> None:
    """A few percent of step-to-step jitter makes ranks wait a few percent: no verdict."""
    for sd in (0.015, 0.03, 0.04):
        w = window(sync=_sync_from_compute(_jittery(sd)))
        assert run_detectors(w) == [], sd


def test_rotating_waiting_that_passes_the_statistics_but_not_the_floor_is_no_verdict() -> None:
    """Rank dispersion of ~6% rotating between ranks clears the statistical tests, but at 8
    ranks most of the waiting is what jitter costs anyway: immaterial, no verdict."""
    w = window(sync=_sync_from_compute(_jittery(0.075)))
    found = detect_sequence_imbalance(w)
    assert len(found) == 1  # the statistics alone would call it an imbalance …
    f = found[0]
    assert f.slowdown_pct is not None and f.slowdown_pct < MATERIAL_MIN_SLOWDOWN_PCT
    assert not is_material(f)
    assert run_detectors(w) == []  # … the floor keeps it out


def test_material_imbalance_states_its_impact_beyond_jitter() -> None:
    w = window(sync=_sync_from_compute(_jittery(0.15, seed=1)))
    found = run_detectors(w)
    assert [f.family for f in found] == ["sequence_imbalance"]
    f = found[0]
    waited = next(e for e in f.evidence if e.signal == "waiting share of ranks").observed
    jitter = next(e for e in f.evidence if e.signal == "waiting share from healthy jitter")
    assert jitter.observed == pytest.approx(round(jitter_wait(8), 4))
    assert jitter.baseline == HEALTHY_JITTER_SD
    assert isinstance(waited, float)
    # The slowdown is the waiting beyond jitter, relative to the time spent computing.
    expected = 100.0 * (waited - jitter_wait(8)) / (1.0 - waited)
    assert f.slowdown_pct == pytest.approx(expected, abs=0.15)
    _assert_states_impact(f, w)


def _persistent(lead: float) -> JobWindow:
    compute = _jittery(0.005, seed=2)
    compute[3, 100:] *= 1.0 + lead  # rank 3 computes `lead` longer from t=100 s
    return window(sync=_sync_from_compute(compute))


def test_slow_rank_below_the_floor_is_no_verdict_above_it_states_impact() -> None:
    small = _persistent(0.04)
    found = detect_slow_rank(small)
    assert len(found) == 1 and found[0].slowdown_pct is not None
    assert found[0].slowdown_pct < MATERIAL_MIN_SLOWDOWN_PCT  # statistically clear, immaterial
    assert run_detectors(small) == []
    big = _persistent(0.12)
    found = run_detectors(big)
    assert [f.family for f in found] == ["slow_rank"] and found[0].subject["rank"] == 3
    _assert_states_impact(found[0], big)


def test_checkpoint_stall_states_impact() -> None:
    w = _checkpoint_window(40, slow_storage=True)
    found = run_detectors(w)
    assert [f.family for f in found] == ["checkpoint_stall"]
    _assert_states_impact(found[0], w)


def test_input_starvation_states_impact() -> None:
    n = 300
    eng = np.full((8, n), 0.97)
    eng[:, 100:] = 0.55
    w = window(n=n, gpu={signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE: eng})
    w.worker_cpu = np.full((8, n), 0.6)
    w.worker_cpu[:, 100:] = 0.99
    found = run_detectors(w)
    assert [f.family for f in found] == ["input_starvation"]
    _assert_states_impact(found[0], w)


def test_fabric_degraded_states_the_jobs_slowdown_not_the_collectives() -> None:
    n = 600
    rng = np.random.default_rng(10)
    errors = np.concatenate([np.zeros(300), np.cumsum(rng.poisson(3, 300))])
    sync = 150.0 + rng.normal(0, 15.0, (8, n))
    sync[:, 300:] *= 2.0  # collectives take twice as long: 150 → 300 ms of each second
    w = window(n=n, sync=sync)
    w.node_series = {"n0": [_ib("n0", errors)], "n1": [_ib("n1", np.zeros(n))]}
    found = run_detectors(w)
    assert [f.family for f in found] == ["fabric_degraded"]
    f = found[0]
    assert f.details["collective_slowdown_pct"] == pytest.approx(100.0, abs=3.0)
    # The job computed 85% of each second before and 70% after: 21% slower.
    assert f.slowdown_pct == pytest.approx(100.0 * (0.85 / 0.70 - 1.0), abs=1.5)
    _assert_states_impact(f, w)


def test_hang_and_underfilled_state_gpu_time_lost() -> None:
    n = 600
    rng = np.random.default_rng(9)
    w = window(n=n, sync=150.0 + rng.normal(0, 15.0, (8, n)))
    w.proc[signals.CUDA_LAUNCHES][:, 200:] = 0
    w.proc[signals.CUDA_SYNC_MS][:, 200:] = 1000.0
    w.proc[signals.CUDA_SYNC_MS][5, 200:] = 0.0
    found = run_detectors(w)
    assert [f.family for f in found] == ["collective_hang"]
    _assert_states_impact(found[0], w, slowdown=False)
    assert "made no progress" in found[0].summary
    inf = _inference_window(3, 32, 0.25, 0)
    found = run_detectors(inf)
    assert [f.family for f in found] == ["underfilled_batches"]
    _assert_states_impact(found[0], inf, slowdown=False)
    assert "that 1 could carry" in found[0].summary


def test_underfilled_endpoint_with_nothing_to_save_is_no_verdict() -> None:
    one = _inference_window(3, 32, 0.25, 0)
    one.ranks = one.ranks[:1]  # a single GPU: no replica to consolidate

    found = detect_underfilled_batches(one)
    assert len(found) == 1 and found[0].gpu_hours_lost == 0  # underfilled, but …
    assert run_detectors(one) == []  # … nothing to save: immaterial


def test_impact_is_stated_once() -> None:
    w = _checkpoint_window(40, slow_storage=True)
    f = run_detectors(w)[0]

    n_evidence, summary = len(f.evidence), f.summary
    state_impact(f, w)
    assert len(f.evidence) == n_evidence and f.summary == summary


def test_simulated_healthy_job_waits_a_few_percent_and_gets_no_verdict(tmp_path: Path) -> None:
    """The simulator's healthy control jitters like a real all-reduce job: its ranks wait a
    few percent of every step for the slowest one, and that is no verdict."""

    run = simulate("healthy_training", seed=13, duration_s=420, nodes=2, gpus_per_node=4)
    path = tmp_path / "healthy.jsonl"
    run.write(path)
    store = TraceStore.from_trace(str(path))
    primary = next(j for j, role in run.meta["jobs"].items() if role == "primary")
    w = build_job_window(store, primary)
    im = imbalance_stats(w)
    assert im is not None and 0.02 < im.wait < jitter_wait(w.world) + 0.02
    assert run_detectors(w) == []
