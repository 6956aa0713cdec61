"""The server's parse of a wire Batch: one protobuf parse that leaves the bulk as bytes.

A Batch's samples are three packed arrays (sample_counts, ts_ms, values: ~51,000 elements each
in an 850-series, 60-second batch) and its series definitions repeat from batch to batch of an
agent. Parsed as `ingest_pb2.Batch`, every element becomes a Python object that numpy then
converts one by one (~8 ms of a batch's ~30 ms of server CPU). `parse()` parses the same bytes
as `WireBatch`: the Batch with fields 4-7 declared `repeated bytes` (a packed field and a
message are both length-delimited on the wire, so the bytes are exactly what the field held),
every other field as in ingest.proto. `sample_arrays()` turns the packed bytes into numpy
arrays directly (doubles by frombuffer, varints by a vectorised decode), checking what the
protobuf parser would have checked; `series_defs()` parses the series definitions only when
processing needs them (an agent's unchanged series are decoded once: ingest/processing.py).

What the view cannot take as the proto does — a field of 4-7 sent with another wire type (an
encoder that does not pack), or any field this server does not know — is left as unknown
fields by the parse; `parse()` then parses the bytes again as `ingest_pb2.Batch`, and
processing takes that as it always did. Both kinds answer the same attributes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError

from contract.wire import ingest_pb2

# Batch fields kept as bytes by the view: series (4), sample_counts (5), ts_ms (6), values (7).
_AS_BYTES = {"series", "sample_counts", "ts_ms", "values"}
_MAX_VARINT_BYTES = 10


def _view_class() -> Any:
    """WireBatch: ingest.proto's Batch with the fields of _AS_BYTES as `repeated bytes`, in a
    pool of its own (the same package and message names as the real one, kept apart)."""
    proto = descriptor_pb2.FileDescriptorProto()
    ingest_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.ClearField("service")
    batch = next(m for m in proto.message_type if m.name == "Batch")
    for f in batch.field:
        if f.name in _AS_BYTES:
            f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            f.ClearField("type_name")
            f.ClearField("options")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.Batch"))


WireBatch = _view_class()


class WireFormatError(ValueError):
    """The bytes are not a valid Batch (what protobuf's DecodeError says for the real type)."""


def parse(raw: bytes) -> Any:
    """The Batch in `raw`: a WireBatch, or an `ingest_pb2.Batch` when the view left anything
    unknown. DecodeError as the real parse raises it."""
    view = WireBatch.FromString(raw)
    if len(unknown_fields.UnknownFieldSet(view)):
        return ingest_pb2.Batch.FromString(raw)
    return view


def is_view(batch: Any) -> bool:
    return isinstance(batch, WireBatch)


def series_defs(batch: Any) -> Any:
    """The batch's series definitions as `ingest_pb2.SeriesDef` messages (or what the real
    Batch holds). WireFormatError for a definition that is not a SeriesDef."""
    if not is_view(batch):
        return batch.series
    try:
        return [ingest_pb2.SeriesDef.FromString(b) for b in batch.series]
    except DecodeError as exc:
        raise WireFormatError(f"a series is not a valid SeriesDef: {exc}") from None


def series_section(batch: Any) -> tuple[tuple[str, ...], tuple[bytes, ...]] | None:
    """What the batch's decoded series depend on (its dictionary and the series' bytes), to
    compare with an earlier batch's; None for a real Batch."""
    if not is_view(batch):
        return None
    return tuple(batch.strings), tuple(batch.series)


def sample_arrays(batch: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sample_counts as int64, ts_ms as int64 deltas, values as float64), the values the
    protobuf parser gives for these fields. WireFormatError for packed bytes it would refuse."""
    if not is_view(batch):
        return (
            np.array(batch.sample_counts, dtype=np.int64),
            np.array(batch.ts_ms, dtype=np.int64),
            np.array(batch.values, dtype=np.float64),
        )
    counts = _varints(_joined(batch.sample_counts), "sample_counts")
    counts &= np.uint64(0xFFFFFFFF)  # uint32: the parser keeps the low 32 bits
    zigzag = _varints(_joined(batch.ts_ms), "ts_ms")
    ts = (zigzag >> np.uint64(1)).astype(np.int64) ^ -(zigzag & np.uint64(1)).astype(np.int64)
    packed = _joined(batch.values)
    if len(packed) % 8:
        raise WireFormatError("values: packed doubles of a length that is not a multiple of 8")
    values = np.frombuffer(packed, dtype="<f8").astype(np.float64)  # a writable copy
    return counts.astype(np.int64), ts, values


def _joined(chunks: Any) -> bytes:
    # A packed field may come in several pieces; the parser concatenates them.
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _varints(data: bytes, what: str) -> np.ndarray:
    """The base-128 varints packed in `data`, as uint64."""
    b = np.frombuffer(data, dtype=np.uint8)
    if not len(b):
        return np.zeros(0, dtype=np.uint64)
    last = b < 0x80
    if not last[-1]:
        raise WireFormatError(f"{what}: truncated varint")
    ends = np.flatnonzero(last)
    if len(ends) == len(b):
        return b.astype(np.uint64)
    starts = np.empty(len(ends), dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > _MAX_VARINT_BYTES:
        raise WireFormatError(f"{what}: varint over 10 bytes")
    # Byte k of every varint longer than k, in one pass per k (a handful: ts deltas take 2-3
    # bytes). Bits shifted past 64 are dropped, as the parser drops them (a tenth byte over 1).
    low = (b & 0x7F).astype(np.uint64)
    result: np.ndarray = low[starts]
    for k in range(1, longest):
        longer = np.flatnonzero(lengths > k)
        result[longer] |= low[starts[longer] + k] << np.uint64(7 * k)
    return result
