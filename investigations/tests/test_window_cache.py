"""The worker's cache of each job's recent data (investigations/window_cache.py): what it serves
after delta reads is exactly what a full read of storage gives, late batches included."""

from __future__ import annotations

import time

import numpy as np
import pytest

from contract import signals
from contract.rows import SeriesData, SeriesInfo
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import live
from investigations.live import IngestStore, _spans
from investigations.models import JobActivity
from investigations.tests.live_helpers import job_pk, run_together, store_sim
from investigations.window_cache import CachedIngestStore, LateData, WindowCache
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

JOB = "job-cache"


IB = "ib.port_rcv_errors"


def _store(
    op: int,
    sequence: int,
    start: float,
    seconds: int = 5,
    names: tuple[str, ...] = (signals.DCGM_FI_DEV_GPU_UTIL, signals.DCGM_FI_DEV_POWER_USAGE),
    event: bool = False,
) -> None:
    # The node's own series (an InfiniBand port counter) beside the GPUs', and an event.
    extra: list[dict[str, object]] = [
        {
            "type": "sample",
            "ts": start + k,
            "name": IB,
            "node": "node-a",
            "value": float(sequence * 100 + k),
            "labels": {"device": "mlx5_0", "port": "1"},
        }
        for k in range(seconds)
    ]
    if event:
        extra.append(
            {"type": "event", "ts": start + 1, "name": "xid", "node": "node-a", "value": 79.0}
        )
    batch = gpu_batch(
        agent_id="agent-cache",
        sequence=sequence,
        job=JOB,
        start=start,
        seconds=seconds,
        names=names,
        extra_records=extra,
    )
    ingest_services.store_batch(op, decode_batch(batch, Limits()))


def _by_info(series: list[SeriesData]) -> dict[SeriesInfo, tuple[list[float], list[float]]]:
    return {s.info: (s.ts.tolist(), s.values.tolist()) for s in series if len(s.ts)}


def _activity(op: int) -> JobActivity:
    with tenant_context(op):
        return JobActivity.objects.for_tenant(op).get(job_id=job_pk(op, JOB))


def _activity_of(op: int, job: str) -> JobActivity:
    with tenant_context(op):
        return JobActivity.objects.for_tenant(op).get(job_id=job_pk(op, job))


def _cached(op: int, cache: WindowCache, *, now: float | None = None) -> CachedIngestStore:
    a = _activity(op)
    return CachedIngestStore(
        op,
        JOB,
        _spans(op, [JOB]),
        a.first_data_ts,
        a.last_data_ts,
        late=LateData(a.late_batches, a.late_first_ts, a.late_consumed),
        cache=cache,
        now=now,
    )


def _full(op: int) -> dict[SeriesInfo, tuple[list[float], list[float]]]:
    a = _activity(op)
    store = IngestStore(op, _spans(op, [JOB]))
    return _by_info(store.job_series(JOB, a.first_data_ts, a.last_data_ts))


def test_delta_reads_serve_what_a_full_read_gives_late_batches_included() -> None:
    op = make_tenant("cache-a").operator.pk
    cache = WindowCache()
    base = time.time() - 600
    _store(op, 1, base, seconds=30)
    first = _cached(op, cache)
    assert first.entry.full_reads == 1
    # Batches every 5 s, each followed by an evaluation: only the newest seconds are read...
    first.node_series("node-a", base, base + 30)  # the window builder asks for its nodes
    for k in range(6):
        _store(op, 2 + k, base + 30 + 5 * k, event=k == 3)
        store = _cached(op, cache)
    a = _activity(op)
    got = _by_info(store.job_series(JOB, a.first_data_ts, a.last_data_ts))
    assert store.entry.full_reads == 1
    assert store.entry.delta_reads == 6
    # ...and the cache holds exactly what storage holds: 60 one-hertz samples per series.
    assert got == _full(op)
    assert {len(ts) for ts, _ in got.values()} == {60}
    # The node's own series and events too (one read with the job's, after the first).
    full_store = IngestStore(op, _spans(op, [JOB]))
    node_level = [
        s
        for s in full_store.node_series("node-a", a.first_data_ts, a.last_data_ts)
        if not s.info.gpu and s.info.pid is None and not s.info.job
    ]
    cached_node = store.node_series("node-a", a.first_data_ts, a.last_data_ts)
    assert _by_info(cached_node) == _by_info(node_level)
    assert [len(s.ts) for s in cached_node] == [60]
    events = store.events(node="node-a", t0=a.first_data_ts, t1=a.last_data_ts)
    assert [(e.name, e.value) for e in events] == [("xid", 79.0)]
    assert events == full_store.events(node="node-a", t0=a.first_data_ts, t1=a.last_data_ts)
    # A late batch (an agent's spool after an outage: data from 20 s into the job, of a signal
    # not seen before) is counted by the ingest signal and re-read from its first sample.
    _store(op, 20, base + 20, seconds=10, names=(signals.DCGM_FI_DEV_SM_CLOCK,))
    a = _activity(op)
    assert a.late_batches == 1
    assert a.late_first_ts == pytest.approx(base + 20, abs=1e-3)
    later = _cached(op, cache, now=time.monotonic() + 60)  # catalogs re-read (their TTL)
    got = _by_info(later.job_series(JOB, a.first_data_ts, a.last_data_ts))
    assert got == _full(op)
    clocks = [v for info, v in got.items() if info.name == signals.DCGM_FI_DEV_SM_CLOCK]
    assert clocks and all(len(ts) == 10 for ts, _ in clocks)
    assert later.entry.full_reads == 1
    # Several late batches before the next evaluation (ingest behind, batches stored out of
    # order): the count moves by more than one and the earliest of them is where the re-read
    # starts; still no full read, still exactly what storage holds.
    _store(op, 21, base + 40, seconds=5, names=(signals.DCGM_FI_DEV_FB_USED,))
    _store(op, 22, base + 5, seconds=5, names=(signals.DCGM_FI_DEV_FB_USED,))
    _store(op, 23, base + 25, seconds=5, names=(signals.DCGM_FI_DEV_FB_USED,))
    a = _activity(op)
    assert a.late_batches == 4
    assert a.late_first_ts == pytest.approx(base + 5, abs=1e-3)  # the earliest, not the newest
    again = _cached(op, cache, now=time.monotonic() + 120)
    assert _by_info(again.job_series(JOB, a.first_data_ts, a.last_data_ts)) == _full(op)
    assert again.entry.full_reads == 1
    # Late batches another worker consumed and this entry never saw: read in full.
    with tenant_context(op):
        JobActivity.objects.for_tenant(op).filter(pk=a.pk).update(
            late_consumed=6, late_batches=7, late_first_ts=None
        )
    missed = _cached(op, cache, now=time.monotonic() + 180)
    assert missed.entry.full_reads == 2


def test_entries_are_bounded_least_recently_evaluated_first() -> None:
    op = make_tenant("cache-b").operator.pk
    base = time.time() - 600
    _store(op, 1, base, seconds=30)
    cache = WindowCache(max_samples=100)  # one job's 2 GPUs × 2 signals × 30 s = 120 samples
    store = _cached(op, cache)
    assert store.entry.samples() == 120
    cache.entry(op, "another-job")  # a second job evaluated after it: the first one goes
    cache.enforce_bound((op, "another-job"))
    assert len(cache) == 1 and cache.evictions == 1
    # Dropped is only slower: the next evaluation reads the job from storage in full.
    again = _cached(op, cache)
    assert again.entry.full_reads == 1
    assert np.isfinite(again.entry.through)


def test_two_evaluations_of_one_job_at_once_share_the_entry_safely() -> None:
    """An evaluation lock that expired under load lets two evaluations of one job run in one
    worker at once; the entry's own lock keeps one from refreshing it (a full read clears it
    first) while the other reads."""
    op = make_tenant("cache-c").operator.pk
    sim = store_sim(op, "sequence_imbalance", seed=3)
    a = _activity_of(op, sim.jobs[0])
    results: list[set[str]] = []

    def evaluate(k: int) -> None:
        # The second caller asks for an earlier start: a full read, which clears the entry.
        t0 = a.first_data_ts + (0.0 if k == 0 else -1.0)
        _window, verdicts = live.detect_job(op, sim.jobs[0], t0, a.last_data_ts)
        results.append({v["family"] for v in verdicts})

    assert run_together(evaluate, 2) == []
    assert results == [sim.offline_families[sim.jobs[0]]] * 2
