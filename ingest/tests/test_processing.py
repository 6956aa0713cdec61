"""Validation as plain functions: every bad batch is refused whole, naming the problem."""

from __future__ import annotations

import time

import numpy as np
import pytest

from agent import signals
from ingest.processing import BatchRejected, Limits, decode_batch
from ingest.tests.helpers import gpu_batch

LIMITS = Limits()


def reject(batch: object, limits: Limits = LIMITS) -> BatchRejected:
    with pytest.raises(BatchRejected) as info:
        decode_batch(batch, limits)
    return info.value


def test_valid_batch_decodes_exactly() -> None:
    start = float(int(time.time()) - 20)
    decoded = decode_batch(gpu_batch(gpus=2, seconds=10, start=start), LIMITS)
    assert decoded.sample_count == 2 * 2 * 10
    assert [k.gpu_index for k in decoded.series] == [0, 0, 1, 1]
    assert decoded.series[0].name == signals.DCGM_FI_DEV_GPU_UTIL
    assert decoded.series[2].job == "job-1"
    np.testing.assert_array_equal(decoded.ts_ms[:10], (start + np.arange(10)) * 1000)
    np.testing.assert_array_equal(decoded.values[20:30], 1000 + np.arange(10))


def test_nan_and_inf_are_rejected_naming_the_series() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        batch = gpu_batch()
        batch.values[13] = bad
        err = reject(batch)
        assert err.reason == "non_finite"
        assert "series 1" in err.message and signals.DCGM_FI_DEV_POWER_USAGE in err.message


def test_far_future_and_too_old_are_rejected() -> None:
    err = reject(gpu_batch(start=time.time() + 3600))
    assert err.reason == "out_of_window" and "outside the accepted window" in err.message
    err = reject(gpu_batch(start=time.time() - 30 * 86400))
    assert err.reason == "out_of_window"


def test_future_log_line_is_rejected() -> None:
    log = {"type": "log", "ts": time.time() + 7200, "line": "hello", "job": "job-1"}
    err = reject(gpu_batch(extra_records=[log]))
    assert err.reason == "out_of_window" and "log 0" in err.message


def test_malformed_batches_are_rejected() -> None:
    batch = gpu_batch()
    batch.series[0].name = 999
    assert "outside the dictionary" in reject(batch).message
    batch = gpu_batch()
    batch.sample_counts[0] += 1
    assert "add up to" in reject(batch).message
    batch = gpu_batch()
    batch.strings[0] = "x"
    assert "strings[0]" in reject(batch).message
    batch = gpu_batch()
    batch.agent_id = ""
    assert "agent_id" in reject(batch).message
    batch = gpu_batch(extra_records=[{"type": "job", "ts": time.time(), "job": "j", "state": "x"}])
    batch.jobs[0].state = "exploded"
    assert "state 'exploded'" in reject(batch).message


def test_oversized_batches_are_rejected() -> None:
    batch = gpu_batch(gpus=4, seconds=60)
    err = reject(batch, Limits(max_batch_bytes=1024))
    assert err.reason == "oversized" and "over the limit of 1024" in err.message
    err = reject(batch, Limits(max_samples=100))
    assert err.reason == "oversized" and "samples" in err.message
    long_line = {"type": "log", "ts": time.time(), "line": "x" * 20000}
    assert reject(gpu_batch(extra_records=[long_line])).reason == "oversized"


def test_a_batch_spanning_more_than_an_hour_is_rejected() -> None:
    err = reject(gpu_batch(seconds=3, start=time.time() - 7200), Limits(max_span_ms=1000))
    assert err.reason == "span"
