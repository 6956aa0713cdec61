"""The server's view of a Batch (ingest/server_wire.py) decodes to exactly what the generated
Batch decodes to, refuses what the protobuf parser refuses, and an agent's unchanged series
are decoded once."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from contract import signals
from contract.wire import ingest_pb2
from contract.wire.encode import BatchBuilder
from ingest import processing, server_wire
from ingest.processing import BatchRejected, DecodedBatch, Limits, decode_batch
from ingest.tests.helpers import gpu_batch

LIMITS = Limits()


def _both(batch: Any, now: float) -> tuple[DecodedBatch, DecodedBatch]:
    raw = batch.SerializeToString()
    view = server_wire.parse(raw)
    assert server_wire.is_view(view)
    return decode_batch(batch, LIMITS, now=now), decode_batch(view, LIMITS, now=now)


def _assert_same(a: DecodedBatch, b: DecodedBatch) -> None:
    assert a.agent_id == b.agent_id and a.sequence == b.sequence
    assert a.series == b.series
    for name in ("counts", "ts_ms", "values"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y)
    assert (a.logs, a.events, a.processes, a.exits, a.jobs) == (
        b.logs,
        b.events,
        b.processes,
        b.exits,
        b.jobs,
    )
    assert a.rejections == b.rejections and a.rejected_by == b.rejected_by
    assert (a.rejected_records, a.rejected_samples) == (b.rejected_records, b.rejected_samples)


def _mixed_batch(agent: str, sequence: int, now: float) -> Any:
    """Samples of several shapes (negative deltas between series, large counters, irregular
    timestamps, a non-finite and an out-of-window sample) and one of each record."""
    rng = np.random.default_rng(sequence)
    builder = BatchBuilder(agent, clean=False)
    ident = {signals.NODE: "n1", signals.GPU: "GPU-0", signals.GPU_INDEX: 0, signals.JOB: "j"}
    builder.add_samples("a", ident, now - 30 + np.arange(30.0), np.arange(30.0))
    builder.add_samples(
        "counter",
        {signals.NODE: "n1"},
        now - 20 + np.arange(20.0),
        np.cumsum(rng.integers(0, 2**40, 20)).astype(float),
    )
    irregular = now - 100 + np.sort(rng.uniform(0, 100, 50))
    builder.add_samples(
        "jitter", {signals.NODE: "n1", "labels": {"k": "v"}}, irregular, rng.normal(size=50)
    )
    builder.add_samples(
        "old", {signals.NODE: "n1"}, np.array([now - 30 * 86400, now]), np.array([1.0, 2.0])
    )
    builder.add({"type": "log", "ts": now, "node": "n1", "stream": "stdout", "line": "hello"})
    builder.add({"type": "event", "ts": now, "node": "n1", "name": "xid", "value": 79.0})
    return builder.build(sequence)


def test_view_decodes_as_the_generated_batch() -> None:
    now = time.time()
    batches = [
        gpu_batch(),
        gpu_batch(gpus=8, seconds=60, job=None),
        _mixed_batch("mixed", 3, now),
    ]
    for batch in batches:
        _assert_same(*_both(batch, now))


def test_non_finite_and_out_of_window_samples_refused_alike() -> None:
    now = time.time()
    batch = gpu_batch(seconds=5)
    batch.values[3] = float("nan")
    batch.ts_ms[1] -= 30 * 86400 * 1000  # (deltas) only the second sample is a month back
    batch.ts_ms[2] += 30 * 86400 * 1000
    real, view = _both(batch, now)
    _assert_same(real, view)
    assert {r.reason for r in view.rejections} == {"non_finite", "out_of_window"}


def test_sample_arrays_match_the_parser_at_the_edges() -> None:
    batch = ingest_pb2.Batch(agent_id="a", sequence=1, strings=[""])
    batch.series.add(name=0)
    deltas = [0, 1, -1, 63, -64, 2**31, -(2**31), 2**62, 2**63 - 1, -(2**63)]
    batch.sample_counts.append(len(deltas))
    batch.ts_ms.extend(deltas)
    batch.values.extend([0.0, -0.0, 1e308, 5e-324, 1.5, -2.25, 3.0, 4.0, 5.0, 6.0])
    view = server_wire.parse(batch.SerializeToString())
    for got, want in zip(
        server_wire.sample_arrays(view), server_wire.sample_arrays(batch), strict=True
    ):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def _with_field(number: int, payload: bytes) -> bytes:
    """A Batch of agent "a", sequence 1, then field `number` length-delimited with `payload`."""
    return b"\x0a\x01a\x10\x01" + bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(
    ("number", "payload", "message"),
    [
        (6, b"\x80", "truncated varint"),
        (6, b"\xff" * 10 + b"\x01", "over 10 bytes"),
        (7, b"\x00" * 7, "multiple of 8"),
        (5, b"\x81", "truncated varint"),
    ],
)
def test_bad_packed_bytes_are_a_malformed_batch(number: int, payload: bytes, message: str) -> None:
    raw = _with_field(number, payload)
    with pytest.raises(DecodeError):
        ingest_pb2.Batch.FromString(raw)  # the parser refuses these too
    with pytest.raises(BatchRejected) as info:
        decode_batch(server_wire.parse(raw), LIMITS)
    assert info.value.reason == "malformed" and message in info.value.message


def test_bad_series_bytes_are_a_malformed_batch() -> None:
    raw = _with_field(4, b"\x12\x05\x08")  # an Identity cut short
    with pytest.raises(DecodeError):
        ingest_pb2.Batch.FromString(raw)
    with pytest.raises(BatchRejected) as info:
        decode_batch(server_wire.parse(raw), LIMITS)
    assert info.value.reason == "malformed"


def test_unpacked_encoding_falls_back_to_the_generated_batch() -> None:
    # values (7) as one fixed64 element, ts_ms (6) as a varint element, counts (5) likewise:
    # what an encoder that does not pack sends; proto3 parsers must accept it.
    raw = (
        b"\x0a\x01a\x10\x01\x1a\x00\x1a\x01x\x22\x02\x08\x01"
        + b"\x28\x01\x30"
        + bytes([0x80 | 0x40, 0x8C, 0xB6, 0xF0, 0x0B])  # some zigzag varint
        + b"\x39"
        + np.float64(2.5).tobytes()
    )
    parsed = server_wire.parse(raw)
    assert not server_wire.is_view(parsed)
    real = ingest_pb2.Batch.FromString(raw)
    for got, want in zip(
        server_wire.sample_arrays(parsed), server_wire.sample_arrays(real), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    assert list(parsed.values) == [2.5]


def test_unchanged_series_are_decoded_once_and_share_a_memo() -> None:
    processing.clear_series_cache()
    now = time.time()
    first = decode_batch(server_wire.parse(gpu_batch("cache-agent", 1).SerializeToString()), LIMITS)
    first.series_memo["probe"] = 1
    second = decode_batch(
        server_wire.parse(gpu_batch("cache-agent", 2).SerializeToString()), LIMITS, now=now
    )
    assert second.series == first.series and second.series is not first.series
    assert second.series_memo is first.series_memo
    # Another agent, or other series, decode afresh.
    other = decode_batch(server_wire.parse(gpu_batch("other", 1).SerializeToString()), LIMITS)
    changed = decode_batch(
        server_wire.parse(gpu_batch("cache-agent", 3, gpus=3).SerializeToString()), LIMITS
    )
    assert "probe" not in other.series_memo and "probe" not in changed.series_memo
    assert len(changed.series) == 6
    processing.clear_series_cache()
    again = decode_batch(server_wire.parse(gpu_batch("cache-agent", 4).SerializeToString()), LIMITS)
    assert "probe" not in again.series_memo


def test_a_batch_with_a_refused_series_is_not_cached() -> None:
    processing.clear_series_cache()
    builder = BatchBuilder("bad-series", clean=False)
    now = time.time()
    builder.add_samples("ok", {signals.NODE: "n1"}, now - 2 + np.arange(2.0), np.arange(2.0))
    builder.add_samples("x" * 1000, {signals.NODE: "n1"}, now - 2 + np.arange(2.0), np.arange(2.0))
    raw = builder.build(1).SerializeToString()
    for _ in range(2):
        decoded = decode_batch(server_wire.parse(raw), LIMITS, now=now)
        assert [r.kind for r in decoded.rejections] == ["series"]
        assert len(decoded.series) == 1


def test_the_benchmark_agents_bytes_are_the_serialized_batch() -> None:
    from ingest import bench

    template = bench._template("wire-node", 60, 10, bench.JOB_ID, 3)
    wire = bench._Wire(template)
    for sequence, ts0 in ((1, 1_796_000_000_000), (2**40, -5), (9, -(2**63))):
        patched = ingest_pb2.Batch()
        patched.CopyFrom(template)
        patched.sequence, patched.ts_ms[0] = sequence, ts0
        assert wire.batch(sequence, ts0) == patched.SerializeToString()
