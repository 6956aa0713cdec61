"""The collection-path benchmark: the real agent loop on one simulated GPU node, in real time.

`bench_collection()` simulates one node (default 8 GPUs, a healthy training job: its GPU,
process, fabric, storage and host series plus the job's log lines), then runs the agent —
sim collectors, identity join, sort, sink — on the wall clock at 1 Hz for `duration_s`, and
reports the CPU the loop used per wall second (cores), the peak RSS and how many series and
records flowed. The simulation itself is computed before the clock starts and is not counted:
on a real node that work is the hardware's. `proof-agent bench` prints it.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.runtime.base import AcceleratedClock, Record
from agent.runtime.loop import Agent
from agent.runtime.sim_backend import SimBackend


@dataclass
class CollectionBench:
    scenario: str
    gpus: int
    wall_s: float
    cpu_s: float
    ticks: int
    records: int
    series: int
    peak_rss_mib: float

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def lines(self) -> list[str]:
        return [
            f"scenario {self.scenario}, 1 node x {self.gpus} GPUs, {self.series} series, "
            f"{self.records} records in {self.ticks} intervals over {self.wall_s:.1f} s",
            f"collection path CPU: {self.cpu_s:.3f} s = {self.cores:.4f} cores",
            f"peak RSS: {self.peak_rss_mib:.1f} MiB",
        ]


class SeriesCountingSink:
    """Counts records and distinct series; keeps nothing else (a local sink for the bench)."""

    def __init__(self) -> None:
        self.records = 0
        self._series: set[tuple[Any, ...]] = set()

    @property
    def series(self) -> int:
        return len(self._series)

    def submit(self, records: Sequence[Record]) -> None:
        self.records += len(records)
        add = self._series.add
        for rec in records:
            if rec.get("type") == "sample":
                labels = rec.get("labels")
                add(
                    (
                        rec["name"],
                        rec.get("node"),
                        rec.get("gpu"),
                        rec.get("pid"),
                        tuple(sorted(labels.items())) if labels else None,
                    )
                )

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def bench_collection(
    *,
    duration_s: float = 60.0,
    gpus: int = 8,
    scenario: str = "healthy_training",
    seed: int = 1,
    interval_s: float = 1.0,
) -> CollectionBench:
    start_ts = float(int(time.time())) + 1.0
    backend = SimBackend.from_scenario(
        scenario,
        seed=seed,
        duration_s=duration_s,
        start_ts=start_ts,
        nodes=1,
        gpus_per_node=gpus,
    )
    sink = SeriesCountingSink()
    clock = AcceleratedClock(start_ts, speed=1.0)
    agent = Agent(backend.collectors(), sink, clock=clock, interval=interval_s)
    wall0, cpu0 = time.monotonic(), time.process_time()
    stats = agent.run(until=backend.end_ts)
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    agent.close()
    return CollectionBench(
        scenario=scenario,
        gpus=gpus,
        wall_s=wall,
        cpu_s=cpu,
        ticks=stats.ticks,
        records=sink.records,
        series=sink.series,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
