"""A wire Batch back into trace-v1 records: how a batch ingest refused is kept readable.

The agent's dead letter (agent/spool.py `DeadLetter`) stores each refused batch's bytes and,
through `write_trace()`, the same batch as a v1 trace, so an operator can read it with `proof-agent
validate FILE`, analyze it with `proof analyze FILE` and send it again with `proof replay FILE`
(the reader and the encoder clean it to contract/limits.py on the way). No numpy or Django: the
agent's own modules only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from contract import signals
from contract.trace.writer import TraceError, TraceWriter
from contract.wire import ingest_pb2

_STRING_KEYS = (signals.NODE, signals.GPU, signals.JOB)
_INT_KEYS = (signals.GPU_INDEX, signals.PID, signals.RANK, signals.LOCAL_RANK, signals.STEP)


def _strings_get(strings: list[str], index: int) -> str:
    return strings[index] if 0 <= index < len(strings) else f"<string {index}?>"


def _identity(ident: Any, strings: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _STRING_KEYS:
        value = _strings_get(strings, getattr(ident, key))
        if value:
            out[key] = value
    for key in _INT_KEYS:
        if ident.HasField(key):
            out[key] = int(getattr(ident, key))
    return out


def _labels(indices: Any, strings: list[str]) -> dict[str, str] | None:
    items = [_strings_get(strings, i) for i in indices]
    return dict(zip(items[::2], items[1::2], strict=False)) or None


def batch_records(data: bytes | Any) -> list[dict[str, Any]]:
    """The records of a serialized Batch (or a Batch message), sorted by ts (trace order)."""
    batch = ingest_pb2.Batch.FromString(data) if isinstance(data, bytes | bytearray) else data
    strings = list(batch.strings) or [""]
    out: list[dict[str, Any]] = []
    ts_ms = list(accumulate(batch.ts_ms))
    at = 0
    for sd, count in zip(batch.series, batch.sample_counts, strict=False):
        base = {"name": _strings_get(strings, sd.name), **_identity(sd.identity, strings)}
        labels = _labels(sd.labels, strings)
        if labels:
            base["labels"] = labels
        for k in range(at, min(at + count, len(batch.values), len(ts_ms))):
            out.append({"type": "sample", "ts": ts_ms[k] / 1e3, **base, "value": batch.values[k]})
        at += count
    for log in batch.logs:
        rec = {"type": "log", "ts": log.ts_us / 1e6, "line": log.line}
        if log.stream:
            rec["stream"] = _strings_get(strings, log.stream)
        out.append({**rec, **_identity(log.identity, strings)})
    for ev in batch.events:
        rec = {"type": "event", "ts": ev.ts_us / 1e6, "name": _strings_get(strings, ev.name)}
        if ev.HasField("value"):
            rec["value"] = ev.value
        if ev.text:
            rec["text"] = ev.text
        labels = _labels(ev.labels, strings)
        if labels:
            rec["labels"] = labels
        out.append({**rec, **_identity(ev.identity, strings)})
    for proc in batch.processes:
        rec = {"type": "process", "ts": proc.ts_us / 1e6, **_identity(proc.identity, strings)}
        if proc.HasField("world_size"):
            rec["world_size"] = proc.world_size
        if proc.cmd:
            rec["cmd"] = proc.cmd
        out.append(rec)
    for ex in batch.exits:
        out.append(
            {
                "type": "exit",
                "ts": ex.ts_us / 1e6,
                **_identity(ex.identity, strings),
                "exit_code": ex.exit_code,
            }
        )
    for job in batch.jobs:
        out.append(_job_record(job, strings))
    out.sort(key=lambda r: r["ts"])
    return out


def _job_record(job: Any, strings: list[str]) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "type": "job",
        "ts": job.ts_us / 1e6,
        "job": _strings_get(strings, job.job),
    }
    for key in ("kind", "name", "scheduler", "state", "rerun_of"):
        if getattr(job, key):
            rec[key] = getattr(job, key)
    if job.nodes:
        rec["nodes"] = [_strings_get(strings, n) for n in job.nodes]
    for key in ("world_size", "exit_code"):
        if job.HasField(key):
            rec[key] = getattr(job, key)
    if job.config_json:
        try:
            config = json.loads(job.config_json)
        except ValueError:
            config = None
        if isinstance(config, dict):
            rec["config"] = config
        else:
            rec["config_json"] = job.config_json  # kept as it came (an unknown key)
    for key, value in job.attributes.items():
        rec.setdefault(key, value)
    return rec


def write_trace(
    path: str | os.PathLike[str], data: bytes, meta: Mapping[str, Any] | None = None
) -> int:
    """Write the batch `data` as a v1 trace at `path` (the records as they came: a NUL or an
    over-long line is written as is, and reported by `proof-agent validate`); returns the
    number of records."""

    records = batch_records(data)
    written = 0
    with TraceWriter(path, dict(meta or {})) as writer:
        for rec in records:
            try:
                writer.write(rec)
            except TraceError:
                continue  # e.g. a non-finite value: not representable in a trace
            written += 1
    return written
