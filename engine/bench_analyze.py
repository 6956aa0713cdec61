"""`python -m engine.bench_analyze TRACE… [--runs N]`: where `proof analyze` spends its time.

Per run and phase, wall and CPU seconds (process CPU, which counts the thread that reads and
decompresses ahead, and the main thread's alone), and the load average, since wall figures on a
shared machine mean little without it:

- `decompress`: the trace's bytes only (gzip through zlib, as the loader reads them);
- `load`: `TraceStore.from_traces` — decompress, parse, group samples into series;
- `analyze`: windows, detectors and verdicts (`engine.analyze.analyze`) on the loaded store.

docs/scaling.md, "proof analyze at 64 GPUs", has the figures and the commands that made them.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.analyze import analyze
from engine.store import TraceStore
from engine.trace_load import read_pieces


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float, float]:
    w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
    out = fn()
    return (
        out,
        time.perf_counter() - w0,
        time.process_time() - c0,
        time.thread_time() - t0,
    )


def _drain(paths: Sequence[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as raw:
            for piece, _damage in read_pieces(raw):
                total += len(piece)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench_analyze")
    parser.add_argument("trace", nargs="+")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    for run in range(1, args.runs + 1):
        size, dw, dc, _ = _timed(lambda: _drain(args.trace))
        store, lw, lc, lt = _timed(lambda: TraceStore.from_traces(args.trace))
        result, aw, ac, _ = _timed(functools.partial(analyze, store))
        samples = sum(len(s.ts) for s in store._series)
        print(
            f"run {run}: {samples:,} samples, {size / 1e6:,.0f} MB of JSON | "
            f"decompress {dw:.2f} s wall {dc:.2f} s CPU | "
            f"load {lw:.2f} s wall {lc:.2f} s CPU ({lt:.2f} s main thread) | "
            f"analyze {aw:.2f} s wall {ac:.2f} s CPU | "
            f"load+analyze {lw + aw:.2f} s wall | "
            f"verdicts {[v['family'] for v in result.verdicts]} | "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
