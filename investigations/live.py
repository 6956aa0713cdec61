"""The detectors on live data: a `SignalStore` over ingest's selectors, for one tenant.

`IngestStore` answers the questions `engine.window` asks (the same interface as the offline
`TraceStore`) through `ingest.selectors` only, which return the contract's row types
(contract.rows), so nothing is converted here. `detect_job()` / `detect_gpu()` run the engine's
window builders, detectors and verdict builder exactly as `proof analyze` does, so a verdict is
the same live and offline.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from contract.rows import EventRow, JobMeta, LogRow, ProcessInfo, SeriesData
from engine.detectors import run_detectors, run_fleet_health
from engine.store import FLEET_HEALTH_SIGNALS
from engine.verdicts import build_verdicts
from engine.window import JobWindow, build_gpu_window, build_job_window
from ingest import selectors as ingest_selectors
from investigations import window_cache
from investigations.models import JobActivity
from tenants.context import tenant_context


class IngestStore:
    """One tenant's stored signals, for the window builders. `spans` gives each job's data
    span (first, last sample ts), which ingest's job rows (wall-clock) cannot."""

    def __init__(self, operator_id: int, spans: dict[str, tuple[float, float]] | None = None):
        self.operator_id = operator_id
        self.spans = dict(spans or {})
        self._jobs: dict[str, JobMeta] | None = None
        self._gpu_locations: dict[str, tuple[str, int | None]] | None = None

    def jobs(self) -> dict[str, JobMeta]:
        """The jobs asked about (the spans) and their reruns/originals, not the whole fleet."""
        if self._jobs is None:
            self._jobs = ingest_selectors.job_metas(self.operator_id, self.spans)
        return dict(self._jobs)

    def gpu_locations(self) -> dict[str, tuple[str, int | None]]:
        """GPU UUID → (node, index), read once per store."""
        if self._gpu_locations is None:
            self._gpu_locations = ingest_selectors.gpu_locations(self.operator_id)
        return self._gpu_locations

    def processes(self, job: str) -> list[ProcessInfo]:
        first = self.spans.get(job, (None, None))[0]
        return ingest_selectors.job_processes(
            self.operator_id, job, first, gpus=self.gpu_locations()
        )

    def job_series(self, job: str, t0: float, t1: float) -> list[SeriesData]:
        return ingest_selectors.job_series(self.operator_id, job, t0, t1)

    def node_series(
        self, node: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        return ingest_selectors.node_series(self.operator_id, node, t0, t1, names)

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        return ingest_selectors.gpu_series(self.operator_id, gpu, t0, t1, names)

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]:
        return ingest_selectors.events(
            self.operator_id, node=node, t0=t0, t1=t1, limit=window_cache.EVENT_LIMIT
        )

    def job_logs(self, job: str, t0: float, t1: float) -> list[LogRow]:
        return window_cache.read_job_logs(self.operator_id, job, t0, t1)

    def gpus(self) -> list[tuple[str, str, int | None]]:
        return window_cache.gpu_list(self.gpu_locations())

    def time_range(self) -> tuple[float, float]:
        return window_cache.spans_range(self.spans)


class _NodeHealthStore:
    """The health signals and events of one node's GPUs, read once for all of them: the
    `SignalStore` questions `build_gpu_window` asks, answered from memory. A node's samples
    sit in the node's blocks, which a read per GPU would fetch and decode once per GPU."""

    def __init__(self, series: list[SeriesData], events: list[EventRow]) -> None:
        self._by_gpu: dict[str, list[SeriesData]] = {}
        for s in series:
            if s.info.gpu:
                self._by_gpu.setdefault(s.info.gpu, []).append(s)
        self._events = events

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        wanted = None if names is None else set(names)
        return [s for s in self._by_gpu.get(gpu, []) if wanted is None or s.info.name in wanted]

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]:
        return [e for e in self._events if t0 <= e.ts <= t1]

    def jobs(self) -> dict[str, JobMeta]:
        return {}  # fleet health is job-less (as IngestStore without spans)

    def processes(self, job: str) -> list[ProcessInfo]:
        return []


def detect_node_gpus(
    operator_id: int, hostname: str, window_s: float
) -> list[tuple[str, tuple[float, float], list[dict[str, Any]]]]:
    """Fleet health of every registered GPU of one node over the last `window_s` seconds, from
    one read of the node's health signals and events: (GPU uuid, window, verdicts) each."""
    gpus = ingest_selectors.gpus_of_node(operator_id, hostname)
    if not gpus:
        return []
    t1 = time.time()
    t0 = t1 - window_s
    series = ingest_selectors.node_series(operator_id, hostname, t0, t1, FLEET_HEALTH_SIGNALS)
    events = ingest_selectors.events(
        operator_id, node=hostname, t0=t0, t1=t1, limit=window_cache.EVENT_LIMIT
    )
    store = _NodeHealthStore(series, events)
    out = []
    for gpu, index in sorted(gpus.items()):
        window = build_gpu_window(store, gpu, hostname, index, t0, t1)
        out.append((gpu, (t0, t1), build_verdicts(run_fleet_health(window), None)))
    return out


def _spans(operator_id: int, job_ids: Iterable[str]) -> dict[str, tuple[float, float]]:
    with tenant_context(operator_id):
        rows = (
            JobActivity.objects.for_tenant(operator_id)
            .filter(job__job_id__in=list(job_ids))
            .values_list("job__job_id", "first_data_ts", "last_data_ts")
        )
        return {j: (a, b) for j, a, b in rows}


def detect_job(
    operator_id: int,
    job: str,
    t0: float,
    t1: float,
    *,
    job_state: tuple[object, ...] = (),
    late: window_cache.LateData | None = None,
    span: tuple[float, float] | None = None,
) -> tuple[JobWindow, list[dict[str, Any]]]:
    """(the job's window over [t0, t1], its verdicts as docs/design.md verdict dicts).

    The window's data comes through the worker's cache of the job (investigations/
    window_cache.py): only what arrived since the last evaluation is read from storage.
    `job_state` is what of the job row, when it changes, makes the cache re-read the job's
    metadata at once; `late` what ingest recorded of late batches; `span` the job's data span
    where the caller has just read it."""
    spans = {job: span} if span is not None else _spans(operator_id, [job])
    entry = window_cache.CACHE.entry(operator_id, job)
    related = set(entry.metas or {}) | set(spans)
    if len(related) > 1:  # reruns: their spans too, so the window can read their logs
        spans = _spans(operator_id, related)
    # One tenant context (one transaction, one set_config) for every read the window makes:
    # the store's selectors each open their own, nested ones cost nothing, and a dozen
    # top-level ones were a quarter of a small job's evaluation (profiled: 8 of 32 ms).
    with entry.lock:
        with tenant_context(operator_id):
            store = window_cache.CachedIngestStore(
                operator_id, job, spans, t0, t1, job_state=job_state, late=late
            )
            if set(store.jobs()) - set(spans):  # a rerun appeared: its span too
                store.spans = _spans(operator_id, store.jobs())
            # Taken out while this window is built: one that fails part-way must not leave
            # matrices older than the entry's data for the next window to update.
            previous, entry.matrices = entry.matrices, None
            window = build_job_window(
                store, job, t0, t1, reuse=previous, changed_from=store.changed_from
            )
            entry.matrices = window.matrices
        # Still under the lock: the window's raw series are views of the entry's arrays.
        return window, build_verdicts(run_detectors(window), window)


def detect_gpu(
    operator_id: int, gpu: str, window_s: float
) -> tuple[tuple[float, float], list[dict[str, Any]]] | None:
    """Fleet health of one GPU over the last `window_s` seconds, or None for an unknown GPU."""
    store = IngestStore(operator_id)
    # This GPU's row, not the fleet's: one evaluation per GPU reading every GPU's location
    # grows with the square of the fleet.
    where = ingest_selectors.gpu_location(operator_id, gpu)
    if where is None:
        return None
    node, index = where
    # Fleet health runs on live data: the window ends now.
    t1 = time.time()
    t0 = t1 - window_s
    window = build_gpu_window(store, gpu, node, index, t0, t1)
    return (t0, t1), build_verdicts(run_fleet_health(window), None)
