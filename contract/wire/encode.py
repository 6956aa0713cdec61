"""Encode trace-v1 records (typed records or their dicts) into wire Batches.

Strings (names, identity values, label keys and values) go into one dictionary per batch and
are referenced by index; the samples of each series are packed into the batch's columnar
`ts_ms`/`values` arrays. A non-finite reading is dropped here and counted (`dropped`) — the
server would refuse it.

The builder is the choke point every record bound for ingest passes (the agent's sink, `proof
replay`, the benchmarks), so it is where the agent cleans to the limits of contract/limits.py
(NUL and lone surrogates replaced, long lines and texts truncated with a marker, long ids cut
with a hash, labels capped, oversized configs replaced): what it sends is never refused for a
limit. Cleaning costs nothing on the sample hot path — a series is cleaned once, when the
builder first sees it — and a few C-level string scans per log/event/job record.
`clean=False` sends records as they are (tests that play an older or foreign agent).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from contract import limits, signals
from contract.wire import ingest_pb2

if TYPE_CHECKING:
    import numpy as np

# Scheduler attributes that operators' customer-mapping rules match on.
JOB_ATTRIBUTES = ("slurm_account", "slurm_partition", "slurm_user", "k8s_namespace")
_INT_IDENTITY = (signals.GPU_INDEX, signals.PID, signals.RANK, signals.LOCAL_RANK)


def _text_bytes(text: str) -> int:
    """UTF-8 size of `text`, bounded from above without encoding it (3 bytes a character
    covers the BMP, where progress bars' block characters are)."""
    return len(text) if text.isascii() else 3 * len(text)


def _as_dict(record: Any) -> Mapping[str, Any]:
    return record if isinstance(record, Mapping) else record.to_dict()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2) of a message, as it is serialized."""
    return _varint(tag << 3 | 2) + _varint(len(payload)) + payload


_STRINGS_FIELD = 3  # Batch.strings
_SERIES_FIELD = 4  # Batch.series
_AGENT_ID_FIELD = 1  # Batch.agent_id
# What identifies a sample's series, in the order of the cache key (labels come last).
_KEY_FIELDS = (
    "name",
    signals.NODE,
    signals.GPU,
    signals.GPU_INDEX,
    signals.PID,
    signals.JOB,
    signals.RANK,
    signals.LOCAL_RANK,
)


class BatchBuilder:
    """Accumulates records; `build_bytes(sequence)` returns the serialized Batch and starts a
    new one (`build(sequence)`: the same as a message).

    The string dictionary and the series definitions are kept across batches (a
    "generation"): a series seen before costs one dict lookup and three list appends per
    sample, and its SeriesDef is serialized once, not once per batch. Every batch carries the
    generation's whole dictionary, so it stays self-contained (the wire format is unchanged:
    any batch decodes on its own; some of its strings may be unused). A generation ends, and
    the caches start empty, every `generation_batches` batches or once the dictionary or the
    series table grows past its cap, so strings no longer used (exited pids, finished jobs)
    are not carried for long.
    """

    def __init__(
        self,
        agent_id: str,
        *,
        generation_batches: int = 60,
        max_strings: int = 20_000,
        max_string_bytes: int = 1 << 20,
        max_series: int = 20_000,
        clean: bool = True,
    ) -> None:
        self.agent_id = agent_id
        self.clean = clean
        self.generation_batches = generation_batches
        self.max_strings = max_strings
        self.max_string_bytes = max_string_bytes
        self.max_series = max_series
        self.dropped = 0  # non-finite sample values dropped, over the builder's life
        self._agent_id_bytes = _field(_AGENT_ID_FIELD, agent_id.encode())
        self._new_generation()
        self._reset()

    def _new_generation(self) -> None:
        self._strings: dict[str, int] = {"": 0}
        self._string_bytes = bytearray(_field(_STRINGS_FIELD, b""))
        self._series: dict[tuple[Any, ...], int] = {}
        self._series_entries: list[bytes] = []  # serialized Batch.series field, per index
        self._generation_age = 0

    def _reset(self) -> None:
        self._idx: list[int] = []  # per sample added one by one: series index, ts (s), value
        self._ts: list[float] = []
        self._values: list[float] = []
        self._arrays: list[tuple[int, np.ndarray, np.ndarray]] = []  # add_samples' columns
        self._batch = ingest_pb2.Batch()
        self.samples = 0
        self.records = 0
        # What the records (not the samples) add to the batch, roughly in bytes: lets the sink
        # cut a batch before it outgrows the server's max_batch_bytes.
        self.record_bytes = 0

    def __len__(self) -> int:
        return self.samples + self.records

    def _s(self, value: Any) -> int:
        if value is None or value == "":
            return 0
        text = str(value)
        index = self._strings.get(text)
        if index is None:
            # A lone surrogate (a path decoded with surrogateescape) cannot go on the wire.
            self._string_bytes += _field(_STRINGS_FIELD, text.encode("utf-8", "replace"))
            index = self._strings[text] = len(self._strings)
        return index

    def _id(self, value: Any, limit: int) -> Any:
        """An identifier as it goes on the wire: cleaned to `limit` (contract/limits.py)."""
        if value is None or value == "" or not self.clean:
            return value
        return limits.clean_identifier(str(value), limit)

    def _text(self, value: Any, limit: int) -> str:
        text = "" if value is None else str(value)
        return limits.clean_text(text, limit) if self.clean else text

    def _identity(self, ident: Any, rec: Mapping[str, Any], with_step: bool = True) -> None:
        ident.node = self._s(self._id(rec.get(signals.NODE), limits.MAX_NODE_CHARS))
        ident.gpu = self._s(self._id(rec.get(signals.GPU), limits.MAX_GPU_CHARS))
        ident.job = self._s(self._id(rec.get(signals.JOB), limits.MAX_JOB_CHARS))
        for key in _INT_IDENTITY:
            value = rec.get(key)
            if value is not None:
                setattr(ident, key, int(value))
        if with_step and rec.get(signals.STEP) is not None:
            ident.step = int(rec[signals.STEP])

    def _labels(self, labels: Mapping[str, Any] | None) -> list[int]:
        out: list[int] = []
        if labels and self.clean:
            labels = limits.clean_labels(labels)
        for key in sorted(labels or ()):
            out += [self._s(key), self._s(labels[key])]  # type: ignore[index]
        return out

    def _series_index(self, name: str, rec: Mapping[str, Any]) -> int:
        labels = rec.get("labels")
        key = (
            name,
            *map(rec.get, _KEY_FIELDS[1:]),
            tuple(sorted(labels.items())) if labels else (),
        )
        index = self._series.get(key)
        if index is None:
            index = self._new_series(key, name, rec, labels)
        return index

    def _new_series(
        self, key: tuple[Any, ...], name: str, rec: Mapping[str, Any], labels: Any
    ) -> int:
        sd = ingest_pb2.SeriesDef(
            name=self._s(self._id(name, limits.MAX_SIGNAL_NAME_CHARS)), labels=self._labels(labels)
        )
        # `step` is not part of a series' identity: it changes every iteration.
        self._identity(sd.identity, rec, with_step=False)
        index = self._series[key] = len(self._series_entries)
        self._series_entries.append(_field(_SERIES_FIELD, sd.SerializeToString()))
        return index

    def add_samples(
        self, name: str, identity: Mapping[str, Any], ts: np.ndarray, values: np.ndarray
    ) -> None:
        """Fast path: many samples of one series at once (ts in seconds)."""
        # numpy is imported where arrays come in, not with the module: the agent's sink only
        # ever calls add(), and numpy is ~19 MiB of its RSS (docs/agent.md, issue 17). A
        # caller holding arrays has it loaded already, so this is a dict lookup.
        import numpy as np

        values = np.asarray(values, dtype=np.float64)
        ts = np.asarray(ts, dtype=np.float64)
        finite = np.isfinite(values)
        if not finite.all():
            self.dropped += int((~finite).sum())
            values, ts = values[finite], ts[finite]
        index = self._series_index(name, identity)
        self._arrays.append((index, np.rint(ts * 1000).astype(np.int64), values))
        self.samples += len(values)

    def add(self, record: Any) -> None:
        rec = record if type(record) is dict else _as_dict(record)
        rtype = rec.get("type")
        if rtype == "sample":
            value = float(rec["value"])
            if not math.isfinite(value):
                self.dropped += 1
                return
            labels = rec.get("labels")
            key = (
                *map(rec.get, _KEY_FIELDS),
                tuple(sorted(labels.items())) if labels else (),
            )
            index = self._series.get(key)
            if index is None:
                index = self._new_series(key, rec["name"], rec, labels)
            self._idx.append(index)
            self._ts.append(rec["ts"])
            self._values.append(value)
            self.samples += 1
            return
        ts_us = round(float(rec["ts"]) * 1e6)
        batch = self._batch
        if rtype == "log":
            line = str(rec["line"])
            if self.clean:
                line = limits.clean_line(line)
            msg = batch.logs.add(ts_us=ts_us, line=line)
            self.record_bytes += _text_bytes(line)
            msg.stream = self._s(self._id(rec.get("stream"), limits.MAX_STREAM_CHARS))
            self._identity(msg.identity, rec)
        elif rtype == "event":
            name = self._id(rec["name"], limits.MAX_EVENT_NAME_CHARS)
            msg = batch.events.add(ts_us=ts_us, name=self._s(name))
            event_value = rec.get("value")
            if event_value is not None and math.isfinite(float(event_value)):
                msg.value = float(event_value)
            msg.text = self._text(rec.get("text") or "", limits.MAX_EVENT_TEXT_CHARS)
            self.record_bytes += _text_bytes(msg.text)
            msg.labels.extend(self._labels(rec.get("labels")))
            self._identity(msg.identity, rec)
        elif rtype == "process":
            msg = batch.processes.add(ts_us=ts_us)
            self._identity(msg.identity, rec)
            if rec.get("world_size") is not None:
                msg.world_size = int(rec["world_size"])
            cmd = rec.get("cmd")
            cmd_text = shlex.join(cmd) if isinstance(cmd, list) else str(cmd or "")
            msg.cmd = self._text(cmd_text, limits.MAX_CMD_CHARS)
            self.record_bytes += _text_bytes(msg.cmd)
        elif rtype == "exit":
            msg = batch.exits.add(ts_us=ts_us, exit_code=int(rec["exit_code"]))
            self._identity(msg.identity, rec)
        elif rtype == "job":
            self._add_job(ts_us, rec)
        else:
            return  # unknown record types are ignored, never an error (docs/design.md §5)
        self.records += 1
        self.record_bytes += 48  # timestamps, identity and field tags

    def _add_job(self, ts_us: int, rec: Mapping[str, Any]) -> None:
        msg = self._batch.jobs.add(
            ts_us=ts_us, job=self._s(self._id(rec["job"], limits.MAX_JOB_CHARS))
        )
        for key, limit in limits.JOB_TEXT_LIMITS:
            if rec.get(key):
                setattr(msg, key, self._text(rec[key], limit))
        nodes = rec.get("nodes")
        attributes: dict[str, str] = {}
        if isinstance(nodes, list):
            if self.clean:
                nodes = nodes[: limits.MAX_JOB_NODES]
            msg.nodes.extend(self._s(self._id(n, limits.MAX_NODE_CHARS)) for n in nodes)
        elif nodes is not None:
            attributes["nodes"] = str(nodes)
        for key in ("world_size", "exit_code"):
            if rec.get(key) is not None:
                setattr(msg, key, int(rec[key]))
        if rec.get("config") is not None:
            if self.clean:
                msg.config_json = limits.config_json(rec["config"])
            else:
                msg.config_json = json.dumps(rec["config"], sort_keys=True)
            self.record_bytes += len(msg.config_json)
        for key in JOB_ATTRIBUTES:
            if rec.get(key) is not None:
                attributes[key] = str(rec[key])
        if attributes:
            if self.clean:
                attributes = limits.clean_attributes(attributes) or {}
            msg.attributes.update(attributes)

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.add(record)

    def build(self, sequence: int) -> Any:
        """The accumulated records as Batch `sequence` (a message); the builder starts empty."""
        return ingest_pb2.Batch.FromString(self.build_bytes(sequence))

    def build_bytes(self, sequence: int) -> bytes:
        """The accumulated records as serialized Batch `sequence`; the builder starts empty.

        The message is put together from serialized parts (a protobuf message is the
        concatenation of its fields, a repeated field's entries may be split over several
        parts): the agent id, the generation's dictionary, the cached SeriesDefs of the series
        with samples in this batch, then the rest (sequence, sample columns, records)."""
        tail = self._batch
        tail.sequence = sequence
        series = self._columns_numpy(tail) if self._arrays else self._columns(tail)
        data = b"".join(
            (self._agent_id_bytes, self._string_bytes, series, tail.SerializeToString())
        )
        self._generation_age += 1
        if (
            self._generation_age >= self.generation_batches
            or len(self._strings) > self.max_strings
            or len(self._string_bytes) > self.max_string_bytes
            or len(self._series_entries) > self.max_series
        ):
            self._new_generation()
        self._reset()
        return data

    def _columns(self, tail: Any) -> bytes:
        """The samples added one by one, series by series (in index order), each series'
        samples in the order added, into `tail`'s columns; the SeriesDefs used, serialized.

        Plain Python, so the agent never loads numpy: ~1,000 samples a second cost about
        0.15 ms more than the numpy path below (issue 17's measurement)."""
        idx = self._idx
        if not idx:
            return b""
        ts, values = self._ts, self._values
        order = sorted(range(len(idx)), key=idx.__getitem__)  # stable: order added kept
        entries = self._series_entries
        used: list[bytes] = []
        counts: list[int] = []
        deltas: list[int] = []
        last_index = -1
        last_ms = 0
        for i in order:
            index = idx[i]
            if index != last_index:
                used.append(entries[index])
                counts.append(1)
                last_index = index
            else:
                counts[-1] += 1
            # round() is round-half-to-even on floats, as np.rint is: the same milliseconds.
            ms = round(ts[i] * 1000.0)
            deltas.append(ms - last_ms)
            last_ms = ms
        tail.sample_counts.extend(counts)
        tail.ts_ms.extend(deltas)
        tail.values.extend([values[i] for i in order])
        return b"".join(used)

    def _columns_numpy(self, tail: Any) -> bytes:
        """As `_columns`, with add_samples' arrays among them (numpy is loaded: they are
        numpy arrays)."""
        import numpy as np

        ts_parts = [np.rint(np.asarray(self._ts, dtype=np.float64) * 1000).astype(np.int64)]
        value_parts = [np.asarray(self._values, dtype=np.float64)]
        idx_parts = [np.asarray(self._idx, dtype=np.int64)]
        for index, ts_ms, values in self._arrays:
            ts_parts.append(ts_ms)
            value_parts.append(values)
            idx_parts.append(np.full(len(values), index, dtype=np.int64))
        idx_all = np.concatenate(idx_parts)
        # Series by series (in index order), each series' samples in the order added.
        order = np.argsort(idx_all, kind="stable")
        used, counts = np.unique(idx_all[order], return_counts=True)
        ts_all = np.concatenate(ts_parts)[order]
        values_all = np.concatenate(value_parts)[order]
        entries = self._series_entries
        tail.sample_counts.extend(counts.tolist())
        tail.ts_ms.extend(np.diff(ts_all, prepend=np.int64(0)).tolist())
        tail.values.extend(values_all.tolist())
        return b"".join([entries[i] for i in used.tolist()])
