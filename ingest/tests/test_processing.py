"""Validation as plain functions: a record that breaks a rule is refused alone (named, counted)
and the rest of its batch decodes; a batch is refused whole only when it is unusable as a
whole (not a Batch, sizes, counts, span, nothing usable in it)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from contract import limits, signals
from contract.wire.encode import BatchBuilder
from ingest import models
from ingest.processing import BatchRejected, DecodedBatch, Limits, decode_batch
from ingest.tests.helpers import gpu_batch

LIMITS = Limits()


def reject(batch: object, limits: Limits = LIMITS) -> BatchRejected:
    with pytest.raises(BatchRejected) as info:
        decode_batch(batch, limits)
    return info.value


def reasons(decoded: DecodedBatch) -> list[tuple[str, int, str]]:
    return [(r.kind, r.index, r.reason) for r in decoded.rejections]


def raw_batch(
    records: list[dict[str, object]], *, with_samples: bool = True
) -> Any:  # an ingest_pb2.Batch (generated classes are untyped)
    """A batch of GPU samples plus `records`, encoded WITHOUT the agent's cleaning: what an
    older or foreign agent could send."""
    builder = BatchBuilder("raw-agent", clean=False)
    now = time.time()
    if with_samples:
        for gpu in range(2):
            builder.add_samples(
                signals.DCGM_FI_DEV_GPU_UTIL,
                {signals.NODE: "n1", signals.GPU: f"GPU-{gpu}", signals.GPU_INDEX: gpu},
                now - 10 + np.arange(10.0),
                np.arange(10.0) + gpu * 100,
            )
    builder.extend(records)
    return builder.build(1)


def test_valid_batch_decodes_exactly() -> None:
    start = float(int(time.time()) - 20)
    decoded = decode_batch(gpu_batch(gpus=2, seconds=10, start=start), LIMITS)
    assert decoded.sample_count == 2 * 2 * 10
    assert [k.gpu_index for k in decoded.series] == [0, 0, 1, 1]
    assert decoded.series[0].name == signals.DCGM_FI_DEV_GPU_UTIL
    assert decoded.series[2].job == "job-1"
    np.testing.assert_array_equal(decoded.ts_ms[:10], (start + np.arange(10)) * 1000)
    np.testing.assert_array_equal(decoded.values[20:30], 1000 + np.arange(10))
    assert decoded.rejections == [] and decoded.rejected_records == 0


def test_non_finite_values_are_refused_alone_naming_the_series() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        batch = gpu_batch()
        batch.values[13] = bad
        decoded = decode_batch(batch, LIMITS)
        assert decoded.sample_count == 39 and decoded.rejected_samples == 1
        assert reasons(decoded) == [("samples", 1, "non_finite")]
        message = decoded.rejections[0].message
        assert "series 1" in message and signals.DCGM_FI_DEV_POWER_USAGE in message
        assert bad not in decoded.values.tolist()
        # The series keeps its other 9 samples, the others all 10.
        assert decoded.counts.tolist() == [10, 9, 10, 10]


def test_a_batch_wholly_outside_the_window_is_refused() -> None:
    err = reject(gpu_batch(start=time.time() + 3600))
    assert err.reason == "out_of_window" and "outside the accepted window" in err.message
    assert "no record of the batch is usable" in err.message
    err = reject(gpu_batch(start=time.time() - 30 * 86400))
    assert err.reason == "out_of_window"


def test_a_future_log_line_is_refused_alone() -> None:
    log = {"type": "log", "ts": time.time() + 7200, "line": "hello", "job": "job-1"}
    decoded = decode_batch(gpu_batch(extra_records=[log]), LIMITS)
    assert decoded.sample_count == 40 and decoded.logs == []
    assert reasons(decoded) == [("log", 0, "out_of_window")]
    assert "log 0" in decoded.rejections[0].message


def test_structurally_broken_batches_are_refused_whole() -> None:
    batch = gpu_batch()
    batch.sample_counts[0] += 1
    assert "add up to" in reject(batch).message
    batch = gpu_batch()
    batch.strings[0] = "x"
    assert "strings[0]" in reject(batch).message
    batch = gpu_batch()
    batch.agent_id = ""
    assert "agent_id" in reject(batch).message


def test_a_broken_record_is_refused_alone() -> None:
    batch = gpu_batch()
    batch.series[0].name = 999
    decoded = decode_batch(batch, LIMITS)
    assert reasons(decoded) == [("series", 0, "malformed")]
    assert "outside the dictionary" in decoded.rejections[0].message
    assert decoded.sample_count == 30 and len(decoded.series) == 3
    batch = gpu_batch(extra_records=[{"type": "job", "ts": time.time(), "job": "j", "state": "x"}])
    batch.jobs[0].state = "exploded"
    decoded = decode_batch(batch, LIMITS)
    assert reasons(decoded) == [("job", 0, "malformed")]
    assert "state 'exploded'" in decoded.rejections[0].message and decoded.sample_count == 40


def test_oversized_batches_are_refused_whole() -> None:
    batch = gpu_batch(gpus=4, seconds=60)
    err = reject(batch, Limits(max_batch_bytes=1024))
    assert err.reason == "oversized" and "over the limit of 1024" in err.message
    err = reject(batch, Limits(max_samples=100))
    assert err.reason == "oversized" and "samples" in err.message


def test_a_batch_spanning_more_than_an_hour_is_refused() -> None:
    err = reject(gpu_batch(seconds=3, start=time.time() - 7200), Limits(max_span_ms=1000))
    assert err.reason == "span"


def test_each_limit_refuses_its_record_alone_and_keeps_the_rest() -> None:
    now = time.time()
    long_gpu = "GPU-" + "f" * 196  # 200 characters, over MAX_GPU_CHARS (96)
    records: list[dict[str, object]] = [
        {"type": "log", "ts": now, "line": "x" * 26498, "node": "n1"},  # 0: too long
        {"type": "log", "ts": now, "line": "\x00\x00 corrupted", "node": "n1"},  # 1: NUL
        {"type": "log", "ts": now, "line": "fine", "node": "n1"},  # kept
        {"type": "sample", "ts": now, "name": "bad.gpu", "value": 1.0, "gpu": long_gpu},
        {"type": "sample", "ts": now, "name": "bad.label", "value": 1.0, "labels": {"k": "a\x00"}},
        {"type": "sample", "ts": now, "name": "bad.node", "value": 1.0, "node": "n" * 256},
        {"type": "event", "ts": now, "name": signals.EVENT_XID, "text": "x", "gpu": long_gpu},
        {"type": "event", "ts": now, "name": signals.EVENT_XID, "value": 79.0, "node": "n1"},
        {"type": "job", "ts": now, "job": "j1", "name": "a\x00b"},
        {"type": "job", "ts": now, "job": "j2", "config": {"k": "v\x00"}},
        {"type": "job", "ts": now, "job": "j3", "slurm_account": "acct\x00"},
        {"type": "job", "ts": now, "job": "j" * 300},
        {"type": "job", "ts": now, "job": "j4", "state": "running"},  # kept
        {"type": "process", "ts": now, "node": "n1", "pid": 7, "cmd": "python\x00 train.py"},
    ]
    decoded = decode_batch(raw_batch(records), LIMITS)
    got = reasons(decoded)
    assert ("log", 0, limits.TOO_LONG) in got and ("log", 1, limits.NUL) in got
    assert [r["line"] for r in decoded.logs] == ["fine"]
    assert decoded.sample_count == 20 and {k.name for k in decoded.series} == {
        signals.DCGM_FI_DEV_GPU_UTIL
    }
    series_reasons = sorted(r for k, _i, r in got if k == "series")
    assert series_reasons == sorted([limits.TOO_LONG, limits.NUL, limits.TOO_LONG])
    assert decoded.rejected_samples == 3
    assert [e["value"] for e in decoded.events] == [79.0]
    assert [j["job"] for j in decoded.jobs] == ["j4"]
    assert sorted(r for k, _i, r in got if k == "job") == sorted(
        [limits.NUL, limits.NUL, limits.NUL, limits.TOO_LONG]
    )
    assert decoded.processes == [] and ("process", 0, limits.NUL) in got
    assert decoded.rejected_records == 11
    messages = " | ".join(str(r) for r in decoded.rejections)
    assert "26498 characters, over the limit of 16384" in messages
    assert "gpu: 200 characters, over the limit of 96" in messages
    assert "NUL character" in messages


def test_what_the_agent_cleaned_passes_every_check() -> None:
    """The same dirty records through the agent's encoder (cleaning on): nothing refused."""
    now = time.time()
    builder = BatchBuilder("clean-agent")
    builder.extend(
        [
            {"type": "log", "ts": now, "line": "x" * 26498, "node": "n1"},
            {"type": "log", "ts": now, "line": "\x00\x00 corrupted", "node": "n1"},
            {"type": "sample", "ts": now, "name": "g", "value": 1.0, "gpu": "GPU-" + "f" * 196},
            {"type": "sample", "ts": now, "name": "l", "value": 1.0, "labels": {"k": "a\x00"}},
            {"type": "job", "ts": now, "job": "j2", "config": {"k": "v\x00"}},
            {"type": "job", "ts": now, "job": "j3", "slurm_account": "acct\x00"},
        ]
    )
    decoded = decode_batch(builder.build(1), LIMITS)
    assert decoded.rejections == []
    lines = [r["line"] for r in decoded.logs]
    assert len(lines[0]) == limits.MAX_LOG_LINE_CHARS and "…[truncated" in lines[0]
    assert lines[1] == "\ufffd\ufffd corrupted"
    gpus = {k.gpu for k in decoded.series}
    assert any(len(g) == limits.MAX_GPU_CHARS and "…#" in g for g in gpus)
    assert decoded.jobs[0]["config"] == {"k": "v\ufffd"}
    assert decoded.jobs[1]["attributes"] == {"slurm_account": "acct\ufffd"}


def test_a_batch_of_nothing_but_bad_records_is_refused_whole() -> None:
    bad = [{"type": "log", "ts": time.time(), "line": "a\x00", "node": "n1"}]
    err = reject(raw_batch(bad, with_samples=False))
    assert err.reason == limits.NUL and "no record of the batch is usable" in err.message


def test_limits_agree_with_ingest_columns() -> None:
    def size(model: Any, name: str) -> int:
        return int(model._meta.get_field(name).max_length)

    assert size(models.Node, "hostname") == limits.MAX_NODE_CHARS
    assert limits.MAX_GPU_CHARS == size(models.Gpu, "uuid") == size(models.Series, "gpu")
    assert limits.MAX_GPU_CHARS == size(models.Event, "gpu") == size(models.Process, "gpu")
    assert limits.MAX_JOB_CHARS == size(models.Job, "job_id") == size(models.Job, "rerun_of")
    assert size(models.Series, "name") == limits.MAX_SIGNAL_NAME_CHARS
    assert size(models.Event, "name") == limits.MAX_EVENT_NAME_CHARS
    assert size(models.LogLine, "stream") == limits.MAX_STREAM_CHARS
    assert size(models.BatchReceipt, "agent_id") == limits.MAX_AGENT_ID_CHARS
    assert size(models.Job, "kind") == limits.MAX_JOB_KIND_CHARS
    assert size(models.Job, "name") == limits.MAX_JOB_NAME_CHARS
    assert size(models.Job, "scheduler") == limits.MAX_SCHEDULER_CHARS


def test_a_config_nested_too_deep_for_the_parser_is_refused_alone() -> None:
    batch = raw_batch([{"type": "job", "ts": time.time(), "job": "deep"}])
    batch.jobs[0].config_json = "[" * 30_000 + "]" * 30_000
    decoded = decode_batch(batch, LIMITS)
    assert reasons(decoded) == [("job", 0, "malformed")] and decoded.sample_count == 20
