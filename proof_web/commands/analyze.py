"""`proof analyze TRACE… [--json] [--explain]`: engine/analyze.py, plus the investigation agent.

Without `--explain` this is exactly `engine.analyze` (the engine stays pure: it never imports
the investigator, so the flag is wired here, in the command layer). With it, every verdict is
investigated on the same in-memory store the detectors read — job, node, fabric, storage —
and explained by the local model (or `--explain-endpoint`), every claim validated; the verdict
gains its `investigation` object and `explanation` holds the validated text (or the template,
marked fallback). Nothing leaves the machine unless an endpoint is given, and then only to
loopback or a private address (docs/investigations.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from engine import analyze as engine_analyze
from engine.store import TraceStore
from engine.window import JobWindow, build_job_window
from investigator.model import (
    EndpointRefused,
    ExplainUnavailable,
    LlamaCppWriter,
    OpenAICompatibleWriter,
    Writer,
    writer_from_env,
)
from investigator.run import investigate


def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--explain",
        action="store_true",
        help="investigate each verdict and explain it on the local model (docs/investigations.md)",
    )
    parser.add_argument(
        "--explain-model",
        metavar="GGUF",
        help="with --explain: this GGUF instead of the default (PROOF_EXPLAIN_MODEL_PATH)",
    )
    parser.add_argument(
        "--explain-endpoint",
        metavar="URL",
        help="with --explain: a local OpenAI-compatible server instead (PROOF_EXPLAIN_ENDPOINT)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    engine_analyze.add_arguments(parser)
    add_explain_arguments(parser)


def writer_from_args(args: argparse.Namespace) -> Writer:
    if args.explain_endpoint:
        return OpenAICompatibleWriter(args.explain_endpoint)
    if args.explain_model:
        return LlamaCppWriter(args.explain_model)
    return writer_from_env()


def explain_verdicts(
    verdicts: list[dict[str, Any]], store: TraceStore, writer: Writer, err: TextIO
) -> list[dict[str, Any]]:
    """Each verdict with its investigation, over its job's window as `analyze` built it."""
    windows: dict[str, JobWindow] = {}
    out = []
    for n, verdict in enumerate(verdicts, 1):
        job = verdict["subject"].get("job")
        window = None
        if job:
            if job not in windows:
                windows[job] = build_job_window(store, job)
            window = windows[job]
        inv = investigate(verdict, window, writer)
        state = "validated" if inv.validated else "fallback (template text)"
        err.write(
            f"explain {n}/{len(verdicts)} {verdict['family']}: {state}, "
            f"{len(inv.attempts)} attempt(s), {inv.duration_s:.1f} s\n"
        )
        out.append(inv.apply(verdict))
    return out


def run(args: argparse.Namespace) -> int:
    if not args.explain:
        return engine_analyze.run(args)
    paths = [args.trace] if isinstance(args.trace, str) else list(args.trace)
    try:
        writer = writer_from_args(args)
    except (ExplainUnavailable, EndpointRefused) as exc:
        print(f"proof analyze --explain: {exc}", file=sys.stderr)
        return 2

    def problem(where: str, p: Any) -> None:
        sys.stderr.write(f"{where}: skipped {p}\n")

    try:
        store = TraceStore.from_traces(paths, on_problem=problem)
    except OSError as exc:
        print(f"proof analyze: cannot read {exc.filename or paths[0]}: {exc}", file=sys.stderr)
        return 2
    result = engine_analyze.analyze(store)
    try:
        result.verdicts = explain_verdicts(result.verdicts, store, writer, sys.stderr)
    except ExplainUnavailable as exc:
        print(f"proof analyze --explain: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result.to_json(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    if result.jobs and result.start is not None:
        when = datetime.fromtimestamp(result.start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"Jobs seen (times from the start of the trace, {when}):")
        for j in result.jobs:
            print("  " + engine_analyze.format_job(j, result.start))
        print()
    if not result.verdicts:
        print("No verdict: nothing wrong found.")
        return 0
    blocks = []
    for v in result.verdicts:
        inv = v["investigation"]
        steps = "\n".join(
            f"   check {s['check']}: {s['returned']}\n      → {s['concluded']}"
            for s in inv["steps"]
        )
        mark = "validated" if inv["validated"] else "FALLBACK: template text"
        blocks.append(
            f"{engine_analyze.format_verdict(v)}\n   investigation ({inv['model']}, {mark}, "
            f"{inv['duration_s']} s):\n{steps}"
        )
    print("\n\n".join(blocks))
    return 0
