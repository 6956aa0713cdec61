"""`proof`: the server-side command.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; modules are imported only when their subcommand runs, so e.g.
`proof simulate` needs no database and `proof --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("proof_web.commands.demo", "set up the embedded stack with demo data and serve it"),
    "setup-db": (
        "proof_web.commands.setup_db",
        "create the PostgreSQL owner/app roles and database (production and CI)",
    ),
    "manage": ("proof_web.commands.manage", "run a Django management command"),
    "ingest": ("proof_web.commands.ingest", "run the ingest gRPC server agents stream to"),
    "replay": ("contract.wire.replay", "send a trace to an ingest server as an agent would"),
    "bench": ("ingest.bench", "benchmarks: `proof bench ingest` (throughput, latency, footprint)"),
    "analyze": ("engine.analyze", "run the detectors on a trace file, print verdicts"),
    "eval": ("engine.evaluation", "score the detectors on every simulator scenario"),
    "simulate": ("simulator.cli", "write a simulated GPU-fleet trace for a scenario (no database)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="proof", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module_path, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")
    if not argv or argv[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0 if argv else 2
    name = argv[0]
    if name not in SUBCOMMANDS:
        build_parser().print_help(sys.stderr)
        print(f"\nproof: unknown command {name!r}", file=sys.stderr)
        return 2
    module_path, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_path)
    parser = argparse.ArgumentParser(prog=f"proof {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
