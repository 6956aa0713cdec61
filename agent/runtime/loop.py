"""The agent loop: every interval, poll each collector, join identity, hand the batch to a sink.

One thread, no per-record work beyond the join: the loop must stay well under 0.02 CPU cores
for ~850 series at 1 Hz (measured by `proof-agent bench`). A collector that raises is counted
and reported once per failure streak as a `collector_error` event; the other collectors and
the loop carry on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.runtime.base import Clock, Collector, Record, Sink, SystemClock
from agent.runtime.identity import IdentityJoin
from contract import signals
from contract.trace.records import TYPE_EVENT

log = logging.getLogger(__name__)


def _ts_key(rec: Record) -> float:
    return rec["ts"]  # type: ignore[no-any-return]


@dataclass
class AgentStats:
    ticks: int = 0
    records: int = 0
    collector_errors: dict[str, int] = field(default_factory=dict)
    late_ticks: int = 0  # ticks that started later than their deadline by a whole interval
    sink_errors: int = 0  # submit/flush calls that raised (the batch is lost; logged once)
    busy_s: float = 0.0  # process CPU time spent inside ticks
    # per collector: process CPU time inside its collect() and records returned (agent /metrics)
    collector_cpu_s: dict[str, float] = field(default_factory=dict)
    collector_records: dict[str, int] = field(default_factory=dict)


class Agent:
    """Runs collectors on a clock and feeds a sink.

    `interval` is in the clock's seconds (simulated seconds for an accelerated clock). Each
    tick's records are sorted by `ts` before they reach the sink, so a trace stays ordered even
    when collectors interleave.
    """

    def __init__(
        self,
        collectors: Sequence[Collector],
        sink: Sink,
        *,
        clock: Clock | None = None,
        interval: float = 1.0,
        node: str | None = None,
        join: IdentityJoin | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.collectors = list(collectors)
        self.sink = sink
        self.clock: Clock = clock or SystemClock()
        self.interval = interval
        self.join = join or IdentityJoin(node)
        self.node = node
        self.stats = AgentStats()
        self._failing: set[str] = set()
        self._sink_failing = False
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask `run` to return after the current tick (safe from another thread/signal)."""
        self._stop.set()

    def _collector_failed(self, collector: Collector, now: float, exc: BaseException) -> Record:
        name = getattr(collector, "name", type(collector).__name__)
        errors = self.stats.collector_errors
        errors[name] = errors.get(name, 0) + 1
        log.warning("collector %s failed: %s: %s", name, type(exc).__name__, exc, exc_info=exc)
        event: Record = {
            "type": TYPE_EVENT,
            "ts": now,
            "name": signals.EVENT_COLLECTOR_ERROR,
            "text": f"{name}: {type(exc).__name__}: {exc}"[:1000],
            "labels": {"collector": name},
        }
        return event

    def tick(self) -> list[Record]:
        """One interval: collect, join, submit. Returns the records submitted."""
        cpu0 = time.process_time()
        now = self.clock.now()
        batch: list[Record] = []
        cpu_by = self.stats.collector_cpu_s
        records_by = self.stats.collector_records
        for collector in self.collectors:
            name = collector.name
            c0 = time.process_time()
            try:
                out = collector.collect(now)
            except Exception as exc:
                cpu_by[name] = cpu_by.get(name, 0.0) + time.process_time() - c0
                if name not in self._failing:
                    self._failing.add(name)
                    batch.append(self._collector_failed(collector, now, exc))
                else:
                    self.stats.collector_errors[name] += 1
                continue
            cpu_by[name] = cpu_by.get(name, 0.0) + time.process_time() - c0
            records_by[name] = records_by.get(name, 0) + len(out)
            if name in self._failing:
                self._failing.discard(name)
                log.info("collector %s recovered", name)
            if out:
                batch.extend(out)
        self.join.apply(batch, now)  # also forgets pids whose exit grace has passed
        if batch:
            batch.sort(key=_ts_key)
        try:
            if batch:
                self.sink.submit(batch)
            self.sink.flush()
        except Exception as exc:
            # A sink that raises (disk full, a transport bug) must not stop collection: the
            # next interval may succeed. Durable sinks spool; this batch is what is lost.
            self.stats.sink_errors += 1
            if self.stats.sink_errors == 1 or not self._sink_failing:
                log.error("sink failed, %d records lost: %s", len(batch), exc, exc_info=exc)
            self._sink_failing = True
        else:
            self._sink_failing = False
        self.stats.ticks += 1
        self.stats.records += len(batch)
        self.stats.busy_s += time.process_time() - cpu0
        return batch

    def run(self, *, until: float | None = None, max_ticks: int | None = None) -> AgentStats:
        """Tick every `interval` until `stop()`, clock time `until`, or `max_ticks` ticks.

        The last tick runs at or after `until`, so everything stamped up to `until` is
        collected. The sink is flushed, not closed (the caller owns it).
        """
        clock = self.clock
        deadline = clock.now()
        while not self._stop.is_set():
            self.tick()
            if max_ticks is not None and self.stats.ticks >= max_ticks:
                break
            now = clock.now()
            if until is not None and now >= until:
                break
            deadline += self.interval
            if until is not None:
                deadline = min(deadline, until)
            if now - deadline >= self.interval:
                # Fell behind by a whole interval (a stalled collector, a suspended VM):
                # skip the missed ticks rather than running them back to back.
                self.stats.late_ticks += 1
                deadline = now
            clock.sleep(deadline - now)
        self.sink.flush()
        return self.stats

    def close(self) -> None:
        for collector in self.collectors:
            close = getattr(collector, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("closing collector %s", collector.name)
        self.sink.close()
