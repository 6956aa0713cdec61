"""The agent's own Prometheus `/metrics`: what collection costs, how far shipping is behind.

    proof-agent run --config … with [agent] metrics_address = "0.0.0.0:9464"

Read at scrape time from the running loop and its sink, nothing kept per record (the loop's
only added work is two `process_time()` calls per collector per tick):

- `proof_agent_ticks_total`, `proof_agent_records_total`, `proof_agent_late_ticks_total`,
  `proof_agent_collection_cpu_seconds_total` (all collectors) and, per collector,
  `proof_agent_collector_cpu_seconds_total{collector}`, `proof_agent_collector_records_total`,
  `proof_agent_collector_errors_total`;
- `proof_agent_sink_errors_total`;
- shipping (the gRPC sink, when there is one): `proof_agent_spool_batches`,
  `proof_agent_spool_bytes` (waiting on disk for an ack), `proof_agent_spool_dropped_batches_total`
  (the oldest dropped at the spool cap), `proof_agent_batches_sent_total` (the last sequence
  handed to the sender), `proof_agent_batches_acked_total` (the last sequence ingest acked),
  `proof_agent_unacked_batches` (their difference: the lag in batches, about one a second) and
  `proof_agent_ack_lag_seconds` (seconds since the acked sequence last advanced while batches
  were waiting; 0 when nothing waits);
- `proof_agent_process_resident_bytes` (the agent's RSS).

Each source is a `MetricsSource` (a Protocol): a callable object that yields metric families;
`AgentMetrics` is the prometheus_client collector that asks them on each scrape, on its own
registry (not the global one: tests run several agents in one process).
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.runtime.loop import Agent

log = logging.getLogger(__name__)


class MetricsSource(Protocol):
    def __call__(self) -> Iterable[Metric]: ...


def _rss_bytes(proc_root: str = "/proc") -> int | None:
    try:
        with open(f"{proc_root}/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


class LoopMetrics:
    """The loop's counters (AgentStats)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def __call__(self) -> Iterator[Metric]:
        s = self.agent.stats
        for name, doc, value in (
            ("proof_agent_ticks", "Collection intervals run", s.ticks),
            ("proof_agent_records", "Records collected", s.records),
            ("proof_agent_late_ticks", "Intervals started a whole interval late", s.late_ticks),
            ("proof_agent_sink_errors", "Sink calls that raised (the batch lost)", s.sink_errors),
            ("proof_agent_collection_cpu_seconds", "CPU seconds in collection", s.busy_s),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        cpu = CounterMetricFamily(
            "proof_agent_collector_cpu_seconds",
            "CPU seconds per collector (process time inside its collect())",
            labels=["collector"],
        )
        records = CounterMetricFamily(
            "proof_agent_collector_records", "Records per collector", labels=["collector"]
        )
        errors = CounterMetricFamily(
            "proof_agent_collector_errors", "Failed collect() calls", labels=["collector"]
        )
        for name, value in sorted(s.collector_cpu_s.items()):
            cpu.add_metric([name], value)
        for name, count in sorted(s.collector_records.items()):
            records.add_metric([name], count)
        for name, count in sorted(s.collector_errors.items()):
            errors.add_metric([name], count)
        yield cpu
        yield records
        yield errors


class ShippingMetrics:
    """Spool depth, batches sent and acked, and the ack lag, from the gRPC sink (and the
    spool behind it). Read through attributes the sink keeps anyway; a sink without them
    (a trace file, the print sink) gives none of these."""

    def __init__(self, sink: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.clock = clock
        self._acked: int | None = None
        self._acked_at = clock()

    def __call__(self) -> Iterator[Metric]:
        sink = self.sink
        spool = getattr(sink, "spool", None)
        if spool is not None:
            yield GaugeMetricFamily(
                "proof_agent_spool_batches",
                "Batches on disk waiting for ingest's ack",
                value=spool.pending_batches,
            )
            yield GaugeMetricFamily(
                "proof_agent_spool_bytes",
                "Bytes on disk waiting for an ack",
                value=spool.pending_bytes,
            )
            yield CounterMetricFamily(
                "proof_agent_spool_dropped_batches",
                "Oldest batches dropped at the spool cap",
                value=spool.dropped_batches,
            )
        sent = getattr(sink, "_last_sent", None)
        acked = getattr(sink, "_acked_through", None)
        if not isinstance(sent, int) or not isinstance(acked, int):
            return
        now = self.clock()
        if acked != self._acked:
            self._acked, self._acked_at = acked, now
        waiting = max(sent - acked, 0)
        yield CounterMetricFamily(
            "proof_agent_batches_sent", "Last batch sequence handed to the sender", value=sent
        )
        yield CounterMetricFamily(
            "proof_agent_batches_acked", "Last batch sequence ingest acknowledged", value=acked
        )
        yield GaugeMetricFamily(
            "proof_agent_unacked_batches", "Batches sent and not yet acknowledged", value=waiting
        )
        yield GaugeMetricFamily(
            "proof_agent_ack_lag_seconds",
            "Seconds since the acknowledged sequence last advanced while batches wait",
            value=(now - self._acked_at) if waiting else 0.0,
        )


def process_metrics(proc_root: str = "/proc") -> Iterator[Metric]:
    rss = _rss_bytes(proc_root)
    if rss is not None:
        yield GaugeMetricFamily(
            "proof_agent_process_resident_bytes", "The agent's resident memory", value=rss
        )


class AgentMetrics:
    """A prometheus_client collector over `MetricsSource`s; a source that raises is logged
    once and left out of that scrape, never failing the others."""

    def __init__(self, sources: list[MetricsSource]) -> None:
        self.sources = sources
        self._warned: set[int] = set()

    def collect(self) -> Iterator[Metric]:
        for i, source in enumerate(self.sources):
            try:
                yield from list(source())
            except Exception as exc:  # one broken source must not empty the scrape
                if i not in self._warned:
                    self._warned.add(i)
                    log.warning("agent metrics source %r failed: %s", source, exc)


def agent_registry(agent: Agent, sink: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    sources: list[MetricsSource] = [LoopMetrics(agent), ShippingMetrics(sink), process_metrics]
    registry.register(AgentMetrics(sources))
    return registry


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (`:9464` = all interfaces) → (host, port); ValueError naming what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port
        raise ValueError(f"[agent] metrics_address must be host:port, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 - ':port' asks for every interface


def serve_metrics(address: str, agent: Agent, sink: Any) -> Any:
    """Start `/metrics` on `address` in a daemon thread; returns the server (shutdown())."""
    host, port = parse_address(address)
    server, _thread = start_http_server(port, host, registry=agent_registry(agent, sink))
    log.info("agent metrics on http://%s:%d/metrics", host, server.server_port)
    return server
