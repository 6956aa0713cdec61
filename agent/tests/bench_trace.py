"""Benchmark of trace writing and reading: the simulator's worst case, 64 GPUs × every GPU
signal × 1800 one-second instants (~2.5 M samples), through `write_samples`.

    .venv/bin/python -m agent.tests.bench_trace [--seconds 1800] [--dir /tmp]

Prints records/s and file size for a plain file, gzip level 1 (the writer's default) and gzip
level 6, then the validating reader's records/s on the gzip file. Not a test: figures for notes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from contract import signals
from contract.trace import SampleColumns, TraceWriter, validate_trace

T0 = 1767225600.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=1800)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    n = args.gpus
    columns = SampleColumns(
        n,
        node=[f"node-{i // 8:02d}" for i in range(n)],
        gpu=[f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(n)],
        gpu_index=[i % 8 for i in range(n)],
    )
    names = list(signals.GPU_SIGNALS)
    rng = np.random.default_rng(0)
    # Values rounded as the simulator rounds them (ratios to 4 places, watts to 0.1).
    values = np.round(rng.random((len(names), n)) * 100, 3)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        gz_path = ""
        for label, name, level in (
            ("plain", "t.jsonl", 1),
            ("gzip 1", "t1.jsonl.gz", 1),
            ("gzip 6", "t6.jsonl.gz", 6),
        ):
            path = os.path.join(tmp, name)
            started = time.perf_counter()
            with TraceWriter(path, {"bench": True}, compresslevel=level) as w:
                for s in range(args.seconds):
                    for j, signal in enumerate(names):
                        w.write_samples(T0 + s, signal, values[j], columns)
            took = time.perf_counter() - started
            print(
                f"write {label:7s}: {w.records_written} records in {took:.2f} s "
                f"= {w.records_written / took:,.0f} records/s, "
                f"{os.path.getsize(path) / 1e6:.1f} MB"
            )
            if level == 1 and name.endswith(".gz"):
                gz_path = path
        started = time.perf_counter()
        report = validate_trace(gz_path)
        took = time.perf_counter() - started
        print(
            f"read+validate gzip: {report.records} records in {took:.2f} s "
            f"= {report.records / took:,.0f} records/s, problems {report.problem_count}"
        )


if __name__ == "__main__":
    main()
