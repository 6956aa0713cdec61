"""`proof analyze TRACE [--json]`: the detectors on a trace, without any server.

The trace is loaded into an in-memory `TraceStore` (the same read interface as ingest's
selectors); every job gets a `JobWindow` over its life and every GPU a fleet-health
`GpuWindow` over the trace. Human output: one block per verdict with its evidence table;
`--json`: exactly {"verdicts": [...]} on stdout. Progress and malformed-line reports go to
stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from investigations.detectors import run_detectors, run_fleet_health
from investigations.store import TraceStore
from investigations.verdicts import build_verdicts
from investigations.window import build_gpu_window, build_job_window


def analyze_store(store: TraceStore) -> list[dict[str, Any]]:
    verdicts: list[dict[str, Any]] = []
    faulted_gpus: set[str] = set()
    for job in sorted(store.jobs()):
        window = build_job_window(store, job)
        findings = run_detectors(window)
        faulted_gpus |= {f.subject["gpu"] for f in findings if f.family == "hardware_fault"}
        verdicts.extend(build_verdicts(findings, window))
    lo, hi = store.time_range()
    for gpu, node, index in store.gpus():
        if gpu in faulted_gpus:
            continue  # the failure already happened: hardware_fault says it
        gw = build_gpu_window(store, gpu, node, index, lo, hi)
        verdicts.extend(build_verdicts(run_fleet_health(gw), None))
    verdicts.sort(key=lambda v: (v["interval"]["start"], v["family"]))
    return verdicts


def analyze_trace(
    path: str, *, progress: bool = False, err: TextIO | None = None
) -> list[dict[str, Any]]:
    err = err or sys.stderr
    state = {"last": 0.0}

    def bar(done: int, total: int) -> None:
        now = time.monotonic()
        if now - state["last"] < 0.5 and done < total:
            return
        state["last"] = now
        frac = done / total if total else 1.0
        fill = int(frac * 30)
        err.write(f"\rreading {'#' * fill}{'.' * (30 - fill)} {frac:4.0%}")
        if done >= total:
            err.write("\n")
        err.flush()

    def problem(p: Any) -> None:
        err.write(f"{path}: skipped {p}\n")

    store = TraceStore.from_trace(path, progress=bar if progress else None, on_problem=problem)
    if store.problem_count > len(store.problems):
        err.write(f"{path}: {store.problem_count} malformed lines skipped in all\n")
    return analyze_store(store)


def format_verdict(v: dict[str, Any]) -> str:
    s = v["subject"]
    who = ", ".join(
        f"{k} {s[k]}" for k in ("job", "node", "gpu", "rank", "mount") if s[k] is not None
    )
    lines = [
        f"== {v['family']} ({v['category']}, confidence {v['confidence']:.2f}) — {v['title']}",
        f"   subject: {who}",
        f"   {v['summary']}",
        f"   recommendation: {v['recommendation']}",
    ]
    imp = v["impact"]
    if imp["slowdown_pct"] is not None or imp["gpu_hours_lost"] is not None:
        slow = "-" if imp["slowdown_pct"] is None else f"{imp['slowdown_pct']}%"
        lost = "-" if imp["gpu_hours_lost"] is None else imp["gpu_hours_lost"]
        lines.append(f"   impact: slowdown {slow}, GPU-hours lost {lost}")
    lines.append("   evidence:")
    lines.append(
        f"   {'id':<4} {'signal':<44} {'where':<28} {'observed':>14} {'baseline':>14}  note"
    )
    for e in v["evidence"]:
        where = "/".join(
            str(x)
            for x in (
                e["node"],
                e["gpu"] and e["gpu"][:12],
                None if e["rank"] is None else f"rank{e['rank']}",
            )
            if x
        ) or (e["job"] or "")
        lines.append(
            f"   {e['id']:<4} {e['signal'][:44]:<44} {where[:28]:<28} "
            f"{str(e['observed'])[:14]:>14} {str(e['baseline'])[:14]:>14}  {e['note'][:90]}"
        )
    for c in v["cleared"]:
        lines.append(
            f"   cleared: {c['check']}: {c['result']} [{', '.join(c['evidence'])}] {c['note']}"
        )
    lines.append(f"   {v['explanation']}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file (.jsonl or .jsonl.gz, format v1)")
    parser.add_argument("--json", action="store_true", help='print exactly {"verdicts": [...]}')
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        verdicts = analyze_trace(args.trace, progress=not args.no_progress and sys.stderr.isatty())
    except OSError as exc:
        print(f"proof analyze: cannot read {args.trace}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"verdicts": verdicts}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    if not verdicts:
        print("No verdict: nothing wrong found.")
        return 0
    print("\n\n".join(format_verdict(v) for v in verdicts))
    return 0
