"""`python -m workloads.report [--out-dir D] [NAME …]`: record the suite's runs and print what
Proof said about each, as the markdown table of docs/detectors.md ("Real runs").

Each run is `proof-agent exec --out D/NAME.jsonl -- CMD` then `proof analyze --json`; the
traces stay in D for `proof analyze D/NAME.jsonl`. Without names, every run of
`workloads.runs.RECORDED`. Exit status 1 when any run's verdicts differ from what a user
expects (for a family that needs a GPU: anything but that family or no verdict).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from workloads.harness import Run, record_exec
from workloads.runs import RECORDED, RecordedRun


def as_expected(spec: RecordedRun, run: Run) -> bool:
    got = run.families
    if spec.visible_on_cpu:
        return got == sorted(spec.expected)
    return set(got) <= set(spec.expected)


def row(spec: RecordedRun, run: Run) -> str:
    expected = ", ".join(spec.expected) or "no verdict"
    if not spec.visible_on_cpu:
        expected += " (needs a GPU: that or no verdict)"
    said = run.analysis.said() if run.analysis else f"(no trace; exit {run.rc})"
    jobs = run.jobs
    seen = (
        "; ".join(
            f"{str(j.get('job')).split('-')[0]}-…, ranks {j.get('ranks')}, {j.get('state')}"
            for j in jobs
        )
        if jobs
        else "no job"
    )
    ok = "yes" if as_expected(spec, run) else "**no**"
    return (
        f"| {spec.program} | {spec.fault} | `{run.command}` | {expected} | "
        f"{said.replace('|', '/')} | {seen} | {ok} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out-dir", default=None, help="where the traces go (default: a temp dir)")
    p.add_argument("names", nargs="*", help=f"runs (default: all): {', '.join(RECORDED)}")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in RECORDED]
    if unknown:
        p.error(f"unknown run(s) {', '.join(unknown)}; the runs are {', '.join(RECORDED)}")
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="proof-workloads-"))
    out.mkdir(parents=True, exist_ok=True)
    names = args.names or list(RECORDED)
    print(f"traces in {out}")
    print("| program | fault | command | expected | Proof said | job seen | as expected |")
    print("|---|---|---|---|---|---|---|")
    failed = 0
    t0 = time.monotonic()
    for name in names:
        spec = RECORDED[name]
        run = record_exec(name, spec.argv(out), out, timeout=spec.timeout_s)
        failed += not as_expected(spec, run)
        print(row(spec, run), flush=True)
    print(f"\n{len(names)} runs in {time.monotonic() - t0:.0f} s; {failed} not as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
