"""`proof-agent record --out FILE`: run the agent and write what it collects as a trace.

    proof-agent record --out run.jsonl.gz --backend sim --scenario slow_rank --speed max \\
        --duration 600

    proof-agent record --out node.jsonl.gz --config /etc/proof-agent/proof-agent.toml \\
        --duration 60          # this node's real sources, for a minute

The records go through the same collectors, identity join and loop as `proof-agent run`; only
the sink differs (a trace file instead of the transport). Ctrl-C stops and closes the trace
cleanly.
"""

from __future__ import annotations

import argparse
import sys
import time

from agent.commands._backend import BackendError, add_backend_arguments, assemble
from agent.runtime import TraceSink
from agent.runtime.memory import peak_rss_mib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="trace file (.jsonl, or .jsonl.gz: gzip)")
    add_backend_arguments(parser, default_duration=600.0)


def run(args: argparse.Namespace) -> int:
    try:
        assembled = assemble(args)
    except BackendError as exc:
        print(f"proof-agent record: {exc}", file=sys.stderr)
        return 2
    try:
        sink = TraceSink(args.out, assembled.meta, truth=assembled.truth)
    except OSError as exc:
        print(f"proof-agent record: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    wall0, cpu0 = time.monotonic(), time.process_time()
    stats = assembled.run_agent(sink)
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    rss_mib = peak_rss_mib()
    print(
        f"wrote {sink.records_written} records in {stats.ticks} intervals to {args.out} "
        f"({wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss_mib:.0f} MiB)"
    )
    if sink.late_records or sink.invalid_records:
        print(
            f"late records re-stamped: {sink.late_records}; invalid dropped: {sink.invalid_records}"
        )
    if stats.collector_errors:
        print(f"collector errors: {stats.collector_errors}", file=sys.stderr)
    return 0
