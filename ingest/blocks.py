"""The sample block codec: many series × many samples in one compressed bytes value.

A block holds, for one node and one batch, the samples of every series in it, concatenated
series by series. Format 2 ("PB2" + zstd of), all little-endian:

    u32 series_count, u32 sample_count, u32 flags, u32 ts_count,
    i64[series_count]  series ids, delta-encoded
    u32[series_count]  samples per series
    i64[ts_count]      timestamps (ms), delta-encoded, byte-shuffled
    u64[sample_count]  float64 values XOR the previous value, byte-shuffled

flags bit 0 (shared timestamps): every series has the same timestamps — the usual shape, one
collection tick for all — and they are stored once (ts_count = samples per series); otherwise
every sample's timestamp is stored (ts_count = sample_count), concatenated series by series.
Sharing halves what a read must decompress and un-shuffle. Format 1 ("PB1", written before
format 2; no flags/ts_count, every timestamp stored) still decodes: old rows need no rewrite.

XOR with the previous value turns repeated and slowly changing readings into mostly-zero
bytes; byte shuffling groups the bytes of equal significance; zstd then squeezes both. Encoding
and decoding are whole-array numpy operations: no Python loop per sample or per series.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import zstandard

MAGIC = b"PB2"
MAGIC_V1 = b"PB1"
_HEADER_V1 = np.dtype([("series", "<u4"), ("samples", "<u4")])
_HEADER = np.dtype([("series", "<u4"), ("samples", "<u4"), ("flags", "<u4"), ("ts_len", "<u4")])
_SHARED_TS = 1
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


@dataclass(slots=True)
class DecodedBlock:
    series_ids: np.ndarray  # int64[series_count]
    counts: np.ndarray  # int64[series_count]
    values: np.ndarray  # float64[sample_count]
    # The timestamps every series shares (format 2, regular blocks), else None.
    row_ts: np.ndarray | None = None
    _ts: np.ndarray | None = None

    @property
    def ts_ms(self) -> np.ndarray:
        """int64[sample_count]: each sample's timestamp (ms)."""
        if self._ts is None:
            if self.row_ts is None:  # cannot be: decode gives a block one or the other
                raise BlockError("a block with neither per-sample nor shared timestamps")
            self._ts = np.tile(self.row_ts, len(self.series_ids))
        return self._ts

    def sample_series(self) -> np.ndarray:
        """The series id of every sample."""
        return np.repeat(self.series_ids, self.counts)


def _shuffle(words: np.ndarray) -> bytes:
    return words.view(np.uint8).reshape(-1, 8).T.tobytes()


def _unshuffle(raw: bytes | memoryview, n: int) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8).reshape(8, n).T.copy().view("<u8").ravel()


def _shared_row(counts: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
    """The one timestamp row all series share, when every series has the same timestamps."""
    n_series = len(counts)
    if n_series == 0 or len(ts) == 0 or len(ts) % n_series:
        return None
    per = len(ts) // n_series
    if not np.all(counts == per):
        return None
    rows = ts.reshape(n_series, per)
    return rows[0] if np.array_equal(rows, np.broadcast_to(rows[0], rows.shape)) else None


def encode(
    series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """Compress one block. `ts_ms`/`values` hold each series' samples contiguously, in the
    order of `series_ids`, `counts[i]` of them for series i."""
    n_series = len(series_ids)
    n = len(ts_ms)
    ts_all = np.asarray(ts_ms, dtype="<i8")
    cnt = np.asarray(counts, dtype="<u4")
    row = _shared_row(cnt, ts_all)
    stored_ts = ts_all if row is None else row
    flags = 0 if row is None else _SHARED_TS
    header = np.array([(n_series, n, flags, len(stored_ts))], dtype=_HEADER).tobytes()
    sid = np.diff(np.asarray(series_ids, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    ts = np.diff(stored_ts, prepend=np.int64(0)).astype("<i8")
    bits = np.ascontiguousarray(values, dtype="<f8").view("<u8")
    xored = bits ^ np.concatenate((np.zeros(1, dtype="<u8"), bits[:-1]))
    body = b"".join((header, sid.tobytes(), cnt.tobytes(), _shuffle(ts), _shuffle(xored)))
    return MAGIC + _compressor().compress(body)


def encode_v1(
    series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """Format 1 (every sample's timestamp stored): what blocks written before format 2 hold.
    Kept so that tests can prove those still decode."""
    n = len(ts_ms)
    header = np.array([(len(series_ids), n)], dtype=_HEADER_V1).tobytes()
    sid = np.diff(np.asarray(series_ids, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    ts = np.diff(np.asarray(ts_ms, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    bits = np.ascontiguousarray(values, dtype="<f8").view("<u8")
    xored = bits ^ np.concatenate((np.zeros(1, dtype="<u8"), bits[:-1]))
    cnt = np.asarray(counts, dtype="<u4").tobytes()
    body = b"".join((header, sid.tobytes(), cnt, _shuffle(ts), _shuffle(xored)))
    return MAGIC_V1 + _compressor().compress(body)


def decode(payload: bytes | memoryview) -> DecodedBlock:
    raw = bytes(payload)
    magic = raw[:3]
    if magic not in (MAGIC, MAGIC_V1):
        raise BlockError("not a sample block (bad magic)")
    try:
        body = _decompressor().decompress(raw[3:])
    except zstandard.ZstdError as exc:
        raise BlockError(f"corrupt sample block: {exc}") from None
    header_type = _HEADER if magic == MAGIC else _HEADER_V1
    if len(body) < header_type.itemsize:
        raise BlockError("corrupt sample block: truncated header")
    header = np.frombuffer(body, dtype=header_type, count=1)[0]
    n_series, n = int(header["series"]), int(header["samples"])
    shared = magic == MAGIC and bool(int(header["flags"]) & _SHARED_TS)
    ts_len = int(header["ts_len"]) if magic == MAGIC else n
    expected = header_type.itemsize + n_series * 12 + ts_len * 8 + n * 8
    if len(body) != expected or (shared and ts_len * n_series != n):
        raise BlockError(f"corrupt sample block: {len(body)} bytes, expected {expected}")
    view = memoryview(body)
    pos = header_type.itemsize
    sid = np.cumsum(np.frombuffer(body, dtype="<i8", count=n_series, offset=pos))
    pos += n_series * 8
    counts = np.frombuffer(body, dtype="<u4", count=n_series, offset=pos).astype(np.int64)
    pos += n_series * 4
    ts = np.cumsum(_unshuffle(view[pos : pos + ts_len * 8], ts_len).view("<i8"))
    pos += ts_len * 8
    bits = np.bitwise_xor.accumulate(_unshuffle(view[pos : pos + n * 8], n))
    values = bits.view("<f8")
    if shared:
        return DecodedBlock(sid, counts, values, row_ts=ts)
    return DecodedBlock(sid, counts, values, _ts=ts)
