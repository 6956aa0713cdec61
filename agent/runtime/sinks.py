"""Sinks the agent loop hands records to: a trace file, or memory (tests, benchmarks).

The gRPC transport (agent/transport/) implements the same `Sink` protocol.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent.runtime.base import Record
from contract.trace.writer import TraceError, TraceWriter

log = logging.getLogger(__name__)


class MemorySink:
    """Keeps every submitted record in a list."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.flushes = 0
        self.closed = False

    def submit(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


class TraceSink:
    """Writes what the agent collects as a v1 trace (`proof-agent record`).

    A record stamped earlier than one already written (a kernel-log line read late, say) is
    written with `ts` raised to the last written ts and its own time kept under `source_ts`, so
    the trace stays ordered without losing the line; `late_records` counts them. A record that
    is not valid trace v1 is dropped, counted in `invalid_records` and logged once per message.
    The file is flushed (a gzip sync point) at most every `flush_every_s` seconds of wall time
    and on close.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
        *,
        truth: Any = None,
        flush_every_s: float = 1.0,
    ) -> None:
        self.writer = TraceWriter(path, meta, truth=truth)
        self.flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._last_ts = float("-inf")
        self.late_records = 0
        self.invalid_records = 0
        self._logged: set[str] = set()

    @property
    def records_written(self) -> int:
        return self.writer.records_written

    def submit(self, records: Sequence[Record]) -> None:
        write = self.writer.write
        for rec in records:
            ts = rec.get("ts")
            if type(ts) in (int, float) and ts < self._last_ts:  # type: ignore[operator]
                rec = {**rec, "ts": self._last_ts, "source_ts": ts}
                self.late_records += 1
            try:
                write(rec)
            except TraceError as exc:
                self.invalid_records += 1
                message = str(exc)
                if message not in self._logged and len(self._logged) < 100:
                    self._logged.add(message)
                    log.warning("dropping a record that is not valid trace v1: %s", message)
                continue
            self._last_ts = rec["ts"]

    def flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= self.flush_every_s:
            self._last_flush = now
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
