"""A simulated fault and the detectors' verdict on it, through the real simulate → trace file →
TraceStore → analyze path: what the investigator explains."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine.analyze import analyze
from engine.store import TraceStore
from engine.window import JobWindow, build_job_window
from simulator import simulate


@dataclass
class Case:
    trace: Path
    verdict: dict[str, Any]
    window: JobWindow


@pytest.fixture(scope="session")
def slow_rank(tmp_path_factory: pytest.TempPathFactory) -> Case:
    path = tmp_path_factory.mktemp("explain") / "slow_rank.jsonl.gz"
    simulate("slow_rank", seed=0, duration_s=600, nodes=2, gpus_per_node=4).write(str(path))
    store = TraceStore.from_trace(str(path))
    verdicts = [v for v in analyze(store).verdicts if v["family"] == "slow_rank"]
    assert len(verdicts) == 1, [v["family"] for v in analyze(store).verdicts]
    verdict = verdicts[0]
    return Case(path, verdict, build_job_window(store, verdict["subject"]["job"]))
