"""The sample block codec: many series × many samples in one compressed bytes value.

A block holds, for one node and one batch, the samples of every series in it, concatenated
series by series. Format 3 ("PB3" + zstd of), all little-endian:

    u32 series_count, u32 sample_count, u32 flags, u32 ts_count,
    i64[series_count]  series ids, delta-encoded
    u32[series_count]  samples per series
    i64[ts_count]      timestamps (ms), delta-encoded, byte-shuffled
    ...                the values, coded per series (ingest/block_values.py): decimal-scaled
                       integers, differenced, narrowed to the bytes they need, byte-shuffled;
                       or, for a series without a short decimal form, float64 XOR

flags bit 0 (shared timestamps): every series has the same timestamps — the usual shape, one
collection tick for all — and they are stored once (ts_count = samples per series); otherwise
every sample's timestamp is stored (ts_count = sample_count), concatenated series by series.
Sharing halves what a read must decompress and un-shuffle.

Older formats still decode, so rows written before need no rewrite: format 2 ("PB2") is format
3 with every value XOR the previous value, byte-shuffled (2.95 bytes per sample on disk in
`proof bench ingest`, where format 3 takes 1.30: docs/ingest.md "Benchmark"); format 1 ("PB1")
is format 2 without flags/ts_count, every timestamp stored. Encoding and decoding are
whole-array numpy operations: no Python loop per sample or per series.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zstandard

from ingest.block_values import BlockError as BlockError
from ingest.block_values import decimal_scales as decimal_scales
from ingest.block_values import (
    decode_value_rows,
    decode_values,
    encode_values,
    layout_key,
    shuffle,
    unshuffle,
    unshuffle_rows,
    xor_bytes,
)

MAGIC = b"PB3"
MAGIC_V2 = b"PB2"
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


@dataclass(slots=True)
class DecodedBlock:
    series_ids: np.ndarray  # int64[series_count]
    counts: np.ndarray  # int64[series_count]
    values: np.ndarray  # float64[sample_count]
    # The timestamps every series shares (formats 2 and 3, regular blocks), else None.
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


def _prefix(series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray) -> bytes:
    """Header, series ids, counts and timestamps: what formats 2 and 3 share."""
    ts_all = np.asarray(ts_ms, dtype="<i8")
    cnt = np.asarray(counts, dtype="<u4")
    row = _shared_row(cnt, ts_all)
    stored_ts = ts_all if row is None else row
    flags = 0 if row is None else _SHARED_TS
    header = np.array([(len(series_ids), len(ts_all), flags, len(stored_ts))], dtype=_HEADER)
    sid = np.diff(np.asarray(series_ids, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    ts = np.diff(stored_ts, prepend=np.int64(0)).astype("<i8")
    return b"".join((header.tobytes(), sid.tobytes(), cnt.tobytes(), shuffle(ts)))


def encode(
    series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """Compress one block. `ts_ms`/`values` hold each series' samples contiguously, in the
    order of `series_ids`, `counts[i]` of them for series i."""
    vals = np.ascontiguousarray(values, dtype="<f8")
    cnt = np.asarray(counts, dtype=np.int64)
    if int(cnt.sum()) != len(vals) or len(vals) != len(ts_ms) or len(cnt) != len(series_ids):
        raise ValueError(
            f"counts add up to {int(cnt.sum())} for {len(series_ids)} series ids, "
            f"{len(ts_ms)} timestamps and {len(vals)} values"
        )
    body = _prefix(series_ids, cnt, ts_ms) + encode_values(vals, cnt).tobytes()
    return MAGIC + _compressor().compress(body)


def encode_v2(
    series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """Format 2 (every value XOR'd): what blocks written before format 3 hold. Kept so that
    tests prove those still decode and `proof bench ingest --codec` compares against it."""
    return MAGIC_V2 + _compressor().compress(_prefix(series_ids, counts, ts_ms) + xor_bytes(values))


def encode_v1(
    series_ids: np.ndarray, counts: np.ndarray, ts_ms: np.ndarray, values: np.ndarray
) -> bytes:
    """Format 1 (every sample's timestamp stored): what blocks written before format 2 hold.
    Kept so that tests can prove those still decode."""
    n = len(ts_ms)
    header = np.array([(len(series_ids), n)], dtype=_HEADER_V1).tobytes()
    sid = np.diff(np.asarray(series_ids, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    ts = np.diff(np.asarray(ts_ms, dtype="<i8"), prepend=np.int64(0)).astype("<i8")
    cnt = np.asarray(counts, dtype="<u4").tobytes()
    body = b"".join((header, sid.tobytes(), cnt, shuffle(ts), xor_bytes(values)))
    return MAGIC_V1 + _compressor().compress(body)


@dataclass(slots=True)
class _Body:
    """A decompressed block, its header read."""

    magic: bytes
    body: bytes
    n_series: int
    n: int
    shared: bool
    ts_len: int
    values_at: int

    def sections(self) -> tuple[np.ndarray, np.ndarray, memoryview]:
        """(series ids, counts, the shuffled timestamps' bytes)."""
        pos = self.header_size
        sid = np.cumsum(np.frombuffer(self.body, dtype="<i8", count=self.n_series, offset=pos))
        pos += self.n_series * 8
        counts = np.frombuffer(self.body, dtype="<u4", count=self.n_series, offset=pos)
        pos += self.n_series * 4
        return sid, counts.astype(np.int64), memoryview(self.body)[pos : self.values_at]

    @property
    def header_size(self) -> int:
        return _HEADER_V1.itemsize if self.magic == MAGIC_V1 else _HEADER.itemsize

    def stack_key(self) -> bytes | None:
        """What blocks must share to decode as one (decode_many): the header, series ids and
        counts and the value section's layout; None for a block that decodes alone (not
        format 3, or not every series with the same timestamps)."""
        if self.magic != MAGIC or not self.shared or self.n_series == 0 or self.ts_len == 0:
            return None
        ids_end = self.header_size + self.n_series * 12
        values = memoryview(self.body)[self.values_at :]
        return self.body[:ids_end] + layout_key(values, self.n_series)


def _open(payload: bytes | memoryview) -> _Body:
    raw = bytes(payload)
    magic = raw[:3]
    if magic not in (MAGIC, MAGIC_V2, MAGIC_V1):
        raise BlockError("not a sample block (bad magic)")
    try:
        body = _decompressor().decompress(raw[3:])
    except zstandard.ZstdError as exc:
        raise BlockError(f"corrupt sample block: {exc}") from None
    header_type = _HEADER_V1 if magic == MAGIC_V1 else _HEADER
    if len(body) < header_type.itemsize:
        raise BlockError("corrupt sample block: truncated header")
    header = np.frombuffer(body, dtype=header_type, count=1)[0]
    n_series, n = int(header["series"]), int(header["samples"])
    shared = magic != MAGIC_V1 and bool(int(header["flags"]) & _SHARED_TS)
    ts_len = n if magic == MAGIC_V1 else int(header["ts_len"])
    values_at = header_type.itemsize + n_series * 12 + ts_len * 8
    if len(body) < values_at or (shared and ts_len * n_series != n):
        raise BlockError(f"corrupt sample block: {len(body)} bytes, too few for its header")
    return _Body(magic, body, n_series, n, shared, ts_len, values_at)


def decode(payload: bytes | memoryview) -> DecodedBlock:
    b = _open(payload)
    sid, counts, ts_raw = b.sections()
    ts = np.cumsum(unshuffle(ts_raw, b.ts_len).view("<i8"))
    view = memoryview(b.body)
    if b.magic == MAGIC:
        values = decode_values(view[b.values_at :], counts, b.n)
    elif len(b.body) != b.values_at + b.n * 8:
        raise BlockError(
            f"corrupt sample block: {len(b.body)} bytes, expected {b.values_at + b.n * 8}"
        )
    else:
        values = np.bitwise_xor.accumulate(unshuffle(view[b.values_at :], b.n)).view("<f8")
    if b.shared:
        return DecodedBlock(sid, counts, values, row_ts=ts)
    return DecodedBlock(sid, counts, values, _ts=ts)


def decode_many(payloads: Sequence[bytes | memoryview]) -> list[DecodedBlock]:
    """The blocks of one node in time order, each run of consecutive blocks of one layout
    (the same series, each with the same timestamps, coded alike: a node's 1 s blocks) as
    one DecodedBlock: its series' samples are the run's blocks' in order, its timestamps
    theirs concatenated, bit for bit what decoding them one by one and concatenating gives.
    One zstd call per block; the rest is one numpy pass per run, not per block (a 200-GPU
    job's 25 s delta is ~700 blocks of ~550 series × 1 sample)."""
    out: list[DecodedBlock] = []
    run: list[_Body] = []
    run_key: bytes | None = None
    for payload in payloads:
        body = _open(payload)
        key = body.stack_key()
        if run and (key is None or key != run_key):
            out.append(_decode_run(run))
            run = []
        if key is None:
            out.append(decode(payload))  # formats 1 and 2, per-sample timestamps: alone
            continue
        run.append(body)
        run_key = key
    if run:
        out.append(_decode_run(run))
    return out


def _decode_run(run: list[_Body]) -> DecodedBlock:
    first = run[0]
    sid, counts, _ts = first.sections()
    per = first.ts_len
    n_blocks = len(run)
    ts_at = first.values_at - per * 8
    lanes = np.frombuffer(b"".join(b.body[ts_at : b.values_at] for b in run), dtype=np.uint8)
    ts_rows = unshuffle_rows(lanes.reshape(n_blocks, per * 8), per).view("<i8")
    row_ts = np.cumsum(ts_rows, axis=1).ravel()
    views = [memoryview(b.body)[b.values_at :] for b in run]
    rows = decode_value_rows(views, counts, first.n)  # (blocks × series·per)
    if n_blocks == 1:
        return DecodedBlock(sid, counts, rows[0], row_ts=row_ts)
    # Series-major: each series' samples of every block, in block order.
    values = rows.reshape(n_blocks, len(sid), per).transpose(1, 0, 2).reshape(-1)
    return DecodedBlock(sid, counts * n_blocks, values, row_ts=row_ts)
