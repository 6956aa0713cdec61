"""`proof replay TRACE --server HOST:PORT --token T [--speed X | --as-fast-as-possible]`.

Sends a trace (format v1) through the real gRPC path, exactly as an agent would: the records
are encoded into batches by the agent's BatchBuilder and delivered by its BatchSender (window,
acks, resend on a broken stream).

Time: ingest accepts samples from the last PROOF_INGEST_MAX_AGE_S (7 days) up to a few minutes
ahead, and recorded traces are usually older, so timestamps are moved by one constant offset:
at --speed 1 (or slower) the trace starts now and plays like a live agent; faster, or as fast
as possible, it is placed to end now. --keep-time sends the original times.

Dirty records: the trace reader reports a record that breaks a limit of contract/limits.py (a NUL,
a 26 KB line, a GPU id over 96 characters) and hands it on cleaned, and the encoder cleans the
rest the same way, so a replayed trace is never refused for a limit; the summary says how many
records were cleaned (`proof-agent validate TRACE` lists them with their line numbers).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from contract.trace.reader import TraceReader
from contract.wire.client import BatchSender, TlsConfig, open_channel
from contract.wire.encode import BatchBuilder


@dataclass
class ReplayReport:
    agent_id: str
    batches: int = 0
    samples: int = 0
    records: int = 0
    dropped_non_finite: int = 0
    offset_s: float = 0.0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    duplicates: int = 0
    problems: int = 0
    cleaned: int = 0  # records over a limit, sent cleaned
    records_refused: int = 0  # records ingest refused alone (their batches stored)
    elapsed_s: float = 0.0


def _trace_span(path: str) -> tuple[float | None, float | None]:
    first = last = None
    for rec in TraceReader(path):
        ts = rec.get("ts")
        if isinstance(ts, int | float):
            first = ts if first is None else first
            last = ts
    return first, last


def replay(
    path: str,
    sender: BatchSender,
    *,
    agent_id: str,
    speed: float | None = None,
    batch_seconds: float = 10.0,
    max_batch_samples: int = 100_000,
    keep_time: bool = False,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    flush_timeout: float | None = 600.0,
) -> ReplayReport:
    """Replay `path` through `sender`; `speed` None means as fast as possible."""
    report = ReplayReport(agent_id=agent_id)
    first, last = _trace_span(path)
    if first is None or last is None:
        return report
    if not keep_time:
        start_at = now() if speed is not None and speed <= 1 else now() - (last - first) - 1.0
        report.offset_s = start_at - first
    builder = BatchBuilder(agent_id)
    sequence = 0
    batch_start: float | None = None
    wall_start = time.monotonic()

    def cut() -> None:
        nonlocal sequence, batch_start
        if len(builder):
            sequence += 1
            report.samples += builder.samples
            report.records += builder.records
            sender.send(builder.build(sequence))
            report.batches += 1
        batch_start = None

    reader = TraceReader(path)
    for rec in reader:
        ts = rec.get("ts")
        if not isinstance(ts, int | float):
            continue
        if batch_start is not None and (
            ts - batch_start >= batch_seconds or builder.samples >= max_batch_samples
        ):
            cut()
        if speed is not None:
            due = wall_start + (ts - first) / speed
            wait = due - time.monotonic()
            if wait > 0:
                cut()  # what is due now goes out before waiting
                sleep(wait)
        if batch_start is None:
            batch_start = ts
        if report.offset_s:
            rec = {**rec, "ts": ts + report.offset_s}
        builder.add(rec)
    cut()
    sender.flush(flush_timeout)
    report.problems = reader.problem_count
    report.cleaned = reader.cleaned
    report.records_refused = sender.stats.records_refused
    report.dropped_non_finite = builder.dropped
    report.rejected = list(sender.stats.rejected)
    report.duplicates = sender.stats.duplicates
    report.elapsed_s = time.monotonic() - wall_start
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file (.jsonl or .jsonl.gz, format v1)")
    parser.add_argument("--server", required=True, help="ingest server HOST:PORT")
    parser.add_argument("--token", required=True, help="agent token")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=None, help="replay X times real time")
    pace.add_argument("--as-fast-as-possible", action="store_true", help="no pacing (the default)")
    parser.add_argument("--agent-id", default=None, help="default: a fresh replay-… id")
    parser.add_argument("--batch-seconds", type=float, default=10.0)
    parser.add_argument("--keep-time", action="store_true", help="send the original timestamps")
    parser.add_argument("--tls", action="store_true", help="TLS (default for non-loopback)")
    parser.add_argument("--ca-cert", default=None, help="PEM CA bundle to verify the server")
    parser.add_argument("--window", type=int, default=8, help="batches in flight")


def run(args: argparse.Namespace) -> int:
    if args.speed is not None and args.speed <= 0:
        print("proof replay: --speed must be positive", file=sys.stderr)
        return 2
    host = args.server.rsplit(":", 1)[0].strip("[]")
    loopback = host in ("localhost", "127.0.0.1", "::1")
    tls = TlsConfig(root_cert=args.ca_cert) if (args.tls or args.ca_cert or not loopback) else None
    sender = BatchSender(open_channel(args.server, tls), args.token, window=args.window)
    agent_id = args.agent_id or f"replay-{uuid.uuid4().hex[:12]}"
    try:
        report = replay(
            args.trace,
            sender,
            agent_id=agent_id,
            speed=None if args.as_fast_as_possible else args.speed,
            batch_seconds=args.batch_seconds,
            keep_time=args.keep_time,
        )
    except (PermissionError, TimeoutError, OSError) as exc:
        print(f"proof replay: {exc}", file=sys.stderr)
        return 1
    finally:
        sender.close(timeout=5)
    rate = report.samples / report.elapsed_s if report.elapsed_s else 0.0
    print(
        f"replayed {args.trace} as {agent_id}: {report.batches} batches, {report.samples} samples, "
        f"{report.records} other records in {report.elapsed_s:.1f} s ({rate:,.0f} samples/s); "
        f"time offset {report.offset_s:+.0f} s; {report.duplicates} duplicates"
    )
    if report.problems:
        print(
            f"  {report.problems} problem(s) in the trace ({report.cleaned} record(s) over a "
            f"limit sent cleaned); `proof-agent validate {args.trace}` lists them",
            file=sys.stderr,
        )
    if report.records_refused:
        print(f"  ingest refused {report.records_refused} record(s) alone", file=sys.stderr)
    for seq, why in report.rejected:
        print(f"  batch {seq} rejected: {why}", file=sys.stderr)
    return 1 if report.rejected else 0
