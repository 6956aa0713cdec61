"""A window whose matrices were updated from the last one's (engine/window_grid.py, the live
pipeline's path) is cell for cell the window built whole from the same data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import simulator
from engine.store import TraceStore
from engine.window import JobWindow, build_job_window


def _same(a: JobWindow, b: JobWindow) -> None:
    assert np.array_equal(a.times, b.times)
    for kind in ("gpu", "proc"):
        da, db = getattr(a, kind), getattr(b, kind)
        assert da.keys() == db.keys(), kind
        for name in da:
            assert np.array_equal(da[name], db[name], equal_nan=True), (kind, name)
    assert (a.worker_cpu is None) == (b.worker_cpu is None)
    if a.worker_cpu is not None and b.worker_cpu is not None:
        assert np.array_equal(a.worker_cpu, b.worker_cpu, equal_nan=True)


def _jitter(records: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Samples moved off the grid by up to ±0.5 s in ms (ties exactly half way included), as
    agents on unsynchronised clocks send them."""
    rng = np.random.default_rng(seed)
    out = []
    for r in records:
        if r.get("type") == "sample":
            r = dict(r, ts=round(r["ts"] + float(rng.choice([-0.5, -0.2, 0.0, 0.3, 0.5])), 3))
        out.append(r)
    return out


def _updates(
    records: list[dict[str, Any]], job: str, ends: list[float], start: Any
) -> list[tuple[JobWindow, JobWindow]]:
    """(updated, whole) windows at each end: the store holds the records up to the end, the
    updated window comes from the previous one's matrices with the data changed from 15 s
    before the previous end (the live cache's overlap)."""
    pairs = []
    previous: JobWindow | None = None
    last_end: float | None = None
    for end in ends:
        store = TraceStore.from_records([r for r in records if r["ts"] <= end])
        t0 = start(end)
        whole = build_job_window(store, job, t0, end)
        updated = build_job_window(
            store,
            job,
            t0,
            end,
            reuse=previous.matrices if previous is not None else None,
            changed_from=None if last_end is None else last_end - 15.0,
        )
        pairs.append((updated, whole))
        previous, last_end = updated, end
    return pairs


@pytest.mark.parametrize("scenario", ["slow_rank", "fabric_degraded", "healthy_inference"])
def test_a_growing_window_updated_is_the_window_built_whole(scenario: str) -> None:
    run = simulator.simulate(scenario, seed=3, duration_s=240, nodes=2, gpus_per_node=4)
    records = _jitter(list(run.records()), seed=3)
    first = min(r["ts"] for r in records)
    job = next(iter(TraceStore.from_records(records).jobs()))
    ends = [first + t for t in (60.0, 75.0, 83.5, 120.0, 180.0, 240.0)]
    pairs = _updates(records, job, ends, start=lambda end: first)
    for updated, whole in pairs:
        _same(updated, whole)
    assert [u.matrices is not None and u.matrices.reused for u, _ in pairs] == [
        False,
        *([True] * (len(pairs) - 1)),
    ]


def test_a_window_whose_start_moves_by_whole_minutes_is_updated_and_the_same() -> None:
    run = simulator.simulate("checkpoint_stall", seed=1, duration_s=420, nodes=1, gpus_per_node=4)
    records = _jitter(list(run.records()), seed=1)
    first = float(min(r["ts"] for r in records))
    job = next(iter(TraceStore.from_records(records).jobs()))
    length = 180.0

    def start(end: float) -> float:  # as investigations.services.window_start, 180 s windows
        return first if end - first <= length else first + float((end - length - first) // 60) * 60

    ends = [first + t for t in (150.0, 200.0, 245.0, 300.0, 330.0, 420.0)]
    pairs = _updates(records, job, ends, start)
    for updated, whole in pairs:
        _same(updated, whole)
    # Updated each time, the start having moved by 0, 60 or 120 cells (1 s samples).
    assert all(u.matrices is not None and u.matrices.reused for u, _ in pairs[1:])
    assert pairs[-1][0].t0 > pairs[1][0].t0


def test_an_odd_shift_or_a_new_layout_builds_whole() -> None:
    run = simulator.simulate("slow_rank", seed=0, duration_s=200, nodes=1, gpus_per_node=4)
    records = _jitter(list(run.records()), seed=0)
    first = min(r["ts"] for r in records)
    store = TraceStore.from_records(records)
    job = next(iter(store.jobs()))
    a = build_job_window(store, job, first, first + 150)
    # Moved by 31 cells: a sample half way between two grid points could round the other way.
    b = build_job_window(
        store, job, first + 31, first + 180, reuse=a.matrices, changed_from=first + 140
    )
    assert b.matrices is not None and not b.matrices.reused
    _same(b, build_job_window(store, job, first + 31, first + 180))
    # No promise about what changed: whole.
    c = build_job_window(store, job, first, first + 190, reuse=a.matrices, changed_from=None)
    assert c.matrices is not None and not c.matrices.reused


def test_the_matrices_are_read_only() -> None:
    run = simulator.simulate("slow_rank", seed=0, duration_s=60, nodes=1, gpus_per_node=2)
    store = TraceStore.from_records(list(run.records()))
    window = build_job_window(store, next(iter(store.jobs())))
    matrix = next(iter(window.gpu.values()))
    with pytest.raises(ValueError, match="read-only"):
        matrix[0, 0] = 1.0
