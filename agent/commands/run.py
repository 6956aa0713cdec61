"""`proof-agent run`: the node agent — collect every interval, key, and ship to ingest.

    proof-agent run --config /etc/proof-agent/proof-agent.toml      # a real node (systemd)
    proof-agent run --backend sim --scenario slow_rank --speed 60 --server ingest:7443 --token T

The default backend, "node", reads every source the config enables (agent.runtime.
node_backend); the ingest address, token and spool come from its [server] and [spool]
sections, and `--server/--token/--spool-dir` override them.

With `--server` the records go to ingest over gRPC (the durable transport, with its on-disk
spool); with `--out` to a trace file; with neither, each interval's record counts are printed
(a dry run that shows the agent working). SIGTERM/SIGINT stop it cleanly after the current
interval.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from agent.commands._backend import BackendError, add_backend_arguments, assemble
from agent.runtime import Record, Sink, TraceSink

TRANSPORT_MODULE = "agent.transport.sink"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_arguments(parser, default_duration=3600.0)
    parser.add_argument("--server", default=None, help="ingest address HOST:PORT")
    parser.add_argument("--token", default=None, help="agent token (from the console)")
    parser.add_argument(
        "--spool-dir",
        default=None,
        help="on-disk spool for unacknowledged batches (transport default when omitted)",
    )
    parser.add_argument("--out", default=None, help="also/instead write a trace file")
    parser.add_argument(
        "--print-every",
        type=float,
        default=10.0,
        help="without --server/--out: print record counts every N clock seconds",
    )


class PrintSink:
    """Prints how many records of each type the agent produced, every `every` clock seconds."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.counts: Counter[str] = Counter()
        self.total = 0
        self._window_start: float | None = None

    def submit(self, records: Sequence[Record]) -> None:
        for rec in records:
            self.counts[rec.get("type", "?")] += 1
        self.total += len(records)
        if not records:
            return
        ts = records[-1]["ts"]
        if self._window_start is None:
            self._window_start = ts
        elif ts - self._window_start >= self.every:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
            print(f"ts {ts:.0f}: {parts}", flush=True)
            self.counts.clear()
            self._window_start = ts

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TeeSink:
    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def submit(self, records: Sequence[Record]) -> None:
        for sink in self.sinks:
            sink.submit(records)

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _transport_sink(
    args: argparse.Namespace, meta: dict[str, Any], extra: dict[str, Any] | None = None
) -> Sink:
    if not args.token:
        raise BackendError("--server needs --token (an agent token from the console)")
    try:
        module = importlib.import_module(TRANSPORT_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in (TRANSPORT_MODULE, "agent.transport"):
            raise
        raise BackendError(
            f"the gRPC transport ({TRANSPORT_MODULE}) is not available in this build yet; "
            "use --out FILE to record a trace instead"
        ) from exc
    factory = getattr(module, "make_sink", None)
    if factory is None:
        raise BackendError(f"{TRANSPORT_MODULE} has no make_sink(); transport not available yet")
    try:
        sink: Sink = factory(
            server=args.server,
            token=args.token,
            spool_dir=args.spool_dir,
            meta=meta,
            **(extra or {}),
        )
    except Exception as exc:  # grpc.RpcError and friends; grpc is imported only with --server
        details = getattr(exc, "details", None)
        why = details() if callable(details) else str(exc)
        raise BackendError(f"cannot start the transport to {args.server}: {why}") from exc
    return sink


def run(args: argparse.Namespace) -> int:
    try:
        assembled = assemble(args)
        cfg = assembled.config
        extra: dict[str, Any] = {}
        if cfg is not None:  # --backend node: the config's [server]/[spool] unless overridden
            args.server = args.server or cfg.server.address or None
            if args.server and not args.token:
                try:
                    args.token = cfg.resolved_token() or None
                except ValueError as exc:  # ConfigError: the token file cannot be read
                    raise BackendError(str(exc)) from exc
            args.spool_dir = args.spool_dir or cfg.spool.dir
            extra["spool_max_bytes"] = cfg.spool.max_mib << 20
            if args.server == cfg.server.address:  # the configured server: its TLS settings
                # gRPC (~0.1 s, ~20 MiB) only when shipping, as with TRANSPORT_MODULE above.
                from contract.wire.client import TlsConfig

                tls = cfg.server.tls
                extra["tls"] = TlsConfig(root_cert=cfg.server.ca_file or None) if tls else None
        sinks: list[Sink] = []
        if args.server:
            sinks.append(_transport_sink(args, assembled.meta, extra))
        if args.out:
            sinks.append(TraceSink(args.out, assembled.meta, truth=assembled.truth))
        if not sinks:
            sinks.append(PrintSink(args.print_every))
    except (BackendError, OSError) as exc:
        print(f"proof-agent run: {exc}", file=sys.stderr)
        return 2
    sink: Sink = sinks[0] if len(sinks) == 1 else TeeSink(sinks)
    metrics_address = cfg.agent.metrics_address if cfg is not None else ""
    try:
        stats = assembled.run_agent(sink, metrics_address=metrics_address)
    except (ValueError, OSError) as exc:  # a bad or busy metrics address
        print(f"proof-agent run: {exc}", file=sys.stderr)
        return 2
    print(
        f"agent stopped after {stats.ticks} intervals, {stats.records} records, "
        f"{stats.busy_s:.2f} s CPU in collection",
        flush=True,
    )
    if stats.collector_errors:
        print(f"collector errors: {stats.collector_errors}", file=sys.stderr)
    return 1 if _report_rejections(sinks) else 0


def _report_rejections(sinks: list[Sink]) -> int:
    """Batches ingest refused (`sender.stats.rejected` of the gRPC sink): they are not
    retried, so say so loudly rather than exit as if everything arrived."""
    total = 0
    for sink in sinks:
        sender_stats = getattr(getattr(sink, "sender", None), "stats", None)
        rejected = getattr(sender_stats, "rejected", None) or []
        if rejected:
            total += len(rejected)
            seq, why = rejected[0]
            print(
                f"proof-agent run: ingest rejected {len(rejected)} batch(es); "
                f"first, batch {seq}: {why}",
                file=sys.stderr,
            )
    return total
