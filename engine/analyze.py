"""`proof analyze TRACE… [--json]`: the detectors on a trace, without any server.

The trace (or several: the per-rank traces of one run are read as one) is loaded into an
in-memory `TraceStore` (the same read interface as ingest's selectors); every job gets a
`JobWindow` over its life and every GPU a fleet-health `GpuWindow` over the trace.

Output says what was seen as well as what was found, so "no verdict" is told apart from "saw
nothing": `--json` prints {"verdicts": [...], "jobs": [...]} — docs/design.md §7's verdicts, and one
summary per job seen (docs/verdicts.md, "proof analyze"): its id, kind, state and exit code,
nodes, ranks, the training steps and the time span seen, and its verdicts' families. Human
output: one line per job, then one block per verdict with its evidence table. Progress and
malformed-line reports go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import numpy as np

from contract import signals
from contract.identity import inference_server
from contract.rows import JobMeta, ProcessInfo
from engine.detectors import run_detectors, run_fleet_health
from engine.store import TERMINAL_STATES, TraceStore
from engine.verdicts import build_verdicts
from engine.window import JobWindow, build_gpu_window, build_job_window, job_span


@dataclass
class Analysis:
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    start: float | None = None  # the trace's first timestamp

    def to_json(self) -> dict[str, Any]:
        return {"verdicts": self.verdicts, "jobs": self.jobs}


def analyze_store(store: TraceStore) -> list[dict[str, Any]]:
    return analyze(store).verdicts


def analyze(store: TraceStore, t1: float | None = None) -> Analysis:
    """Every job's and GPU's verdicts; with `t1`, on the data up to `t1` only (a prefix of the
    trace, as a live evaluation at `t1` sees it: jobs not yet seen are skipped, windows end at
    `t1`). Records that describe a job as a whole (its end state) are read as stored."""
    verdicts: list[dict[str, Any]] = []
    faulted_gpus: set[str] = set()
    windows: dict[str, JobWindow] = {}
    for job in sorted(store.jobs()):
        if t1 is None:
            window = build_job_window(store, job)
        else:
            a, b = job_span(store, job)
            if a > t1:
                continue
            window = build_job_window(store, job, t1=min(b, t1))
        windows[job] = window
        findings = run_detectors(window)
        faulted_gpus |= {f.subject["gpu"] for f in findings if f.family == "hardware_fault"}
        verdicts.extend(build_verdicts(findings, window))
    lo, hi = store.time_range()
    if t1 is not None:
        hi = min(hi, t1)
    for gpu, node, index in store.gpus():
        if gpu in faulted_gpus:
            continue  # the failure already happened: hardware_fault says it
        gw = build_gpu_window(store, gpu, node, index, lo, hi)
        verdicts.extend(build_verdicts(run_fleet_health(gw), None))
    verdicts.sort(key=lambda v: (v["interval"]["start"], v["family"]))
    jobs = [job_summary(store, w, verdicts) for _job, w in sorted(windows.items())]
    return Analysis(verdicts, jobs, lo if math.isfinite(lo) else None)


def job_summary(
    store: TraceStore, window: JobWindow, verdicts: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """What the trace showed of one job, whether or not anything was found wrong with it."""
    job, meta = window.job, window.meta
    procs = store.processes(job)
    ranks = {p.rank for p in procs if p.rank is not None}
    ranks |= {r.rank for r in window.ranks}
    ranks |= {row.rank for row in store.job_logs(job, -math.inf, math.inf) if row.rank is not None}
    steps = window.steps.step[np.isfinite(window.steps.step)] if len(window.steps) else None
    times = [t for t in (meta.first_ts, meta.last_ts, meta.end_ts) if t is not None]
    times += [p.first_ts for p in procs] + [p.exit_ts for p in procs if p.exit_ts is not None]
    times = [t for t in times if math.isfinite(t)]
    state, exit_code = _job_state(store, meta, procs)
    if meta.kind_recorded:
        kind = meta.kind
    elif window.inference or any(inference_server(_argv(p.cmd)) for p in procs):
        kind = "inference"
    elif len(window.steps) or window.checkpoints:
        kind = "training"
    else:
        kind = "unknown"
    return {
        "job": job,
        "kind": kind,
        "state": state,
        "exit_code": exit_code,
        "nodes": sorted(set(meta.nodes) | {p.node for p in procs if p.node}),
        "world_size": meta.world_size
        if meta.world_size is not None
        else max((p.world_size for p in procs if p.world_size is not None), default=None),
        "ranks": sorted(ranks),
        "processes": len(procs),
        "steps": {
            "first": int(steps.min()) if steps is not None and len(steps) else None,
            "last": int(steps.max()) if steps is not None and len(steps) else None,
            "count": len(np.unique(steps)) if steps is not None else 0,
            # progress lines that printed a loss: a Trainer writing metric dicts without a
            # bar prints no step number, which is not "saw no training"
            "logged": len(window.steps.with_loss()) if len(window.steps) else 0,
        },
        "interval": {"start": min(times), "end": max(times)} if times else None,
        "verdicts": [v["family"] for v in verdicts if v["subject"]["job"] == job],
    }


def _argv(cmd: Any) -> list[str]:
    if isinstance(cmd, list):
        return [str(c) for c in cmd]
    return str(cmd or "").split()


def _job_state(
    store: TraceStore, meta: JobMeta, procs: Sequence[ProcessInfo]
) -> tuple[str, int | None]:
    """The job's state: what a job record said it ended as; else from its processes' exit
    codes when every one of them was seen to exit; `ended` when they were all seen gone with
    no exit code (the node agent is not their parent); else `running`."""
    if meta.state in TERMINAL_STATES:
        return meta.state, meta.exit_code
    codes = [p.exit_code for p in procs if p.exit_code is not None]
    if procs and len(codes) == len(procs):
        failed = [c for c in codes if c != 0]
        return ("failed", failed[0]) if failed else ("completed", 0)
    gone = sum(
        1
        for node in {p.node for p in procs}
        for e in store.events(node=node, t0=-math.inf, t1=math.inf)
        if e.name == signals.EVENT_PROCESS_GONE and e.job == meta.job
    )
    if procs and len(codes) + gone >= len(procs):
        return "ended", None
    return meta.state, meta.exit_code


def analyze_trace(
    path: str | Sequence[str], *, progress: bool = False, err: TextIO | None = None
) -> list[dict[str, Any]]:
    return analyze_traces(path, progress=progress, err=err).verdicts


def analyze_traces(
    path: str | Sequence[str], *, progress: bool = False, err: TextIO | None = None
) -> Analysis:
    paths = [path] if isinstance(path, str) else list(path)
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

    def problem(where: str, p: Any) -> None:
        err.write(f"{where}: skipped {p}\n")

    store = TraceStore.from_traces(paths, progress=bar if progress else None, on_problem=problem)
    if store.problem_count > len(store.problems):
        err.write(f"{', '.join(paths)}: {store.problem_count} malformed lines skipped in all\n")
    return analyze(store)


def _clock(ts: float, start: float) -> str:
    s = max(0, round(ts - start))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_job(j: dict[str, Any], start: float | None) -> str:
    """One line per job: `job ID: KIND, N ranks (…), steps A–B (C seen), T0–T1, STATE — …`."""
    parts = [j["kind"]]
    ranks = j["ranks"]
    if ranks:
        shown = ", ".join(str(r) for r in ranks[:8]) + (", …" if len(ranks) > 8 else "")
        parts.append(f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''} ({shown})")
    else:
        parts.append("no rank seen")
    st = j["steps"]
    if st["count"]:
        parts.append(f"steps {st['first']}–{st['last']} ({st['count']} seen)")
    elif st.get("logged"):
        parts.append(f"{st['logged']} progress lines seen (no step numbers printed)")
    else:
        parts.append("no training step seen")
    if j["interval"] is not None and start is not None:
        iv = j["interval"]
        parts.append(f"{_clock(iv['start'], start)}–{_clock(iv['end'], start)}")
    state, code = j["state"], j["exit_code"]
    if state == "running":
        parts.append("still running at the end of the trace")
    elif state == "ended":
        parts.append("ended, exit code unknown")
    else:
        parts.append(state if code is None else f"{state}, exit {code}")
    found = j["verdicts"]
    tail = (
        "no verdict"
        if not found
        else f"{len(found)} verdict{'s' if len(found) != 1 else ''}: {', '.join(found)}"
    )
    return f"job {j['job']}: {', '.join(parts)} — {tail}"


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
    parser.add_argument(
        "trace",
        nargs="+",
        help="trace file(s) (.jsonl or .jsonl.gz, format v1); several are read as one run",
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"verdicts": [...], "jobs": [...]}'
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    paths = [args.trace] if isinstance(args.trace, str) else list(args.trace)
    try:
        result = analyze_traces(paths, progress=not args.no_progress and sys.stderr.isatty())
    except OSError as exc:
        print(f"proof analyze: cannot read {exc.filename or paths[0]}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result.to_json(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    if result.jobs:
        if result.start is None:  # cannot be: a trace with jobs has records
            raise RuntimeError("jobs seen but no start time")
        when = datetime.fromtimestamp(result.start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"Jobs seen (times from the start of the trace, {when}):")
        for j in result.jobs:
            print("  " + format_job(j, result.start))
    else:
        print("No job seen: no process, log line or job record in the trace names a job.")
    print()
    if not result.verdicts:
        print("No verdict: nothing wrong found.")
        return 0
    print("\n\n".join(format_verdict(v) for v in result.verdicts))
    return 0
