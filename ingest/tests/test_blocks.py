"""The sample block codec: exact round trips (random, adversarial and real values), old formats
still decode, real readings compress, and safe from many writer threads at once."""

from __future__ import annotations

import re
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

from ingest import block_values, blocks

DATA = Path(__file__).parent / "data"

# Values no decimal scale holds exactly, or that sit on the edges of one.
SPECIALS = np.array(
    [
        0.0,
        -0.0,
        np.nan,
        -np.nan,
        np.inf,
        -np.inf,
        5e-324,  # the smallest subnormal
        -2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        2.0**53,
        -(2.0**53),
        2.0**53 + 2,  # an integer float64 past 2^53: not stored as an int64
        9.999999e15,
        0.1 + 0.2,  # 0.30000000000000004: 17 digits, no scale ≤ 6
        1e-7,
        123456.789012,
        1e300,
    ]
)


def sample_block(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 50, 40)
    ids = np.sort(rng.choice(10_000, size=40, replace=False)).astype(np.int64)
    n = int(counts.sum())
    ts = 1_790_000_000_000 + np.cumsum(rng.integers(-5000, 5000, n))
    values = np.concatenate((rng.normal(0, 1e6, n - 3), [0.0, -0.0, 1e308]))
    return ids, counts, ts, values


def mixed_block(seed: int) -> tuple[np.ndarray, ...]:
    """Series of every shape the coder tells apart, random lengths (0, 1 and 2 included), with
    special values dropped in at random."""
    rng = np.random.default_rng(seed)
    n_series = int(rng.integers(1, 60))
    counts = rng.choice([0, 1, 2, 3, 60, 61, int(rng.integers(0, 200))], size=n_series)
    parts = []
    for c in counts.tolist():
        kind = int(rng.integers(0, 9))
        k = int(rng.integers(0, 7))
        if kind == 0:  # constant
            v = np.full(c, float(rng.integers(-1000, 1000)))
        elif kind == 1:  # k decimals, noisy
            v = np.round(rng.normal(300, 20, c), k)
        elif kind == 2:  # a counter (second differences small)
            v = np.cumsum(rng.integers(290_000, 310_000, c)).astype(np.float64) + 5e12
        elif kind == 3:  # a random walk of integers
            v = np.round(60 + np.cumsum(rng.normal(0, 0.5, c)))
        elif kind == 4:  # integers around ±2^53
            v = rng.integers(-(2**53), 2**53, c, endpoint=True).astype(np.float64)
        elif kind == 5:  # doubles with every bit used
            v = rng.normal(0, 1, c) * 10.0 ** rng.integers(-300, 300, c)
        elif kind == 6:  # random bit patterns (NaN payloads, subnormals, anything)
            v = rng.integers(0, 2**64 - 1, c, dtype=np.uint64, endpoint=True).view(np.float64)
        elif kind == 7:  # a linear ramp, k decimals
            v = np.round(0.5 * np.arange(c) + 1.25, k)
        else:  # wide integer jumps: residuals of 8 bytes
            v = rng.choice([-(2.0**53), 2.0**53, 0.0], c)
        if c and rng.random() < 0.3:
            v[int(rng.integers(0, c))] = rng.choice(SPECIALS)
        parts.append(v)
    values = np.concatenate([*parts, np.zeros(0)])
    ids = np.cumsum(rng.integers(1, 1000, n_series)).astype(np.int64)
    n = len(values)
    if rng.random() < 0.5:
        per = int(rng.integers(1, 100))
        counts = np.full(n_series, per)
        values = np.resize(values if n else np.zeros(1), n_series * per)
        ts = np.tile(1_790_000_000_000 + 1000 * np.arange(per), n_series)
    else:
        ts = 1_790_000_000_000 + np.cumsum(rng.integers(-5000, 5000, n))
    return ids, counts, ts, values


def assert_round_trip(payload: bytes, parts: tuple[np.ndarray, ...]) -> None:
    ids, counts, ts, values = parts
    decoded = blocks.decode(payload)
    np.testing.assert_array_equal(decoded.series_ids, ids)
    np.testing.assert_array_equal(decoded.counts, counts)
    np.testing.assert_array_equal(decoded.ts_ms, ts)
    # Bit for bit: -0.0 stays -0.0, each NaN keeps its payload.
    assert decoded.values.tobytes() == np.asarray(values, dtype="<f8").tobytes()
    np.testing.assert_array_equal(decoded.sample_series(), np.repeat(ids, counts))


def test_round_trip_is_exact() -> None:
    parts = sample_block(1)
    payload = blocks.encode(*parts)
    assert payload[:3] == b"PB3"
    assert_round_trip(payload, parts)


@pytest.mark.parametrize("seed", range(300))
def test_round_trip_is_exact_for_every_kind_of_series(seed: int) -> None:
    parts = mixed_block(seed)
    assert_round_trip(blocks.encode(*parts), parts)


@pytest.mark.parametrize("seed", range(40))
def test_the_matrix_and_the_general_coder_write_the_same_bytes(seed: int) -> None:
    # Every series of the same length goes through the (series × samples) matrix coder; the
    # general one must code such a block to exactly the same bytes (one format, two paths).
    rng = np.random.default_rng(seed)
    ids, counts, _ts, values = mixed_block(seed)
    per = int(rng.integers(1, 70))
    counts = np.full(len(ids), per)
    values = np.resize(values if len(values) else np.zeros(1), len(ids) * per)
    matrix = block_values._encode_matrix(values.reshape(len(ids), per)).tobytes()
    assert matrix == block_values._encode_general(values, counts).tobytes()


def test_special_values_alone_and_in_decimal_series() -> None:
    # Each special value as a series of its own, and planted in a 2-decimal series (which
    # must then fall back to XOR without touching its neighbours' scaled coding).
    n = len(SPECIALS)
    ids = np.arange(1, 2 * n + 2, dtype=np.int64)
    decimals = np.round(np.linspace(20.0, 80.0, 30), 2)
    series = [np.array([v]) for v in SPECIALS]
    for i, v in enumerate(SPECIALS):
        planted = decimals.copy()
        planted[i % 30] = v
        series.append(planted)
    series.append(decimals)
    counts = np.array([len(s) for s in series])
    values = np.concatenate(series)
    ts = 1_790_000_000_000 + np.arange(len(values))
    assert_round_trip(blocks.encode(ids, counts, ts, values), (ids, counts, ts, values))
    scales = blocks.decimal_scales(values, counts)
    assert scales[-1] == 2
    # Integral and within ±2^53 (not -0.0): scale 0; 123456.789012: 6; the rest: none.
    expected = [0, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, -1, -1, -1, -1, 6, -1]
    assert scales[:n].tolist() == expected


def test_the_smallest_exact_scale_is_picked() -> None:
    series = [
        np.array([1.0, 2.0, 300.0]),
        np.array([35.686, 8.969, 70.0]),  # watts to the milliwatt (NVML mW / 1000)
        np.array([0.000008, 0.000003, 0.0]),  # DCGM exporter's %f ratios
        np.array([300.1, 299.9]),
        np.array([0.1 + 0.2]),
        np.array([]),
    ]
    counts = np.array([len(s) for s in series])
    scales = blocks.decimal_scales(np.concatenate(series), counts)
    assert scales.tolist() == [0, 3, 6, 1, -1, 0]


def test_differencing_makes_counters_and_constants_nearly_free() -> None:
    per, n_series = 60, 100
    ids = np.arange(n_series, dtype=np.int64)
    counts = np.full(n_series, per)
    ts = np.tile(1_790_000_000_000 + 1000 * np.arange(per), n_series)
    rng = np.random.default_rng(7)
    # An energy counter at a steady 300 W (mJ), and constants: all differences fixed.
    ramps = [5e12 + 300_000 * np.arange(per) + s for s in range(n_series // 2)]
    flats = [np.full(per, float(s % 7)) for s in range(n_series // 2)]
    values = np.concatenate(ramps + flats)
    assert len(blocks.encode(ids, counts, ts, values)) / values.size < 0.1
    # Noise at 3 decimals costs about its information, XOR close to its 8 bytes.
    noisy = np.round(rng.uniform(0, 1, values.size), 3)
    assert len(blocks.encode(ids, counts, ts, noisy)) / values.size < 1.5
    assert len(blocks.encode_v2(ids, counts, ts, noisy)) / values.size > 3


def real_readings() -> list[tuple[str, np.ndarray, int]]:
    """(field, values across the GPUs of the fixtures, decimals as printed) from real
    dcgm-exporter output (see data/SOURCES.md)."""
    fields: dict[str, list[str]] = {}
    for path in sorted(DATA.glob("dcgm_exporter_*.prom")):
        for line in path.read_text().splitlines():
            match = re.match(r"^(DCGM_FI_\w+)\{[^}]*\} (\S+)$", line)
            if match:
                fields.setdefault(match[1], []).append(match[2])
    out = []
    for name, texts in fields.items():
        printed = max(len(t.partition(".")[2].rstrip("0")) for t in texts)
        out.append((name, np.array([float(t) for t in texts]), printed))
    return out


def test_real_dcgm_readings_are_stored_as_the_decimals_printed() -> None:
    readings = real_readings()
    assert len(readings) >= 30
    counts = np.array([len(v) for _n, v, _d in readings])
    values = np.concatenate([v for _n, v, _d in readings])
    scales = blocks.decimal_scales(values, counts)
    # Each field gets exactly the scale its printed digits need: 35.686000 W → 3, 8.969 → 3,
    # a %f ratio of 0.000008 → 6, clocks, temperatures and energy counters → 0.
    assert scales.tolist() == [d for _n, _v, d in readings]
    # One minute at 1 Hz of each field: its first reading moving by the smallest step the
    # tool prints (a random walk of ±1 unit of the last printed digit: real precision,
    # simulated motion; a counter only goes up).
    per = 60
    rng = np.random.default_rng(0)
    series = []
    for name, v, decimals in readings:
        steps = rng.integers(-1, 2, per) * 10.0**-decimals
        if "ENERGY" in name:
            steps = rng.integers(250_000, 350_000, per).astype(np.float64)
        series.append(np.round(v[0] + np.cumsum(steps), decimals))
    block = np.concatenate(series)
    ids = np.arange(len(series), dtype=np.int64)
    minute = np.full(len(series), per)
    ts = np.tile(1_790_000_000_000 + 1000 * np.arange(per), len(series))
    v3 = blocks.encode(ids, minute, ts, block)
    v2 = blocks.encode_v2(ids, minute, ts, block)
    assert_round_trip(v3, (ids, minute, ts, block))
    assert len(v3) / block.size < 0.8
    assert len(v3) < len(v2) / 2


def test_corrupt_payload_is_reported() -> None:
    parts = sample_block(2)
    payload = blocks.encode(*parts)
    with pytest.raises(blocks.BlockError):
        blocks.decode(b"XXX" + payload[3:])
    with pytest.raises(blocks.BlockError):
        blocks.decode(payload[:-10])
    # A body that decompresses but whose mode bytes or lengths do not add up.
    body = bytearray(zstandard.ZstdDecompressor().decompress(payload[3:]))
    modes_at = 16 + 40 * 12 + 8 * len(parts[2])
    compress = zstandard.ZstdCompressor().compress
    for bad in (body[:modes_at] + b"\x09" + body[modes_at + 1 :], body[:-1], body + b"\0"):
        with pytest.raises(blocks.BlockError):
            blocks.decode(b"PB3" + compress(bytes(bad)))
    assert zlib.crc32(payload) == zlib.crc32(blocks.encode(*parts))  # deterministic


def test_concurrent_encoding_from_threads() -> None:
    # Regression: one zstd compressor shared by ingest's writer threads crashed the process.
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(30):
                parts = mixed_block(seed * 100 + i)
                decoded = blocks.decode(blocks.encode(*parts))
                assert np.array_equal(decoded.ts_ms, parts[2])
                assert decoded.values.tobytes() == parts[3].tobytes()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_shared_timestamps_are_stored_once_and_formats_1_and_2_still_decode() -> None:
    series, per = 50, 60
    ids = np.arange(100, 100 + series, dtype=np.int64) * 3
    counts = np.full(series, per)
    ts = np.tile(1_790_000_000_000 + 1000 * np.arange(per), series)
    values = np.random.default_rng(3).normal(0, 10, series * per)
    values[::7] = np.round(values[::7], 1)
    v3 = blocks.encode(ids, counts, ts, values)
    v2 = blocks.encode_v2(ids, counts, ts, values)
    v1 = blocks.encode_v1(ids, counts, ts, values)
    assert (v3[:3], v2[:3], v1[:3]) == (b"PB3", b"PB2", b"PB1")
    for payload in (v3, v2, v1):
        assert_round_trip(payload, (ids, counts, ts, values))
    for payload in (v3, v2):
        shared = blocks.decode(payload).row_ts
        assert shared is not None and len(shared) == per
    assert blocks.decode(v1).row_ts is None
    # One series with a different clock: every timestamp is stored, and round-trips.
    ts_odd = ts.copy()
    ts_odd[per * 7 + 3] += 1
    odd = blocks.decode(blocks.encode(ids, counts, ts_odd, values))
    assert odd.row_ts is None
    np.testing.assert_array_equal(odd.ts_ms, ts_odd)


def test_counts_that_do_not_match_the_values_are_refused() -> None:
    ids, counts, ts, values = sample_block(4)
    with pytest.raises(ValueError, match="counts add up to"):
        blocks.encode(ids, counts + 1, ts, values)
