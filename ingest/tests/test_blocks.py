"""The sample block codec: exact round trips, and safe from many writer threads at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ingest import blocks


def sample_block(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, 40)
    ids = np.sort(rng.choice(10_000, size=40, replace=False)).astype(np.int64)
    n = int(counts.sum())
    ts = 1_790_000_000_000 + np.cumsum(rng.integers(-5000, 5000, n))
    values = np.concatenate((rng.normal(0, 1e6, n - 3), [0.0, -0.0, 1e308]))
    return ids, counts, ts, values


def test_round_trip_is_exact() -> None:
    ids, counts, ts, values = sample_block(1)
    decoded = blocks.decode(blocks.encode(ids, counts, ts, values))
    np.testing.assert_array_equal(decoded.series_ids, ids)
    np.testing.assert_array_equal(decoded.counts, counts)
    np.testing.assert_array_equal(decoded.ts_ms, ts)
    assert decoded.values.tobytes() == np.asarray(values, dtype="<f8").tobytes()  # -0.0 kept
    np.testing.assert_array_equal(decoded.sample_series(), np.repeat(ids, counts))


def test_corrupt_payload_is_reported() -> None:
    payload = blocks.encode(*sample_block(2))
    with pytest.raises(blocks.BlockError):
        blocks.decode(b"XXX" + payload[3:])
    with pytest.raises(blocks.BlockError):
        blocks.decode(payload[:-10])


def test_concurrent_encoding_from_threads() -> None:
    # Regression: one zstd compressor shared by ingest's writer threads crashed the process.
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(30):
                parts = sample_block(seed * 100 + i)
                decoded = blocks.decode(blocks.encode(*parts))
                assert np.array_equal(decoded.ts_ms, parts[2])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_shared_timestamps_are_stored_once_and_format_1_still_decodes() -> None:
    series, per = 50, 60
    ids = np.arange(100, 100 + series, dtype=np.int64) * 3
    counts = np.full(series, per)
    ts = np.tile(1_790_000_000_000 + 1000 * np.arange(per), series)
    values = np.random.default_rng(3).normal(0, 10, series * per)
    v2 = blocks.encode(ids, counts, ts, values)
    v1 = blocks.encode_v1(ids, counts, ts, values)
    assert v2[:3] == b"PB2" and v1[:3] == b"PB1"
    for payload in (v2, v1):
        decoded = blocks.decode(payload)
        np.testing.assert_array_equal(decoded.series_ids, ids)
        np.testing.assert_array_equal(decoded.counts, counts)
        np.testing.assert_array_equal(decoded.ts_ms, ts)
        assert decoded.values.tobytes() == values.tobytes()
    shared = blocks.decode(v2).row_ts
    assert shared is not None and len(shared) == per
    assert blocks.decode(v1).row_ts is None
    # One series with a different clock: every timestamp is stored, and round-trips.
    ts_odd = ts.copy()
    ts_odd[per * 7 + 3] += 1
    odd = blocks.decode(blocks.encode(ids, counts, ts_odd, values))
    assert odd.row_ts is None
    np.testing.assert_array_equal(odd.ts_ms, ts_odd)
