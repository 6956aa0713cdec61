"""The sample block codec: many series × many samples in one compressed bytes value.

A block holds, for one node and one batch, the samples of every series in it, concatenated
series by series. Layout before compression (all little-endian):

    u32 series_count, u32 sample_count,
    i64[series_count]  series ids, delta-encoded
    u32[series_count]  samples per series
    i64[sample_count]  timestamps (ms), delta-encoded over the concatenation, byte-shuffled
    u64[sample_count]  float64 values XOR the previous value, byte-shuffled

XOR with the previous value turns repeated and slowly changing readings into mostly-zero
bytes; byte shuffling groups the bytes of equal significance; zstd then squeezes both. Encoding
and decoding are whole-array numpy operations: no Python loop per sample or per series.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import zstandard

MAGIC = b"PB1"
_HEADER = np.dtype([("series", "<u4"), ("samples", "<u4")])
_LEVEL = 3

# zstd (de)compressor objects are not thread-safe (sharing one across ingest's writer threads
# crashes the process): one per thread.
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    comp = getattr(_local, "compressor", None)
    if comp is None:
        comp = _local.compressor = zstandard.ZstdCompressor(level=_LEVEL)
    return comp


def _decompressor() -> zstandard.ZstdDecompressor:
    dec = getattr(_local, "decompressor", None)
    if dec is None:
        dec = _local.decompressor = zstandard.ZstdDecompressor()
    return dec


class BlockError(ValueError):
    """A stored block could not be decoded (corrupt or of an unknown format)."""


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    series_ids: np.ndarray  # int64[series_count]
    counts: np.ndarray  # int64[series_count]
    ts_ms: np.ndarray  # int64[sample_count]
    values: np.ndarray  # float64[sample_count]

    def sample_series(self) -> np.ndarray:
        """The series id of every sample."""
        return np.repeat(self.series_ids, self.counts)


def _shuffle(words: np.ndarray) -> bytes:
    return words.view(np.uint8).reshape(-1, 8).T.tobytes()


def _unshuffle(raw: bytes | memoryview, n: int) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).reshape(8, n).T.copy().view("<u8").ravel()


def encode(
    series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """Compress one block. `ts_ms`/`values` hold each series' samples contiguously, in the
    order of `series_ids`, `counts[i]` of them for series i."""
    n_series = len(series_ids)
    n = len(ts_ms)
    header = np.array([(n_series, n)], dtype=_HEADER).tobytes()
    sid = np.diff(np.asarray(series_ids, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    cnt = np.asarray(counts, dtype="<u4")
    ts = np.diff(np.asarray(ts_ms, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    bits = np.ascontiguousarray(values, dtype="<f8").view("<u8")
    xored = bits ^ np.concatenate((np.zeros(1, dtype="<u8"), bits[:-1]))
    body = b"".join((header, sid.tobytes(), cnt.tobytes(), _shuffle(ts), _shuffle(xored)))
    return MAGIC + _compressor().compress(body)


def decode(payload: bytes | memoryview) -> DecodedBlock:
    raw = bytes(payload)
    if raw[:3] != MAGIC:
        raise BlockError("not a sample block (bad magic)")
    try:
        body = _decompressor().decompress(raw[3:])
    except zstandard.ZstdError as exc:
        raise BlockError(f"corrupt sample block: {exc}") from None
    header = np.frombuffer(body, dtype=_HEADER, count=1)[0]
    n_series, n = int(header["series"]), int(header["samples"])
    expected = _HEADER.itemsize + n_series * 12 + n * 16
    if len(body) != expected:
        raise BlockError(f"corrupt sample block: {len(body)} bytes, expected {expected}")
    pos = _HEADER.itemsize
    sid = np.cumsum(np.frombuffer(body, dtype="<i8", count=n_series, offset=pos))
    pos += n_series * 8
    counts = np.frombuffer(body, dtype="<u4", count=n_series, offset=pos).astype(np.int64)
    pos += n_series * 4
    ts = np.cumsum(_unshuffle(memoryview(body)[pos : pos + n * 8], n).view("<i8"))
    pos += n * 8
    bits = np.bitwise_xor.accumulate(_unshuffle(memoryview(body)[pos : pos + n * 8], n))
    return DecodedBlock(sid, counts, ts, bits.view("<f8"))
