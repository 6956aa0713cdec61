"""`proof bench TARGET`: the benchmarks, one module each.

- `proof bench ingest` (ingest/bench.py): ingest throughput, ack latency, footprint, reads.
- `proof bench live` (proof_web/commands/bench_live.py): onset → verdict delay per detector
  family through the whole live path, and the detection CPU per 1,000 GPUs.
- `proof bench console` (proof_web/commands/bench_console.py): server time and queries of
  every console page on a seeded 10,000-GPU fleet.
- `proof bench screen` (proof_web/commands/bench_screen.py): the batch screen's CPU per
  stored batch.
- `proof bench scale` (proof_web/commands/bench_scale.py): N ingest processes × M Celery
  worker processes on this machine, side by side: samples/s and verdict latency (docs/scaling.md).
- `proof bench fleet-health` (proof_web/commands/bench_fleet_health.py): the days-ahead
  forecast on a simulated fleet over weeks: failures flagged >= 48 h ahead, lead time, false
  drains, the cost of one pass over 10,000 GPUs.

Each target's module adds its own options (`add_arguments`) and runs (`run`); neither sets
Django up before it runs.
"""

from __future__ import annotations

import argparse
import importlib

# target -> (module, one-line help)
TARGETS: dict[str, tuple[str, str]] = {
    "ingest": ("ingest.bench", "ingest throughput, ack latency, bytes per sample, read speed"),
    "live": (
        "proof_web.commands.bench_live",
        "onset → verdict delay per family through agents, ingest and workers; detection CPU",
    ),
    "console": (
        "proof_web.commands.bench_console",
        "p50/p95 server time and queries of every console page on a seeded 10,000-GPU fleet",
    ),
    "screen": (
        "proof_web.commands.bench_screen",
        "the batch screen's CPU per stored batch, per series and per 1,000 GPUs",
    ),
    "scale": (
        "proof_web.commands.bench_scale",
        "N ingest processes × M Celery workers side by side: samples/s and verdict latency",
    ),
    "fleet-health": (
        "proof_web.commands.bench_fleet_health",
        "days-ahead forecast on a fleet over weeks: failures flagged >= 48 h ahead, lead time, "
        "false drains per 1,000 GPU-months, cost of one pass over 10,000 GPUs",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, (module_path, help_text) in TARGETS.items():
        target = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module_path).add_arguments(target)


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(TARGETS[args.target][0])
    return int(module.run(args) or 0)
