"""Batch decoding and validation as plain functions: no gRPC, no database.

`decode_batch()` turns a wire Batch into plain Python/numpy values. A record that breaks a
rule — a limit of contract/limits.py (the one set the agent cleans to: NUL characters, lengths,
label counts), a bad string index, a non-finite value, a timestamp outside the accepted
window — is refused alone: it is left out of the DecodedBatch and listed in its `rejections`,
and the rest of the batch is stored. A series is one record (refused with all its samples);
a non-finite or out-of-window sample is refused alone. `BatchRejected` (the whole batch
refused, nothing of it stored) is left for what cannot be attributed to one record: bytes that
are not a Batch, a bad agent id or sequence, the size limits, counts that do not add up, a span
over an hour, and a batch in which no record at all is usable.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import limits as L
from contract.rows import SeriesInfo
from contract.wire import ingest_pb2
from ingest import server_wire
from ingest.storage import MAX_BLOCK_SPAN_MS

JOB_STATES = ("running", "completed", "failed", "cancelled")
MAX_AGENT_ID = L.MAX_AGENT_ID_CHARS
MAX_NAME = L.MAX_SIGNAL_NAME_CHARS
# The smallest identifier limit of a dictionary string (a GPU id): a dictionary whose strings
# are all at most this long and hold no NUL needs no per-field check at all (the usual batch).
_ID_FLOOR = min(L.MAX_GPU_CHARS, L.MAX_EVENT_NAME_CHARS, L.MAX_NODE_CHARS, L.MAX_JOB_CHARS)
MAX_KEPT_REJECTIONS = 32  # details kept per batch (all are counted)
# BatchReceipt.sequence is a bigint: a larger sequence is refused here, by name, not by the
# database mid-transaction.
MAX_SEQUENCE = 2**63 - 1
# A job's configuration is read by people and by detectors a few levels deep; a deeper one is
# refused with the record (json.loads, PostgreSQL's jsonb and every walk of it recurse).
MAX_CONFIG_JSON_DEPTH = 64
# GPUs one Register may list: far above any node (16 is a lot), far below where storing
# them one by one would hold the RPC for seconds (10,000 took 21 s).
MAX_REGISTER_GPUS = 256
# RegisterRequest.gpus[].index is an int32 and Gpu.index an integer: every value fits.


class BatchRejected(Exception):
    """The batch breaks a rule; `reason` is a short metric label, the message says what."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _RecordProblem(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class RecordRejection:
    """One record refused alone: `kind` (series, samples, log, event, process, exit, job),
    its `index` in that list of the Batch, the metric `reason` and what was wrong."""

    kind: str
    index: int
    reason: str
    message: str

    def __str__(self) -> str:
        return self.message  # it names the record ("log 3: …", "series 12 (name): …")


@dataclass(frozen=True)
class Limits:
    max_batch_bytes: int = 32 * 1024 * 1024
    max_series: int = 200_000
    max_samples: int = 4_000_000
    max_records: int = 200_000  # logs + events + processes + exits + jobs
    max_line_bytes: int = L.MAX_LOG_LINE_CHARS  # characters, despite the name
    max_age_s: float = 7 * 86400
    max_future_s: float = 300
    max_span_ms: int = MAX_BLOCK_SPAN_MS

    @classmethod
    def from_settings(cls) -> Limits:
        from django.conf import settings

        return cls(
            max_batch_bytes=settings.INGEST_MAX_BATCH_BYTES,
            max_age_s=settings.INGEST_MAX_AGE_S,
            max_future_s=settings.INGEST_MAX_FUTURE_S,
        )


@dataclass
class DecodedBatch:
    agent_id: str
    sequence: int
    series: list[SeriesInfo]
    counts: np.ndarray  # int64 per series
    ts_ms: np.ndarray  # int64 absolute, per sample
    values: np.ndarray  # float64 per sample
    logs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    # Records refused alone (the first MAX_KEPT_REJECTIONS), how many in all, by (kind,
    # reason), and the samples among them.
    rejections: list[RecordRejection] = field(default_factory=list)
    rejected_records: int = 0
    rejected_by: dict[tuple[str, str], int] = field(default_factory=dict)
    rejected_samples: int = 0
    # Shared by the batches of an agent whose series are byte for byte the same (see
    # _SeriesSection): storage keeps what it derives from `series` here.
    series_memo: dict[Any, Any] = field(default_factory=dict)

    @property
    def sample_count(self) -> int:
        return len(self.values)

    @property
    def record_count(self) -> int:
        return (
            len(self.logs)
            + len(self.events)
            + len(self.processes)
            + len(self.exits)
            + len(self.jobs)
        )

    def reject(self, kind: str, index: int, reason: str, message: str) -> None:
        self.rejected_records += 1
        self.rejected_by[(kind, reason)] = self.rejected_by.get((kind, reason), 0) + 1
        if len(self.rejections) < MAX_KEPT_REJECTIONS:
            self.rejections.append(RecordRejection(kind, index, reason, message))


class _Strings:
    """The batch's dictionary, with what is needed to check a string against a limit cheaply:
    `flagged` holds the indices of the strings that could break one (a NUL, or longer than the
    smallest identifier limit), so the usual batch checks no field at all."""

    def __init__(self, strings: list[str]) -> None:
        if strings and strings[0] != "":
            raise BatchRejected("malformed", "strings[0] must be the empty string")
        self.strings = strings or [""]
        self.flagged: frozenset[int] = frozenset()
        if max(map(len, self.strings)) > _ID_FLOOR or "\x00" in "".join(self.strings):
            self.flagged = frozenset(
                i for i, s in enumerate(self.strings) if len(s) > _ID_FLOOR or "\x00" in s
            )

    def get(self, index: int, what: str) -> str:
        if index >= len(self.strings):
            raise _RecordProblem(
                "malformed",
                f"{what}: string index {index} is outside the dictionary of "
                f"{len(self.strings)} strings",
            )
        return self.strings[index]

    def checked(self, index: int, limit: int, what: str, field: str) -> str:
        """The string at `index`, which must meet `limit` (a _RecordProblem naming `what`'s
        `field` if not). The message is built only for a refused record."""
        text = self.get(index, what)
        if index in self.flagged or len(text) > limit:
            problem = L.text_problem(text, limit)
            if problem is not None:
                raise _RecordProblem(problem[0], f"{what}: {field}: {problem[1]}")
        return text

    def labels(self, indices: Any, what: str) -> tuple[tuple[str, str], ...]:
        if not indices:
            return ()
        if len(indices) % 2:
            raise _RecordProblem("malformed", f"{what}: labels must be key/value index pairs")
        if len(indices) > 2 * L.MAX_LABELS:
            raise _RecordProblem(
                L.TOO_MANY,
                f"{what}: {len(indices) // 2} labels, over the limit of {L.MAX_LABELS}",
            )
        items = [self.get(i, what) for i in indices]
        if self.flagged and not self.flagged.isdisjoint(indices):
            problem = L.labels_problem(dict(zip(items[::2], items[1::2], strict=True)))
            if problem is not None:
                raise _RecordProblem(problem[0], f"{what}: labels: {problem[1]}")
        return tuple(sorted(zip(items[::2], items[1::2], strict=True)))


def _opt(ident: Any, name: str) -> int | None:
    return int(getattr(ident, name)) if ident.HasField(name) else None


def _identity(ident: Any, strings: _Strings, what: str) -> dict[str, Any]:
    return {
        "node": strings.checked(ident.node, L.MAX_NODE_CHARS, what, "node"),
        "gpu": strings.checked(ident.gpu, L.MAX_GPU_CHARS, what, "gpu"),
        "gpu_index": _opt(ident, "gpu_index"),
        "pid": _opt(ident, "pid"),
        "job": strings.checked(ident.job, L.MAX_JOB_CHARS, what, "job"),
        "rank": _opt(ident, "rank"),
        "local_rank": _opt(ident, "local_rank"),
        "step": _opt(ident, "step"),
    }


class _Window:
    def __init__(self, limits: Limits, now: float) -> None:
        self.lo_us = int((now - limits.max_age_s) * 1e6)
        self.hi_us = int((now + limits.max_future_s) * 1e6)
        self.limits = limits

    def describe(self, ts_us: int, what: str) -> str:
        return (
            f"{what}: timestamp {ts_us / 1e6:.3f} is outside the accepted window "
            f"[{self.lo_us / 1e6:.0f}, {self.hi_us / 1e6:.0f}] (now - "
            f"{self.limits.max_age_s:.0f} s to now + {self.limits.max_future_s:.0f} s)"
        )

    def check_us(self, ts_us: int, what: str) -> None:
        if not self.lo_us <= ts_us <= self.hi_us:
            raise _RecordProblem("out_of_window", self.describe(ts_us, what))


def _text(text: str, limit: int, what: str) -> str:
    problem = L.text_problem(text, limit)
    if problem is not None:
        raise _RecordProblem(problem[0], f"{what}: {problem[1]}")
    return text


def decode_batch(
    batch: Any, limits: Limits, *, now: float | None = None, size: int | None = None
) -> DecodedBatch:
    """Validate and decode one wire Batch (contract.wire.ingest_pb2.Batch): bad records are
    left out and listed in `rejections`; BatchRejected when the batch as a whole is unusable."""
    now = time.time() if now is None else now
    size = batch.ByteSize() if size is None else size
    if size > limits.max_batch_bytes:
        raise BatchRejected(
            "oversized", f"batch is {size} bytes, over the limit of {limits.max_batch_bytes}"
        )
    if not batch.agent_id or len(batch.agent_id) > MAX_AGENT_ID:
        raise BatchRejected("malformed", f"agent_id must be 1 to {MAX_AGENT_ID} characters")
    if "\x00" in batch.agent_id:
        raise BatchRejected("nul", "agent_id holds a NUL character")
    if batch.sequence < 1:
        raise BatchRejected("malformed", "sequence must be 1 or more")
    if batch.sequence > MAX_SEQUENCE:
        raise BatchRejected(
            "malformed", f"sequence {batch.sequence} is over the limit of {MAX_SEQUENCE} (2^63-1)"
        )
    n_records = (
        len(batch.logs)
        + len(batch.events)
        + len(batch.processes)
        + len(batch.exits)
        + len(batch.jobs)
    )
    if n_records > limits.max_records:
        raise BatchRejected(
            "oversized", f"batch has {n_records} records, over the limit of {limits.max_records}"
        )
    strings = _Strings(list(batch.strings))
    window = _Window(limits, now)
    decoded = DecodedBatch(
        batch.agent_id,
        int(batch.sequence),
        [],
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        np.zeros(0, np.float64),
    )
    _decode_samples(batch, strings, limits, window, decoded)
    _decode_records(batch, strings, limits, window, decoded)
    if decoded.rejected_records and not decoded.sample_count and not decoded.record_count:
        # Nothing of it is usable: refuse it whole, so the agent keeps it (dead letter).
        first = decoded.rejections[0]
        raise BatchRejected(
            first.reason,
            f"no record of the batch is usable ({decoded.rejected_records} refused; first: "
            f"{first})",
        )
    return decoded


def _decode_samples(
    batch: Any, strings: _Strings, limits: Limits, window: _Window, out: DecodedBatch
) -> None:
    n_series = len(batch.series)
    if n_series > limits.max_series:
        raise BatchRejected(
            "oversized", f"batch has {n_series} series, over the limit of {limits.max_series}"
        )
    try:
        counts, deltas, values = server_wire.sample_arrays(batch)
    except server_wire.WireFormatError as exc:
        raise BatchRejected("malformed", f"the message is not a valid Batch: {exc}") from None
    if len(counts) != n_series:
        raise BatchRejected(
            "malformed",
            f"sample_counts has {len(counts)} entries for {n_series} series",
        )
    total = int(counts.sum())
    if total > limits.max_samples:
        raise BatchRejected(
            "oversized", f"batch has {total} samples, over the limit of {limits.max_samples}"
        )
    if len(deltas) != total or len(values) != total:
        raise BatchRejected(
            "malformed",
            f"sample_counts add up to {total} but there are {len(deltas)} timestamps and "
            f"{len(values)} values",
        )
    series, bad_series = _series_of(batch, strings, out)
    if total == 0:
        out.series = [k for k in series if k is not None]
        out.counts = counts[[k is not None for k in series]] if bad_series else counts
        return
    ts_ms = np.cumsum(deltas)
    keep = np.isfinite(values)
    lo_ms, hi_ms = window.lo_us // 1000, window.hi_us // 1000
    first, last = int(ts_ms.min()), int(ts_ms.max())
    if not bad_series and keep.all() and lo_ms <= first and last <= hi_ms:
        # The usual batch: every sample good, nothing to mask (no per-sample work).
        out.series = series  # type: ignore[assignment]  # no None in it
        out.counts, out.ts_ms, out.values = counts, ts_ms, values
        _check_span(first, last, limits)
        return
    in_window = (ts_ms >= lo_ms) & (ts_ms <= hi_ms)
    keep &= in_window
    series_ok = np.ones(n_series, dtype=bool)
    if bad_series:
        series_ok[bad_series] = False
        out.rejected_samples += int(counts[~series_ok].sum())
        keep &= np.repeat(series_ok, counts)
    if not keep.all():
        _reject_samples(out, series, counts, series_ok, values, ts_ms, in_window, window)
        kept_counts = np.bincount(
            np.repeat(np.arange(n_series), counts)[keep], minlength=n_series
        ).astype(np.int64)
        values, ts_ms = values[keep], ts_ms[keep]
    else:
        kept_counts = counts
    out.series = [k for k in series if k is not None]
    out.counts = kept_counts[series_ok] if bad_series else kept_counts
    out.ts_ms, out.values = ts_ms, values
    if len(ts_ms):
        _check_span(int(ts_ms.min()), int(ts_ms.max()), limits)


@dataclass(frozen=True)
class _SeriesSection:
    """An agent's last decoded series: what they were decoded from (its dictionary and the
    series' wire bytes), the SeriesInfo of each, and `memo`, where storage keeps what it
    derives from them (ingest/services.py: their key hashes and ids)."""

    source: tuple[tuple[str, ...], tuple[bytes, ...]]
    series: list[SeriesInfo]
    memo: dict[Any, Any]


# Agent id → its last series section (only the server's WireBatch parse has one). An agent
# sends the same series batch after batch: decoding 850 of them is ~4 ms of the batch's CPU,
# comparing the bytes with the last ones ~0.05 ms. Bounded (~250 KB an 850-series agent, its
# memo included); the oldest entry goes first.
MAX_SERIES_SECTIONS = 2048
_series_sections: dict[str, _SeriesSection] = {}
_sections_lock = threading.Lock()


def clear_series_cache() -> None:
    with _sections_lock:
        _series_sections.clear()


def _series_of(
    batch: Any, strings: _Strings, out: DecodedBatch
) -> tuple[list[SeriesInfo | None], list[int]]:
    """The batch's series (None for one refused, its index in the second list), from the
    agent's last batch when they are byte for byte the same."""
    source = server_wire.series_section(batch)
    if source is not None:
        known = _series_sections.get(batch.agent_id)
        if known is not None and known.source == source:
            out.series_memo = known.memo
            return list(known.series), []
    try:
        defs = server_wire.series_defs(batch)
    except server_wire.WireFormatError as exc:
        raise BatchRejected("malformed", f"the message is not a valid Batch: {exc}") from None
    series, bad_series = _decode_series(defs, strings, out)
    if source is not None and not bad_series:
        section = _SeriesSection(source, series, out.series_memo)  # type: ignore[arg-type]
        with _sections_lock:
            _series_sections.pop(batch.agent_id, None)
            while len(_series_sections) >= MAX_SERIES_SECTIONS:
                del _series_sections[next(iter(_series_sections))]
            _series_sections[batch.agent_id] = section
    return series, bad_series


def _decode_series(
    defs: Any, strings: _Strings, out: DecodedBatch
) -> tuple[list[SeriesInfo | None], list[int]]:
    series: list[SeriesInfo | None] = []
    get = strings.get
    flagged = strings.flagged
    bad_series: list[int] = []
    for i, sd in enumerate(defs):
        what = f"series {i}"
        try:
            name = get(sd.name, what)
            if not name or len(name) > MAX_NAME:
                raise _RecordProblem(
                    L.TOO_LONG if name else "malformed",
                    f"{what}: name must be 1 to {MAX_NAME} characters",
                )
            ident = sd.identity
            if flagged:
                label = f"{what} ({name})"
                node = strings.checked(ident.node, L.MAX_NODE_CHARS, label, "node")
                gpu = strings.checked(ident.gpu, L.MAX_GPU_CHARS, label, "gpu")
                job = strings.checked(ident.job, L.MAX_JOB_CHARS, label, "job")
                strings.checked(sd.name, MAX_NAME, what, "name")
            else:
                node, gpu, job = get(ident.node, what), get(ident.gpu, what), get(ident.job, what)
            key = SeriesInfo(
                name,
                node,
                gpu,
                _opt(ident, "gpu_index"),
                _opt(ident, "pid"),
                job,
                _opt(ident, "rank"),
                _opt(ident, "local_rank"),
                strings.labels(sd.labels, what),
            )
        except _RecordProblem as problem:
            out.reject("series", i, problem.reason, problem.message)
            bad_series.append(i)
            series.append(None)
            continue
        series.append(key)
    return series, bad_series


def _check_span(lo: int, hi: int, limits: Limits) -> None:
    """The first and last kept sample (ms) must lie within one batch's span."""
    if hi - lo > limits.max_span_ms:
        raise BatchRejected(
            "span",
            f"samples span {(hi - lo) / 1000:.0f} s, over the limit of "
            f"{limits.max_span_ms / 1000:.0f} s per batch",
        )


def _reject_samples(
    out: DecodedBatch,
    series: list[SeriesInfo | None],
    counts: np.ndarray,
    series_ok: np.ndarray,
    values: np.ndarray,
    ts_ms: np.ndarray,
    in_window: np.ndarray,
    window: _Window,
) -> None:
    """Refuse the non-finite and out-of-window samples of good series: one rejection per
    series and reason (the off path: only batches that have such samples get here)."""
    owner = np.repeat(np.arange(len(counts)), counts)
    good = np.repeat(series_ok, counts)
    for reason, bad in (
        ("non_finite", ~np.isfinite(values) & good),
        ("out_of_window", np.isfinite(values) & ~in_window & good),
    ):
        if not bad.any():
            continue
        where = np.flatnonzero(bad)
        out.rejected_samples += len(where)
        owners, first, n = np.unique(owner[where], return_index=True, return_counts=True)
        for s, f, c in zip(owners.tolist(), first.tolist(), n.tolist(), strict=True):
            key = series[s]
            what = f"series {s} ({key.name if key else '?'})"
            at = int(where[f])
            if reason == "non_finite":
                message = (
                    f"{what}: {c} value(s) not finite, first {float(values[at])!r} "
                    "(NaN and infinity are not accepted)"
                )
            else:
                message = f"{c} sample(s) refused; " + window.describe(int(ts_ms[at]) * 1000, what)
            out.reject("samples", s, reason, message)


def _decode_records(
    batch: Any, strings: _Strings, limits: Limits, window: _Window, out: DecodedBatch
) -> None:
    for i, rec in enumerate(batch.logs):
        what = f"log {i}"
        try:
            window.check_us(rec.ts_us, what)
            item = {
                "ts_us": rec.ts_us,
                **_identity(rec.identity, strings, what),
                "stream": strings.checked(rec.stream, L.MAX_STREAM_CHARS, what, "stream"),
                "line": _text(rec.line, limits.max_line_bytes, what),
            }
        except _RecordProblem as problem:
            out.reject("log", i, problem.reason, problem.message)
            continue
        out.logs.append(item)
    for i, ev in enumerate(batch.events):
        what = f"event {i}"
        try:
            window.check_us(ev.ts_us, what)
            name = strings.checked(ev.name, L.MAX_EVENT_NAME_CHARS, what, "name")
            if not name:
                raise _RecordProblem("malformed", f"{what}: name is required")
            value = ev.value if ev.HasField("value") else None
            if value is not None and not math.isfinite(value):
                raise _RecordProblem(
                    "non_finite", f"{what} ({name}): value {value!r} is not finite"
                )
            item = {
                "ts_us": ev.ts_us,
                "name": name,
                **_identity(ev.identity, strings, what),
                "value": value,
                "text": _text(ev.text, L.MAX_EVENT_TEXT_CHARS, f"{what}: text"),
                "labels": dict(strings.labels(ev.labels, what)),
            }
        except _RecordProblem as problem:
            out.reject("event", i, problem.reason, problem.message)
            continue
        out.events.append(item)
    for kind, records, target in (
        ("process", batch.processes, out.processes),
        ("exit", batch.exits, out.exits),
    ):
        for i, rec in enumerate(records):
            what = f"{kind} {i}"
            try:
                window.check_us(rec.ts_us, what)
                ident = _identity(rec.identity, strings, what)
                if not ident["node"] or ident["pid"] is None:
                    raise _RecordProblem("malformed", f"{what}: node and pid are required")
                item = {"ts_us": rec.ts_us, **ident}
                if kind == "process":
                    item["world_size"] = rec.world_size if rec.HasField("world_size") else None
                    item["cmd"] = _text(rec.cmd, L.MAX_CMD_CHARS, f"{what}: cmd")
                else:
                    item["exit_code"] = rec.exit_code
            except _RecordProblem as problem:
                out.reject(kind, i, problem.reason, problem.message)
                continue
            target.append(item)
    for i, job in enumerate(batch.jobs):
        try:
            item = _decode_job(job, f"job {i}", strings, window)
        except _RecordProblem as problem:
            out.reject("job", i, problem.reason, problem.message)
            continue
        out.jobs.append(item)


def _decode_job(job: Any, what: str, strings: _Strings, window: _Window) -> dict[str, Any]:
    window.check_us(job.ts_us, what)
    job_id = strings.checked(job.job, L.MAX_JOB_CHARS, what, "job id")
    if not job_id:  # (too long was refused by `checked`)
        raise _RecordProblem(
            "malformed", f"{what}: job id must be 1 to {L.MAX_JOB_CHARS} characters"
        )
    if job.state and job.state not in JOB_STATES:
        raise _RecordProblem(
            "malformed", f"{what}: state {job.state[:40]!r} is not one of {', '.join(JOB_STATES)}"
        )
    for name, limit in L.JOB_TEXT_LIMITS:  # (state was checked against JOB_STATES above)
        _text(getattr(job, name), limit, f"{what}: {name}")
    if len(job.nodes) > L.MAX_JOB_NODES:
        raise _RecordProblem(
            L.TOO_MANY, f"{what}: {len(job.nodes)} nodes, over the limit of {L.MAX_JOB_NODES}"
        )
    nodes = [strings.checked(n, L.MAX_NODE_CHARS, what, "nodes") for n in job.nodes]
    attributes = dict(job.attributes)
    problem = L.attributes_problem(attributes)
    if problem is not None:
        raise _RecordProblem(problem[0], f"{what}: attributes: {problem[1]}")
    config = None
    if job.config_json:
        problem = L.config_problem(job.config_json)
        if problem is not None:
            raise _RecordProblem(problem[0], f"{what}: config_json: {problem[1]}")
        too_deep = False
        try:
            config = json.loads(job.config_json)
        except RecursionError:
            too_deep = True
        except ValueError as exc:
            raise _RecordProblem("malformed", f"{what}: config_json is not JSON: {exc}") from None
        if too_deep or _json_depth(config) > MAX_CONFIG_JSON_DEPTH:
            raise _RecordProblem(
                "malformed", f"{what}: config_json is nested over {MAX_CONFIG_JSON_DEPTH} levels"
            )
        if not isinstance(config, dict):
            raise _RecordProblem("malformed", f"{what}: config_json must be a JSON object")
    return {
        "ts_us": job.ts_us,
        "job": job_id,
        "kind": job.kind,
        "name": job.name,
        "nodes": nodes,
        "world_size": job.world_size if job.HasField("world_size") else None,
        "scheduler": job.scheduler,
        "state": job.state,
        "exit_code": job.exit_code if job.HasField("exit_code") else None,
        "config": config,
        "rerun_of": job.rerun_of,
        "attributes": attributes,
    }


def _json_depth(value: Any) -> int:
    """How deep a parsed JSON value nests (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_CONFIG_JSON_DEPTH:
                stack.extend((child, depth) for child in item)
    return deepest


class RegisterRefused(Exception):
    """A RegisterRequest ingest will not record: `field` (dotted, "gpus.3.uuid") and why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _register_text(value: str, field: str, *, limit: int | None = None) -> None:
    problem = L.text_problem(value, len(value) if limit is None else limit)
    if problem is not None:
        raise RegisterRefused(field, problem[1])


def check_register(request: Any) -> None:
    """RegisterRequest as ingest records it, else RegisterRefused naming the first bad field.

    The agent id is refused over its limit, as every batch of that id would be; NUL and lone
    surrogates are refused anywhere (no host or driver produces them). Over-long host names and
    GPU texts are not refused: a real host may have them, and the servicer cleans them exactly
    as the agent cleans the same values in its records, so Register's node and GPU ids match
    the batches'."""
    if not request.agent_id:
        raise RegisterRefused("agent_id", "is required")
    _register_text(request.agent_id, "agent_id", limit=MAX_AGENT_ID)
    if not request.hostname:
        raise RegisterRefused("hostname", "is required")
    _register_text(request.hostname, "hostname")
    _register_text(request.agent_version, "agent_version")
    if len(request.gpus) > MAX_REGISTER_GPUS:
        raise RegisterRefused(
            "gpus", f"{len(request.gpus)} GPUs, over the limit of {MAX_REGISTER_GPUS}"
        )
    for i, gpu in enumerate(request.gpus):
        for name in ("uuid", "model", "driver_version", "cuda_version"):
            _register_text(getattr(gpu, name), f"gpus.{i}.{name}")


def empty_batch(agent_id: str, sequence: int) -> Any:
    """A wire Batch with nothing in it (tests and keep-alives)."""
    return ingest_pb2.Batch(agent_id=agent_id, sequence=sequence, strings=[""])
