"""`proof-agent validate TRACE`: check a trace against format v1 (docs/design.md §5).

Prints the meta line, the count of records per type and every problem with its line number;
exits 1 when there is any problem, 0 otherwise. A record that breaks a limit of contract/limits.py
(a NUL, a line over 16384 characters, a GPU id over 96, …) is a problem too — the same rules
the agent cleans to and ingest checks — but it is counted with its type (readers take it,
cleaned), and the summary says how many were cleaned.
"""

from __future__ import annotations

import argparse
import json
import sys

from contract.trace import validate_trace
from contract.trace.reader import MAX_KEPT_PROBLEMS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file (.jsonl or .jsonl.gz; gzip is detected)")
    parser.add_argument(
        "--quiet", action="store_true", help="print only the summary, not each problem"
    )


def run(args: argparse.Namespace) -> int:
    quiet = bool(args.quiet)

    def show(problem: object) -> None:
        if not quiet:
            print(f"{args.trace}: {problem}", file=sys.stderr)

    try:
        report = validate_trace(args.trace, on_problem=show)
    except OSError as exc:
        print(f"proof-agent validate: cannot read {args.trace}: {exc}", file=sys.stderr)
        return 2
    meta = report.meta
    if meta is not None:
        brief = {k: v for k, v in meta.items() if k != "truth"}
        print(f"meta: {json.dumps(brief, sort_keys=True)}")
        if "truth" in meta:
            print(f"truth: {json.dumps(meta['truth'], sort_keys=True)}")
    print(f"lines: {report.lines}")
    for rtype, count in sorted(report.counts.items()):
        print(f"{rtype}: {count}")
    if report.problem_count > MAX_KEPT_PROBLEMS and not quiet:
        print(f"(only the first {MAX_KEPT_PROBLEMS} problems were kept)", file=sys.stderr)
    if report.cleaned:
        print(f"cleaned: {report.cleaned} (records over a limit; read on cleaned)")
    print(f"problems: {report.problem_count}")
    return 0 if report.ok else 1
