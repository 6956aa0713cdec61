"""collective_hang without a GPU view of the ranks: read from the communication library's
own timeout (gloo on CPU, NCCL's watchdog), as torch 2.13.0 printed it here."""

from __future__ import annotations

import numpy as np

from contract.parsers import training as tp
from engine.detectors import run_detectors
from engine.tests.synthetic import T0, steps, window
from engine.window import JobWindow, LogEvent

GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete"
)


def _cpu_job(world: int = 2) -> JobWindow:
    w = window(world=world, steps=steps(3.0 - 0.05 * np.arange(9)))
    w.ranks = []  # a CPU job: no rank holds a GPU
    return w


def test_the_rank_that_did_not_time_out_is_the_one_that_never_arrived() -> None:
    w = _cpu_job()
    w.log_events.append(LogEvent(T0 + 120, tp.TRACEBACK_END, 0, GLOO))
    (f,) = run_detectors(w)
    assert f.family == "collective_hang" and f.category == "job"
    assert f.subject["rank"] == 1 and f.subject["job"] == "J1"
    assert "rank 0 timed out after 20 s waiting in a recv operation" in f.summary
    assert "after step 90" in f.summary and "rank 1, the only rank of 2" in f.summary
    assert f.interval == (T0 + 100, T0 + 120)
    assert [e.signal for e in f.evidence[:2]] == [
        "log: collective timeout",
        "log: last step before the hang",
    ]


def test_unnamed_ranks_give_the_job_alone_and_no_timeout_gives_nothing() -> None:
    w = _cpu_job(world=4)
    w.log_events.append(LogEvent(T0 + 120, tp.TRACEBACK_END, None, GLOO))
    (f,) = run_detectors(w)
    assert f.family == "collective_hang" and f.subject["rank"] is None
    assert "does not say which rank" in f.summary
    quiet = _cpu_job()
    quiet.log_events.append(LogEvent(T0 + 120, tp.TRACEBACK_END, 0, "ValueError: bad batch"))
    assert run_detectors(quiet) == []
