"""Batch decoding and validation as plain functions: no gRPC, no database.

`decode_batch()` turns a wire Batch into plain Python/numpy values or raises `BatchRejected`
naming the first problem; a rejected batch is refused whole (nothing of it is stored).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from agent.wire import ingest_pb2
from ingest.storage import MAX_BLOCK_SPAN_MS

JOB_STATES = ("running", "completed", "failed", "cancelled")
MAX_AGENT_ID = 128
MAX_NAME = 255


class BatchRejected(Exception):
    """The batch breaks a rule; `reason` is a short metric label, the message says what."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Limits:
    max_batch_bytes: int = 32 * 1024 * 1024
    max_series: int = 200_000
    max_samples: int = 4_000_000
    max_records: int = 200_000  # logs + events + processes + exits + jobs
    max_line_bytes: int = 16 * 1024
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


class SeriesKey(NamedTuple):
    name: str
    node: str
    gpu: str
    gpu_index: int | None
    pid: int | None
    job: str
    rank: int | None
    local_rank: int | None
    labels: tuple[tuple[str, str], ...]


@dataclass
class DecodedBatch:
    agent_id: str
    sequence: int
    series: list[SeriesKey]
    counts: np.ndarray  # int64 per series
    ts_ms: np.ndarray  # int64 absolute, per sample
    values: np.ndarray  # float64 per sample
    logs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sample_count(self) -> int:
        return len(self.values)


class _Strings:
    def __init__(self, strings: list[str]) -> None:
        if strings and strings[0] != "":
            raise BatchRejected("malformed", "strings[0] must be the empty string")
        self.strings = strings or [""]

    def get(self, index: int, what: str) -> str:
        if index >= len(self.strings):
            raise BatchRejected(
                "malformed",
                f"{what}: string index {index} is outside the dictionary of "
                f"{len(self.strings)} strings",
            )
        return self.strings[index]

    def labels(self, indices: Any, what: str) -> tuple[tuple[str, str], ...]:
        if not indices:
            return ()
        if len(indices) % 2:
            raise BatchRejected("malformed", f"{what}: labels must be key/value index pairs")
        items = [self.get(i, what) for i in indices]
        return tuple(sorted(zip(items[::2], items[1::2], strict=True)))


def _opt(ident: Any, name: str) -> int | None:
    return int(getattr(ident, name)) if ident.HasField(name) else None


def _identity(ident: Any, strings: _Strings, what: str) -> dict[str, Any]:
    return {
        "node": strings.get(ident.node, what),
        "gpu": strings.get(ident.gpu, what),
        "gpu_index": _opt(ident, "gpu_index"),
        "pid": _opt(ident, "pid"),
        "job": strings.get(ident.job, what),
        "rank": _opt(ident, "rank"),
        "local_rank": _opt(ident, "local_rank"),
        "step": _opt(ident, "step"),
    }


class _Window:
    def __init__(self, limits: Limits, now: float) -> None:
        self.lo_us = int((now - limits.max_age_s) * 1e6)
        self.hi_us = int((now + limits.max_future_s) * 1e6)
        self.limits = limits

    def check_us(self, ts_us: int, what: str) -> None:
        if not self.lo_us <= ts_us <= self.hi_us:
            raise BatchRejected(
                "out_of_window",
                f"{what}: timestamp {ts_us / 1e6:.3f} is outside the accepted window "
                f"[{self.lo_us / 1e6:.0f}, {self.hi_us / 1e6:.0f}] (now - "
                f"{self.limits.max_age_s:.0f} s to now + {self.limits.max_future_s:.0f} s)",
            )


def decode_batch(
    batch: Any, limits: Limits, *, now: float | None = None, size: int | None = None
) -> DecodedBatch:
    """Validate and decode one wire Batch (agent.wire.ingest_pb2.Batch)."""
    now = time.time() if now is None else now
    size = batch.ByteSize() if size is None else size
    if size > limits.max_batch_bytes:
        raise BatchRejected(
            "oversized", f"batch is {size} bytes, over the limit of {limits.max_batch_bytes}"
        )
    if not batch.agent_id or len(batch.agent_id) > MAX_AGENT_ID:
        raise BatchRejected("malformed", f"agent_id must be 1 to {MAX_AGENT_ID} characters")
    if batch.sequence < 1:
        raise BatchRejected("malformed", "sequence must be 1 or more")
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
    series, counts, ts_ms, values = _decode_samples(batch, strings, limits, window)
    decoded = DecodedBatch(batch.agent_id, int(batch.sequence), series, counts, ts_ms, values)
    _decode_records(batch, strings, limits, window, decoded)
    return decoded


def _decode_samples(
    batch: Any, strings: _Strings, limits: Limits, window: _Window
) -> tuple[list[SeriesKey], np.ndarray, np.ndarray, np.ndarray]:
    n_series = len(batch.series)
    if n_series > limits.max_series:
        raise BatchRejected(
            "oversized", f"batch has {n_series} series, over the limit of {limits.max_series}"
        )
    if len(batch.sample_counts) != n_series:
        raise BatchRejected(
            "malformed",
            f"sample_counts has {len(batch.sample_counts)} entries for {n_series} series",
        )
    counts = np.array(batch.sample_counts, dtype=np.int64)
    total = int(counts.sum())
    if total > limits.max_samples:
        raise BatchRejected(
            "oversized", f"batch has {total} samples, over the limit of {limits.max_samples}"
        )
    if len(batch.ts_ms) != total or len(batch.values) != total:
        raise BatchRejected(
            "malformed",
            f"sample_counts add up to {total} but there are {len(batch.ts_ms)} timestamps and "
            f"{len(batch.values)} values",
        )
    series: list[SeriesKey] = []
    get = strings.get
    for i, sd in enumerate(batch.series):
        what = f"series {i}"
        name = get(sd.name, what)
        if not name or len(name) > MAX_NAME:
            raise BatchRejected("malformed", f"{what}: name must be 1 to {MAX_NAME} characters")
        ident = sd.identity
        series.append(
            SeriesKey(
                name,
                get(ident.node, what),
                get(ident.gpu, what),
                _opt(ident, "gpu_index"),
                _opt(ident, "pid"),
                get(ident.job, what),
                _opt(ident, "rank"),
                _opt(ident, "local_rank"),
                strings.labels(sd.labels, what),
            )
        )
    if total == 0:
        return series, counts, np.zeros(0, np.int64), np.zeros(0, np.float64)
    values = np.array(batch.values, dtype=np.float64)
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(np.argmin(finite))
        owner = int(np.searchsorted(np.cumsum(counts), bad, side="right"))
        raise BatchRejected(
            "non_finite",
            f"series {owner} ({series[owner].name}): value {values[bad]!r} is not finite "
            "(NaN and infinity are not accepted)",
        )
    ts_ms = np.cumsum(np.array(batch.ts_ms, dtype=np.int64))
    lo, hi = int(ts_ms.min()), int(ts_ms.max())
    window.check_us(lo * 1000, "samples")
    window.check_us(hi * 1000, "samples")
    if hi - lo > limits.max_span_ms:
        raise BatchRejected(
            "span",
            f"samples span {(hi - lo) / 1000:.0f} s, over the limit of "
            f"{limits.max_span_ms / 1000:.0f} s per batch",
        )
    return series, counts, ts_ms, values


def _check_line(text: str, limits: Limits, what: str) -> None:
    if len(text) > limits.max_line_bytes:
        raise BatchRejected(
            "oversized",
            f"{what}: {len(text)} characters, over the limit of {limits.max_line_bytes}",
        )


def _decode_records(
    batch: Any, strings: _Strings, limits: Limits, window: _Window, out: DecodedBatch
) -> None:
    for i, rec in enumerate(batch.logs):
        what = f"log {i}"
        window.check_us(rec.ts_us, what)
        _check_line(rec.line, limits, what)
        out.logs.append(
            {
                "ts_us": rec.ts_us,
                **_identity(rec.identity, strings, what),
                "stream": strings.get(rec.stream, what)[:16],
                "line": rec.line,
            }
        )
    for i, ev in enumerate(batch.events):
        what = f"event {i}"
        window.check_us(ev.ts_us, what)
        name = strings.get(ev.name, what)
        if not name:
            raise BatchRejected("malformed", f"{what}: name is required")
        value = ev.value if ev.HasField("value") else None
        if value is not None and not math.isfinite(value):
            raise BatchRejected("non_finite", f"{what} ({name}): value {value!r} is not finite")
        _check_line(ev.text, limits, what)
        out.events.append(
            {
                "ts_us": ev.ts_us,
                "name": name[:128],
                **_identity(ev.identity, strings, what),
                "value": value,
                "text": ev.text,
                "labels": dict(strings.labels(ev.labels, what)),
            }
        )
    for kind, records, target in (
        ("process", batch.processes, out.processes),
        ("exit", batch.exits, out.exits),
    ):
        for i, rec in enumerate(records):
            what = f"{kind} {i}"
            window.check_us(rec.ts_us, what)
            ident = _identity(rec.identity, strings, what)
            if not ident["node"] or ident["pid"] is None:
                raise BatchRejected("malformed", f"{what}: node and pid are required")
            item = {"ts_us": rec.ts_us, **ident}
            if kind == "process":
                _check_line(rec.cmd, limits, what)
                item["world_size"] = rec.world_size if rec.HasField("world_size") else None
                item["cmd"] = rec.cmd
            else:
                item["exit_code"] = rec.exit_code
            target.append(item)
    for i, job in enumerate(batch.jobs):
        what = f"job {i}"
        window.check_us(job.ts_us, what)
        job_id = strings.get(job.job, what)
        if not job_id or len(job_id) > MAX_NAME:
            raise BatchRejected("malformed", f"{what}: job id must be 1 to {MAX_NAME} characters")
        if job.state and job.state not in JOB_STATES:
            raise BatchRejected(
                "malformed", f"{what}: state {job.state!r} is not one of {', '.join(JOB_STATES)}"
            )
        config = None
        if job.config_json:
            try:
                config = json.loads(job.config_json)
            except ValueError as exc:
                raise BatchRejected(
                    "malformed", f"{what}: config_json is not JSON: {exc}"
                ) from None
            if not isinstance(config, dict):
                raise BatchRejected("malformed", f"{what}: config_json must be a JSON object")
        out.jobs.append(
            {
                "ts_us": job.ts_us,
                "job": job_id,
                "kind": job.kind[:32],
                "name": job.name[:MAX_NAME],
                "nodes": [strings.get(n, what) for n in job.nodes],
                "world_size": job.world_size if job.HasField("world_size") else None,
                "scheduler": job.scheduler[:64],
                "state": job.state,
                "exit_code": job.exit_code if job.HasField("exit_code") else None,
                "config": config,
                "rerun_of": job.rerun_of[:MAX_NAME],
                "attributes": dict(job.attributes),
            }
        )


def empty_batch(agent_id: str, sequence: int) -> Any:
    """A wire Batch with nothing in it (tests and keep-alives)."""
    return ingest_pb2.Batch(agent_id=agent_id, sequence=sequence, strings=[""])
