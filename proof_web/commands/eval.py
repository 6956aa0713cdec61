"""`proof eval [...] [--explain]`: engine/evaluation.py, plus the investigation agent's scores.

Without `--explain` this is exactly `engine.evaluation` (wired here so the engine never
imports the investigator). With it, every verdict of every run (simulate → trace file → read →
analyze, as `proof eval` does) is also investigated and explained, and per family it prints:

- `first`: share of explanations the validator passed on the model's first try;
- `valid`: share published as validated model text (the rest fall back to the template);
- `fallback`: share published as the template text;
- `ruled`: ruled-out checks that match the verdict's own clearance (`clear` there) / all the
  model ruled out whose check the clearance covers;
- latency p50/p95 (seconds per verdict, the four checks and every model call), mean tokens
  (prompt + completion, all attempts).

`--explain-out FILE` writes one JSON line per investigated verdict (scenario, seed, family,
the investigation object, the published explanation, the first attempt's complaints) — the
source of docs/investigations.md's examples.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import evaluation
from engine.analyze import analyze
from engine.store import TraceStore
from engine.window import JobWindow, build_job_window
from investigator.model import EndpointRefused, ExplainUnavailable, Writer
from investigator.run import MODES, Investigation, investigate
from investigator.validate import CLEARANCE_OF
from proof_web.commands.analyze import add_explain_arguments, writer_from_args
from simulator import list_scenarios, simulate


@dataclass
class ExplainScore:
    n: int = 0
    first_try: int = 0
    validated: int = 0
    fallback: int = 0
    ruled_checked: int = 0  # ruled-out checks the verdict's clearance covers
    ruled_matching: int = 0  # … of which the clearance says clear
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    completion: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    positional: list[bool] = field(default_factory=list)

    def add(self, verdict: dict[str, Any], inv: Investigation) -> None:
        self.n += 1
        self.first_try += inv.first_try_valid
        self.validated += inv.validated
        self.fallback += inv.fallback
        self.seconds.append(inv.duration_s)
        self.tokens.append(inv.tokens["prompt"] + inv.tokens["completion"])
        self.prompt.append(inv.tokens["prompt"])
        self.completion.append(inv.tokens["completion"])
        self.cpu.append(inv.cpu_s)
        if inv.positional is not None:
            self.positional.append(inv.positional)
        clearance = {c["check"]: c["result"] for c in verdict.get("cleared") or []}
        for r in inv.ruled_out:
            covered = clearance.get(CLEARANCE_OF.get(str(r.get("check")), ""))
            if covered is not None:
                self.ruled_checked += 1
                self.ruled_matching += covered == "clear"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    evaluation.add_arguments(parser)
    add_explain_arguments(parser)
    parser.add_argument(
        "--explain-out", metavar="FILE", help="with --explain: one JSON line per verdict"
    )
    parser.add_argument(
        "--explain-mode",
        choices=MODES,
        help="with --explain: slots (the model picks evidence, the text is composed) or prose "
        "(the model writes it); default: the writer's (slots for the default model)",
    )


def _share(k: int, n: int) -> str:
    return f"{k / n:5.2f}" if n else f"{'-':>5}"


def format_scores(scores: dict[str, ExplainScore]) -> str:
    rows = [
        f"{'family':<22} {'first':>5} {'valid':>5} {'fallb':>5} {'ruled':>7} "
        f"{'p50 s':>6} {'p95 s':>6} {'cpu s':>6} {'prompt':>6} {'compl':>5}  n"
    ]
    total = ExplainScore()
    for fam in sorted(scores):
        s = scores[fam]
        total.n += s.n
        total.first_try += s.first_try
        total.validated += s.validated
        total.fallback += s.fallback
        total.ruled_checked += s.ruled_checked
        total.ruled_matching += s.ruled_matching
        total.seconds += s.seconds
        total.tokens += s.tokens
        total.prompt += s.prompt
        total.completion += s.completion
        total.cpu += s.cpu
        total.positional += s.positional
    for fam, s in [*sorted(scores.items()), ("all", total)]:
        if not s.n:
            continue
        p50, p95 = np.percentile(np.array(s.seconds), [50, 95])
        ruled = f"{s.ruled_matching}/{s.ruled_checked}"
        rows.append(
            f"{fam:<22} {_share(s.first_try, s.n)} {_share(s.validated, s.n)} "
            f"{_share(s.fallback, s.n)} {ruled:>7} {p50:6.1f} {p95:6.1f} "
            f"{np.mean(s.cpu):6.1f} {np.mean(s.prompt):6.0f} {np.mean(s.completion):5.0f}  {s.n}"
        )
    if total.positional:
        rows.append(
            f"slots: the model's evidence picks were the first ones offered, in order, on "
            f"{sum(total.positional)} of {len(total.positional)} validated verdicts"
        )
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    if not args.explain:
        return evaluation.run(args)
    try:
        writer: Writer = writer_from_args(args)
    except (ExplainUnavailable, EndpointRefused) as exc:
        print(f"proof eval --explain: {exc}", file=sys.stderr)
        return 2
    names = [s.name for s in list_scenarios()]
    if args.scenario:
        unknown = set(args.scenario) - set(names)
        if unknown:
            print(f"proof eval: unknown scenario(s) {sorted(unknown)}", file=sys.stderr)
            return 2
        names = [n for n in names if n in args.scenario]
    scores: dict[str, ExplainScore] = {}
    load0 = os.getloadavg()[0]
    loads: list[float] = []
    out = open(args.explain_out, "w") if args.explain_out else None  # noqa: SIM115
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="proof-eval-explain-") as tmp:
            for name in names:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    sim = simulate(
                        name,
                        seed=seed,
                        duration_s=args.duration,
                        nodes=args.nodes or None,
                        gpus_per_node=args.gpus_per_node or None,
                    )
                    path = os.path.join(tmp, f"{name}-{seed}.jsonl.gz")
                    sim.write(path)
                    store = TraceStore.from_trace(path)
                    os.unlink(path)
                    windows: dict[str, JobWindow] = {}
                    for verdict in analyze(store).verdicts:
                        job = verdict["subject"].get("job")
                        if job and job not in windows:
                            windows[job] = build_job_window(store, job)
                        inv = investigate(
                            verdict,
                            windows.get(job) if job else None,
                            writer,
                            mode=args.explain_mode,
                        )
                        scores.setdefault(verdict["family"], ExplainScore()).add(verdict, inv)
                        print(
                            f"{name:<28} seed={seed} {verdict['family']:<20} "
                            f"first={'ok' if inv.first_try_valid else 'no'} "
                            f"{'validated' if inv.validated else 'FALLBACK'} "
                            f"{inv.duration_s:.1f}s cpu {inv.cpu_s:.1f}s "
                            f"tokens {inv.tokens['prompt']}+{inv.tokens['completion']} "
                            f"load {os.getloadavg()[0]:.1f}",
                            file=sys.stderr,
                        )
                        loads.append(os.getloadavg()[0])
                        if out is not None:
                            out.write(
                                json.dumps(
                                    {
                                        "scenario": name,
                                        "seed": seed,
                                        "family": verdict["family"],
                                        "template": verdict["explanation"],
                                        "explanation": inv.explanation,
                                        "investigation": inv.as_dict(),
                                        "answers": [a.answer for a in inv.attempts],
                                    }
                                )
                                + "\n"
                            )
                            out.flush()
    except ExplainUnavailable as exc:
        print(f"proof eval --explain: {exc}", file=sys.stderr)
        return 2
    finally:
        if out is not None:
            out.close()
    print(format_scores(scores))
    print(
        f"{len(names) * args.seeds} runs, {args.seeds} seed(s), {args.duration:.0f} s traces, "
        f"model {writer.name}, {time.perf_counter() - t0:.0f} s, load average (1 min) "
        f"{load0:.1f} at the start, {min(loads, default=load0):.1f}–"
        f"{max(loads, default=load0):.1f} after each verdict, {os.cpu_count()} CPUs"
    )
    return 0
