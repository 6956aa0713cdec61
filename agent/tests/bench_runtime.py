"""Benchmark of the agent's runtime core: CPU per interval for ~850 series at 1 Hz.

    .venv/bin/python -m agent.tests.bench_runtime [--ticks 600]

A synthetic collector builds each interval's records the way the real ones do (8 GPUs × 60
GPU-scope readings keyed by gpu/gpu_index; 8 ranks × 35 process readings keyed by pid only;
90 node readings), and the loop joins identity, sorts and hands them to a sink. Printed: CPU
seconds per interval (= cores used at 1 Hz) for the record building alone and for the whole
loop, with a memory sink and with a gzip trace sink. Not a test: the figures go in notes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence

from agent.runtime import AcceleratedClock, Agent, MemorySink, Record, Sink, TraceSink
from contract import signals

T0 = 1767225600.0
GPUS = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(8)]
PIDS = [41000 + i for i in range(8)]


class SyntheticNode:
    name = "synthetic"

    def __init__(self) -> None:
        self.n = 0
        gpu_names = [*signals.GPU_SIGNALS]
        self.gpu_names = (gpu_names * 3)[:60]
        self.proc_names = [f"proc.{i}" for i in range(35)]
        self.node_names = [f"node.{i}" for i in range(90)]

    def collect(self, now: float) -> list[Record]:
        self.n += 1
        out: list[Record] = []
        if self.n == 1:
            for i, pid in enumerate(PIDS):
                out.append(
                    {
                        "type": "process",
                        "ts": now,
                        "node": "bench-node",
                        "pid": pid,
                        "job": "5150",
                        "rank": i,
                        "local_rank": i,
                        "world_size": 8,
                        "gpu": GPUS[i],
                    }
                )
        v = float(self.n % 97) * 1.25
        for i, gpu in enumerate(GPUS):
            for name in self.gpu_names:
                out.append(
                    {
                        "type": "sample",
                        "ts": now,
                        "name": name,
                        "value": v,
                        "gpu": gpu,
                        "gpu_index": i,
                    }
                )
        for pid in PIDS:
            for name in self.proc_names:
                out.append({"type": "sample", "ts": now, "name": name, "value": v, "pid": pid})
        for name in self.node_names:
            out.append({"type": "sample", "ts": now, "name": name, "value": v})
        return out


class DiscardSink(MemorySink):
    def submit(self, records: Sequence[Record]) -> None:
        """Keep nothing: measure the loop, not a growing list."""


def measure(sink: Sink, ticks: int) -> tuple[float, int]:
    collector = SyntheticNode()
    agent = Agent([collector], sink, clock=AcceleratedClock(T0, speed=0), node="bench-node")
    cpu0 = time.process_time()
    agent.run(max_ticks=ticks)
    cpu = time.process_time() - cpu0
    agent.close()
    return cpu / ticks, agent.stats.records // ticks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=600)
    args = parser.parse_args()
    node = SyntheticNode()
    cpu0 = time.process_time()
    for i in range(args.ticks):
        node.collect(T0 + i)
    build = (time.process_time() - cpu0) / args.ticks
    per_tick, records = measure(DiscardSink(), args.ticks)
    print(f"records per interval: {records}")
    print(f"building the records alone:        {build * 1000:.2f} ms CPU/interval")
    print(f"loop + join + sort, discard sink:  {per_tick * 1000:.2f} ms CPU/interval")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.jsonl.gz")
        per_tick_trace, _ = measure(TraceSink(path), args.ticks)
        size = os.path.getsize(path)
    print(f"loop + join + sort, gzip trace:    {per_tick_trace * 1000:.2f} ms CPU/interval")
    print(
        f"cores used at 1 Hz: {per_tick:.4f} (discard sink), {per_tick_trace:.4f} (trace sink); "
        f"trace {size / args.ticks / 1024:.1f} KiB per interval"
    )


if __name__ == "__main__":
    main()
