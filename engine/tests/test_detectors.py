"""Each detector on hand-built windows: its positive case, its twin and a healthy window."""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.rows import EventRow, SeriesData
from engine.clearance import hardware_clearance
from engine.detectors import (
    detect_gpu_degrading,
    detect_hardware_fault,
    detect_no_learning,
    detect_numerical_divergence,
    detect_sequence_imbalance,
    detect_slow_rank,
    run_detectors,
)
from engine.findings import INFRASTRUCTURE
from engine.tests.synthetic import (
    T0,
    counter,
    finding,
    gpu_uuid,
    healthy_sync,
    steps,
    window,
)
from engine.window import GpuWindow


def test_healthy_window_yields_no_finding() -> None:
    rng = np.random.default_rng(1)
    loss = 10.0 * np.exp(-np.arange(30) / 10) + 2.0
    w = window(sync=healthy_sync(rng), steps=steps(loss))
    assert run_detectors(w) == []


def test_persistent_straggler_is_slow_rank_with_throttle_cause() -> None:
    rng = np.random.default_rng(2)
    sync = healthy_sync(rng)
    sync[:, 100:] += 200.0  # everyone waits for rank 3 from t=100 s …
    sync[3, 100:] = 60.0 + rng.normal(0, 10.0, 200)  # … which hardly waits at all
    bits = np.zeros((8, 300))
    bits[3, 100:] = signals.THROTTLE_HW_SLOWDOWN
    clock = np.full((8, 300), 1980.0)
    clock[3, 100:] = 1200.0
    w = window(
        sync=sync,
        gpu={signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: bits, signals.DCGM_FI_DEV_SM_CLOCK: clock},
    )
    found = detect_slow_rank(w)
    assert len(found) == 1
    f = found[0]
    assert f.subject["rank"] == 3 and f.subject["gpu"] == gpu_uuid(3)
    assert f.details["cause"] == "clock_throttle"
    assert abs(f.interval[0] - (T0 + 100)) <= 30  # onset located within 30 s
    assert detect_sequence_imbalance(w) == []  # the twin does not fire


def test_rotating_straggler_is_sequence_imbalance_not_slow_rank() -> None:
    rng = np.random.default_rng(3)
    sync = 300.0 + rng.normal(0, 15.0, (8, 300))
    slowest = rng.integers(0, 8, 300)  # a different rank holds the others back each sample
    sync[slowest, np.arange(300)] = 40.0
    w = window(sync=sync)
    assert detect_slow_rank(w) == []
    found = detect_sequence_imbalance(w)
    assert len(found) == 1 and found[0].category == "job"


def _divergent_loss() -> np.ndarray:
    loss = 8.0 * np.exp(-np.arange(40) / 8) + 2.5
    loss[25:] = loss[24] * np.exp(np.arange(15) / 6)  # drifts up, then explodes
    loss[-3:] = np.nan
    return loss


def test_divergence_on_clean_hardware_is_numerical_divergence() -> None:
    w = window(steps=steps(_divergent_loss()))
    found = detect_numerical_divergence(w)
    assert len(found) == 1 and found[0].family == "numerical_divergence"
    assert detect_hardware_fault(w) == []


def test_a_non_finite_loss_is_a_divergence_from_the_second_logged_line() -> None:
    # a job logging every 40 s prints its first NaN on its 3rd line: no 5-line wait for it
    found = detect_numerical_divergence(window(steps=steps(np.array([3.1, 3.0, np.nan]))))
    assert [f.family for f in found] == ["numerical_divergence"]
    assert found[0].title == "Training diverged: the loss went non-finite"
    assert detect_numerical_divergence(window(steps=steps(np.array([np.nan, 3.0])))) == []
    # a loss that doubles its low still needs a low worth the name: 5 logged losses
    assert detect_numerical_divergence(window(steps=steps(np.array([3.1, 3.0, 7.0])))) == []
    rose = detect_numerical_divergence(window(steps=steps(np.array([3.1, 3.0, 2.9, 2.9, 7.0]))))
    assert [f.title for f in rose] == ["Training diverged: the loss exploded"]


def test_divergence_after_xid_on_job_gpu_is_hardware_fault() -> None:
    xid = EventRow(T0 + 200, signals.EVENT_XID, "n0", gpu_uuid(1), 1, "", 94.0, "NVRM: Xid 94")
    w = window(steps=steps(_divergent_loss()), events=[xid])
    assert detect_numerical_divergence(w) == []
    found = run_detectors(w)
    assert [f.family for f in found] == ["hardware_fault"]
    assert found[0].subject["gpu"] == gpu_uuid(1) and found[0].subject["rank"] == 1


def test_xid_on_another_jobs_gpu_is_not_this_jobs_fault() -> None:
    xid = EventRow(T0 + 200, signals.EVENT_XID, "n0", gpu_uuid(99), 3, "", 79.0, "NVRM: Xid 79")
    w = window(steps=steps(_divergent_loss()), events=[xid])
    assert detect_hardware_fault(w) == []


def test_no_learning_on_completed_flat_run_but_not_on_a_learning_run() -> None:
    flat = 10.8 + np.random.default_rng(4).normal(0, 0.01, 40)
    assert detect_no_learning(window(steps=steps(flat), state="completed"))
    learning = 8.0 * np.exp(-np.arange(40) / 10) + 2.0
    assert detect_no_learning(window(steps=steps(learning), state="completed")) == []
    zero_lr = 8.0 * np.exp(-np.arange(40) / 10) + 2.0
    assert detect_no_learning(window(steps=steps(zero_lr, lr=0.0), state="completed"))
    assert detect_no_learning(window(steps=steps(flat), state="running")) == []


def _gpu_window(series: dict[str, SeriesData]) -> GpuWindow:
    return GpuWindow(gpu_uuid(0), "n0", 0, T0, T0 + 599, series, [])


def test_gpu_degrading_rising_counters_vs_flat_preexisting() -> None:
    n = 600
    sbe = np.cumsum(np.random.default_rng(5).poisson(np.linspace(0, 2, n)))  # rate rises
    remap = np.concatenate([np.full(300, 4), np.full(300, 6)])  # 2 new rows remapped
    g = gpu_uuid(0)
    rising = _gpu_window(
        {
            signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: counter(
                g, signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, sbe
            ),
            signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: counter(
                g, signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, remap
            ),
        }
    )
    found = detect_gpu_degrading(rising)
    assert len(found) == 1 and found[0].subject["gpu"] == g
    flat = _gpu_window(
        {
            signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: counter(
                g, signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, np.full(n, 3500)
            ),
            signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: counter(
                g, signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, np.full(n, 8)
            ),
        }
    )
    assert detect_gpu_degrading(flat) == []


def test_clearance_flat_preexisting_counter_is_clear() -> None:
    raw = {
        gpu_uuid(r): {
            signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS: counter(
                gpu_uuid(r),
                signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
                np.full(300, 3 if r == 2 else 0),
            ),
            signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: counter(
                gpu_uuid(r), signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, np.zeros(300)
            ),
        }
        for r in range(8)
    }
    f = finding("numerical_divergence")
    cleared = hardware_clearance(window(gpu_raw=raw), f)
    hw = next(c for c in cleared if c.check == "hardware")
    assert hw.result == "clear"
    remap = next(e for e in f.evidence if e.signal == signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS)
    assert remap.observed == 0 and remap.baseline == 3  # delta 0, pre-existing value as baseline
    assert set(hw.evidence) <= {e.id for e in f.evidence}


def test_clearance_rising_dbe_is_implicated() -> None:
    dbe = np.zeros(300)
    dbe[150:] = 1
    raw = {
        gpu_uuid(0): {
            signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: counter(
                gpu_uuid(0), signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, dbe
            )
        }
    }
    f = finding("numerical_divergence")
    cleared = hardware_clearance(window(gpu_raw=raw), f)
    assert next(c for c in cleared if c.check == "hardware").result == "implicated"


def _replays_rising_on(rank: int) -> dict[str, dict[str, SeriesData]]:
    replays = np.zeros(300)
    replays[100:] = np.arange(200) * 40.0  # a degraded link replaying steadily
    return {
        gpu_uuid(r): {
            signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER: counter(
                gpu_uuid(r),
                signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
                replays if r == rank else np.full(300, 26.0),
            )
        }
        for r in range(8)
    }


def test_clearance_corrected_errors_on_the_blamed_gpu_implicate_the_hardware() -> None:
    f = finding("slow_rank", INFRASTRUCTURE, gpu=gpu_uuid(5), rank=5)
    cleared = hardware_clearance(window(gpu_raw=_replays_rising_on(5)), f)
    hw = next(c for c in cleared if c.check == "hardware")
    assert hw.result == "implicated"
    assert signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER in hw.note


def test_clearance_corrected_errors_elsewhere_are_reported_not_implicating() -> None:
    f = finding("numerical_divergence")  # a job-category verdict blames no GPU
    cleared = hardware_clearance(window(gpu_raw=_replays_rising_on(5)), f)
    hw = next(c for c in cleared if c.check == "hardware")
    assert hw.result == "clear"
    assert "stayed flat" not in hw.note  # never claims flat counters when one rose
    assert signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER in hw.note
