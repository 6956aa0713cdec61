"""The job's grid spacing when the agent keyed (almost) every GPU sample with a pid."""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.rows import SeriesData, SeriesInfo
from engine.window import job_sampling_interval

T0 = 1_767_600_000.0


def _series(name: str, ts: np.ndarray, *, gpu: str, pid: int | None) -> SeriesData:
    return SeriesData(SeriesInfo(name, "n0", gpu, 0, pid, "", None), ts, np.ones(len(ts)))


def test_untagged_gpu_series_set_the_cadence_when_there_are_enough() -> None:
    one_hz = T0 + np.arange(300.0)
    five_s = T0 + 5.0 * np.arange(60)
    series = [
        _series(signals.DCGM_FI_DEV_GPU_UTIL, one_hz, gpu="GPU-a", pid=None),
        _series(signals.CUDA_SYNC_MS, five_s, gpu="GPU-a", pid=77),
    ]
    assert job_sampling_interval(series) == 1.0


def test_a_handful_of_untagged_samples_does_not_stretch_the_grid() -> None:
    # 3 samples before the job's pid was known, 150 s apart; then 1 Hz samples keyed with it.
    before = T0 + np.array([0.0, 150.0, 300.0])
    tagged = T0 + 300.0 + np.arange(400.0)
    series = [
        _series(signals.DCGM_FI_DEV_GPU_UTIL, before, gpu="GPU-a", pid=None),
        _series(signals.DCGM_FI_DEV_GPU_UTIL, tagged, gpu="GPU-a", pid=77),
    ]
    assert job_sampling_interval(series) == 1.0


def test_no_gpu_series_falls_back_to_whatever_was_sampled() -> None:
    host = T0 + 2.0 * np.arange(50)
    assert job_sampling_interval([_series(signals.HOST_CPU_UTIL, host, gpu="", pid=5)]) == 2.0
