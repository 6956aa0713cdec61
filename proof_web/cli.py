"""`proof`: the server-side command.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; modules are imported only when their subcommand runs, so e.g.
`proof simulate` needs no database and `proof --help` stays fast.
"""

from __future__ import annotations

import os
import sys

from contract import cli

DESCRIPTION = (__doc__ or "").splitlines()[0]

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
    "bench": (
        "proof_web.commands.bench",
        "benchmarks: `proof bench ingest` (throughput, latency, footprint), `proof bench live` "
        "(onset → verdict delay, detection CPU), `proof bench console` (page server time)",
    ),
    # engine.analyze / engine.evaluation, plus --explain (the investigator sits above the engine,
    # so its flag is wired in the command layer)
    "analyze": ("proof_web.commands.analyze", "run the detectors on a trace file, print verdicts"),
    "eval": ("proof_web.commands.eval", "score the detectors on every simulator scenario"),
    "billing": (
        "proof_web.commands.billing",
        "metering and licences: `proof billing usage --month YYYY-MM [--operator SLUG]`, "
        "meter, chargeback, export (signed usage report), licence, keygen",
    ),
    "simulate": ("simulator.cli", "write a simulated GPU-fleet trace for a scenario (no database)"),
}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")
    return cli.dispatch("proof", DESCRIPTION, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
