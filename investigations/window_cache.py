"""Each job's recent data, kept by the worker between evaluations.

The live pipeline evaluates a job every few seconds while its data arrives. Reading its whole
window (up to 30 min of every series, its logs and its nodes' events) from storage each time
cost most of an evaluation and grew with the window; here the worker keeps what it read and
each evaluation reads only what arrived since, plus an overlap:

    CachedIngestStore(operator, job, t0, t1, late)   # refreshes the job's entry, then serves
    build_job_window(store, job, t0, t1)             # the same window builder as offline

- **Delta reads.** An entry holds the job's series, its nodes' series and events and its log
  lines over [start, through]. A refresh reads [through − OVERLAP_S, t1] and replaces the
  cached samples from that point on: batches of one job's nodes come from different agents a
  few seconds apart, so the newest seconds are re-read until every node's batch is in.
- **Late batches.** A batch older than the overlap (an agent shipping its spool after a
  network outage) is counted by ingest's signal in `JobActivity.late_batches`, with the
  earliest first timestamp of those counted since an evaluation last consumed them; an entry
  that sees the count move re-reads from that timestamp (in full when another worker consumed
  late batches this entry never saw). Nothing accepted is ever left out of a window for good: after a
  restart, or for a job this worker has not seen, the entry is built from storage in full.
- **Bounded.** Samples older than the window are dropped as the window moves, and the entries
  together hold at most `PROOF_EVAL_CACHE_SAMPLES` samples (16 bytes each): the least recently
  evaluated jobs are dropped first and rebuilt from storage when next evaluated.
- **Catalogs and metadata** (which series a job has, its processes, the GPU inventory, the job
  rows) are re-read every META_TTL_S, and at once when the job's state or end changes.

Correctness never depends on the entry: a worker that never saw the job, or saw only part of
its data, reads what it lacks. Routing a job's evaluations to one worker (docs/live-pipeline.md,
"Where the tasks run") is what makes the entry useful.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
from django.conf import settings

from contract.rows import EventRow, JobMeta, LogRow, ProcessInfo, SeriesData, SeriesInfo
from engine.window_grid import Matrices
from ingest import selectors as ingest_selectors
from tenants.context import tenant_context

# Re-read the newest 15 s at each refresh: a job's nodes ship their batches from separate
# agents, each every ~1 s, and under load up to several seconds apart; a batch older than this
# is a late one (counted by ingest's signal, re-read from its first sample).
OVERLAP_S = 15.0
# Catalogs and metadata change rarely (a rank's process appears, the job ends): re-read every
# 15 s, which delays a new rank's first appearance in the window by as much at most.
META_TTL_S = 15.0
# Those re-reads ask only for series newer than the catalog held (ids only grow), and read it
# whole every 2 min: series ids are taken when a batch inserts them and seen when it commits,
# so one taken before another but committed after it can be missed by the delta read until
# then (its samples are then read over what the entry holds: delayed, never lost).
CATALOG_FULL_S = 120.0
# Drop samples older than the window only once they are this far behind, so trimming (a pass
# over every series, events and logs) happens once a minute, not at every refresh.
TRIM_SLACK_S = 60.0
# Enough log lines for 30 min of a large job's progress lines, and events; beyond them the
# newest are kept (a window read from storage, the oldest).
LOG_LIMIT = 200_000
EVENT_LIMIT = 20_000


@dataclass(frozen=True)
class LateData:
    """What ingest recorded of batches older than the overlap (JobActivity)."""

    batches: int = 0
    # The earliest first sample time of those counted after `consumed` (None: none since).
    first_ts: float | None = None
    consumed: int = 0


@dataclass
class _Entry:
    operator_id: int
    job: str
    start: float = float("inf")  # everything from here…
    through: float = float("-inf")  # …to here is held
    late_batches: int = 0
    series: dict[SeriesInfo, _Held] = field(default_factory=dict)
    node_series: dict[str, dict[SeriesInfo, _Held]] = field(default_factory=dict)
    events: dict[str, list[EventRow]] = field(default_factory=dict)
    logs: list[LogRow] = field(default_factory=list)
    catalog: ingest_selectors.SeriesCatalog | None = None
    node_catalogs: dict[str, ingest_selectors.SeriesCatalog] = field(default_factory=dict)
    metas: dict[str, JobMeta] | None = None
    processes: list[ProcessInfo] | None = None
    gpu_locations: dict[str, tuple[str, int | None]] | None = None
    meta_key: tuple[object, ...] = ()
    meta_read_at: float = float("-inf")
    catalog_read_at: float = float("-inf")  # when the catalogs were last read whole
    full_reads: int = 0
    delta_reads: int = 0
    # Refreshes that found series new to the catalogs and read them over the whole held span
    # (their matrices are then built whole): what `proof bench live`'s probe reports.
    added_reads: int = 0
    # The last window's matrices (engine/window_grid.py), which the next window of the job
    # updates from the refresh's cutoff instead of placing the whole window again; None after
    # a refresh that read in full or added series (their earlier samples are new to them).
    matrices: Matrices | None = None
    # The held node matrices by their first series id (_splice's fast path), and where each
    # series of the catalogs is held (_Homes), kept while the catalogs' series stay the same.
    rows_index: dict[int, _Rows] = field(default_factory=dict)
    homes: _Homes | None = None
    # Held by an evaluation from its refresh to the end of its detectors (the window's raw
    # series are views of the held arrays): two evaluations of one job in one worker (its
    # evaluation lock expired under load) must not refresh the entry under each other's reads.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def samples(self) -> int:
        held = sum(len(h) for h in self.series.values())
        held += sum(len(h) for hs in self.node_series.values() for h in hs.values())
        # A matrix cell is 8 bytes, a held sample 16.
        return held + (self.matrices.cells() // 2 if self.matrices is not None else 0)


class WindowCache:
    """The entries of one worker process (thread-safe: a worker may run evaluations on
    several threads; one job is evaluated by one at a time, under its evaluation lock)."""

    def __init__(self, max_samples: int | None = None) -> None:
        self._entries: OrderedDict[tuple[int, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._max_samples = max_samples
        self.evictions = 0

    @property
    def max_samples(self) -> int:
        if self._max_samples is not None:
            return self._max_samples
        return int(getattr(settings, "PROOF_EVAL_CACHE_SAMPLES", 64_000_000))

    def entry(self, operator_id: int, job: str) -> _Entry:
        key = (operator_id, job)
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                found = self._entries[key] = _Entry(operator_id, job)
            self._entries.move_to_end(key)
            return found

    def drop(self, operator_id: int, job: str) -> None:
        with self._lock:
            self._entries.pop((operator_id, job), None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def enforce_bound(self, keep: tuple[int, str]) -> None:
        """Drop the least recently evaluated entries (never `keep`) past the sample bound."""
        with self._lock:
            total = sum(e.samples() for e in self._entries.values())
            for key in list(self._entries):
                if total <= self.max_samples:
                    break
                if key == keep:
                    continue
                total -= self._entries.pop(key).samples()
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._entries)

    def read_counts(self) -> dict[str, list[int]]:
        """Per entry ("operator:job"): its full, delta and added-series reads so far."""
        with self._lock:
            return {
                f"{op}:{job}": [e.full_reads, e.delta_reads, e.added_reads]
                for (op, job), e in self._entries.items()
            }


# One per worker process (each prefork child has its own, by fork).
CACHE = WindowCache()


class _Rows:
    """Samples of series that share their timestamps (a node's series, read from its regular
    blocks) in growable arrays: one timestamp array, one row of values per series. A refresh
    truncates at its cutoff and appends what it read in place (amortised: capacity doubles),
    once for the node's series, not once per series: instead of copying the whole window for
    every series at every evaluation (a 96-GPU job's 3,600 series cost 80 ms that way), or
    splicing each series (a 200-GPU job's 8,000: ~60 ms)."""

    __slots__ = ("hi", "ids", "intact", "lo", "owner", "ts", "values")

    def __init__(self, ts: np.ndarray, values: np.ndarray) -> None:
        self.ts = np.array(ts, dtype=np.float64)
        copied = np.array(values, dtype=np.float64)
        self.values = copied.reshape(1, -1) if copied.ndim == 1 else copied
        self.lo = 0
        self.hi = len(self.ts)
        # A node's series read as one: their ids in row order and the held dict whose
        # entries are its rows, while every one of them still is (intact).
        self.ids: list[int] = []
        self.owner: dict[SeriesInfo, _Held] | None = None
        self.intact = False

    def splice(self, ts: np.ndarray, values: np.ndarray, cutoff: float) -> None:
        """Drop the samples from `cutoff` on, append `ts` and `values` (a row per series)."""
        k = self.lo + int(self.ts[self.lo : self.hi].searchsorted(cutoff - _MS_TOLERANCE, "left"))
        n = len(ts)
        if k == self.hi and not n:
            return
        if k + n > len(self.ts):
            keep = k - self.lo
            capacity = max(2 * (keep + n), 64)
            grown = np.empty(capacity)
            grown_values = np.empty((len(self.values), capacity))
            grown[:keep] = self.ts[self.lo : k]
            grown_values[:, :keep] = self.values[:, self.lo : k]
            self.ts, self.values, self.lo, k = grown, grown_values, 0, keep
        self.ts[k : k + n] = ts
        self.values[:, k : k + n] = values
        self.hi = k + n

    def trim(self, keep_from: float) -> None:
        if self.hi > self.lo and self.ts[self.lo] < keep_from:
            self.lo += int(self.ts[self.lo : self.hi].searchsorted(keep_from, "left"))


class _Held:
    """One series' samples: row `row` of a _Rows, alone in it or with its node's series."""

    __slots__ = ("info", "row", "rows")

    def __init__(self, info: SeriesInfo, rows: _Rows, row: int = 0) -> None:
        self.info = info
        self.rows = rows
        self.row = row

    @classmethod
    def of(cls, s: SeriesData) -> _Held:
        return cls(s.info, _Rows(s.ts, s.values))

    def __len__(self) -> int:
        return self.rows.hi - self.rows.lo

    def view(self) -> SeriesData:
        r = self.rows
        return SeriesData(self.info, r.ts[r.lo : r.hi], r.values[self.row, r.lo : r.hi])

    def splice(self, ts: np.ndarray, values: np.ndarray, cutoff: float) -> None:
        """Drop this series' samples from `cutoff` on, append `ts`, `values`: first out of
        the rows it shares, when it does (the others are then spliced on their own)."""
        if len(self.rows.values) > 1:
            r = self.rows
            r.intact = False
            self.rows, self.row = _Rows(r.ts[r.lo : r.hi], r.values[self.row, r.lo : r.hi]), 0
        self.rows.splice(ts, values.reshape(1, -1), cutoff)


def _splice(
    held: dict[SeriesInfo, _Held],
    fresh: Iterable[ingest_selectors.SampleRows],
    order: list[SeriesInfo],
    cutoff: float,
    index: dict[int, _Rows],
) -> None:
    """Replace the held samples from `cutoff` on with the freshly read ones; series of
    `order` (the catalog, whose order the held series keep) not read have none from then on.
    `index`: the entry's node matrices by first series id."""
    added: dict[SeriesInfo, _Held] = {}
    spliced: set[SeriesInfo] = set()
    whole: set[int] = set()  # the node matrices spliced as one (id())
    covered = 0  # and their series
    for rows in fresh:
        known = index.get(rows.ids[0])
        if known is not None and known.intact and known.owner is held and known.ids == rows.ids:
            known.splice(rows.ts, rows.values, cutoff)  # the usual: a node's series as one
            whole.add(id(known))
            covered += len(rows.ids)
            continue
        handles = [held.get(info) for info in rows.infos]
        if all(h is None for h in handles):
            together = _Rows(rows.ts, rows.values)
            together.ids, together.owner, together.intact = rows.ids, held, True
            index[rows.ids[0]] = together
            added.update((info, _Held(info, together, i)) for i, info in enumerate(rows.infos))
        else:  # the node's series changed: each on its own from now on
            for i, (info, h) in enumerate(zip(rows.infos, handles, strict=True)):
                if h is None:
                    added[info] = _Held(info, _Rows(rows.ts, rows.values[i]))
                else:
                    h.splice(rows.ts, rows.values[i], cutoff)
        spliced.update(rows.infos)
    if covered == len(order):  # every series of the catalog read with its node's
        return
    empty = np.zeros(0)
    for info in order:
        if info in added:
            held[info] = added[info]
        elif info not in spliced:
            old = held.get(info)
            if old is None:
                held[info] = _Held(info, _Rows(empty, empty))
            elif id(old.rows) not in whole:
                old.splice(empty, empty, cutoff)


class _Homes:
    """Where each series of a refresh's catalogs is held: the job's own (None) or its node's,
    by series id, and each place's series in the catalogs' order (what the held dicts keep).
    Built again only when the catalogs' series change (a series id's identity never does)."""

    def __init__(self, infos: dict[int, SeriesInfo], job_infos: dict[int, SeriesInfo]) -> None:
        self.ids = list(infos)
        self.job_ids = list(job_infos)
        own = set(job_infos.values())
        self.by_id: dict[int, str | None] = {
            sid: None if info in own else info.node for sid, info in infos.items()
        }
        self.orders: dict[str | None, list[SeriesInfo]] = {}
        for sid, info in infos.items():
            self.orders.setdefault(self.by_id[sid], []).append(info)

    def same(self, infos: dict[int, SeriesInfo], job_infos: dict[int, SeriesInfo]) -> bool:
        return list(infos) == self.ids and list(job_infos) == self.job_ids


def _split(
    rows: ingest_selectors.SampleRows, keys: list[str | None]
) -> dict[str | None, ingest_selectors.SampleRows]:
    """The rows by where each series is held (keys[i]: series i's), in their order."""
    if all(k == keys[0] for k in keys):
        return {keys[0]: rows}
    out = {}
    for key in dict.fromkeys(keys):
        at = [i for i, k in enumerate(keys) if k == key]
        out[key] = ingest_selectors.SampleRows(
            [rows.ids[i] for i in at], [rows.infos[i] for i in at], rows.ts, rows.values[at]
        )
    return out


def _trim(held: dict[SeriesInfo, _Held], keep_from: float) -> None:
    for rows in {id(h.rows): h.rows for h in held.values()}.values():
        rows.trim(keep_from)


# Storage keeps milliseconds and reads by them; a sample's float seconds may land a hair past
# the float bound it was read by.
_MS_TOLERANCE = 5e-4


def _cut(s: SeriesData, t0: float, t1: float) -> SeriesData:
    n = len(s.ts)
    # Nearly always the whole series (the entry holds the window): two scalar reads, not a
    # searchsorted (a 200-GPU job's window cuts 8,000 series at each evaluation).
    if not n or (s.ts[0] >= t0 - _MS_TOLERANCE and s.ts[n - 1] <= t1 + _MS_TOLERANCE):
        return s
    a, b = np.searchsorted(s.ts, [t0 - _MS_TOLERANCE, t1 + _MS_TOLERANCE])
    if a == 0 and b == len(s.ts):
        return s
    return SeriesData(s.info, s.ts[a:b], s.values[a:b])


class CachedIngestStore:
    """The `SignalStore` of one live evaluation of `job`, served from the worker's entry for the
    job after refreshing it to [t0, t1]. Other jobs' logs (a rerun's) are read from storage."""

    def __init__(
        self,
        operator_id: int,
        job: str,
        spans: dict[str, tuple[float, float]],
        t0: float,
        t1: float,
        *,
        job_state: tuple[object, ...] = (),
        late: LateData | None = None,
        cache: WindowCache | None = None,
        now: float | None = None,
    ) -> None:
        self.operator_id = operator_id
        self.job = job
        self.spans = dict(spans)
        self.cache = cache if cache is not None else CACHE
        self.entry = self.cache.entry(operator_id, job)
        # The earliest sample time this refresh may have changed (its cutoff), None when it
        # read in full or added series: what the window builder may update its last
        # matrices from (engine/window_grid.py).
        self.changed_from: float | None = None
        self._added = False  # whether this refresh added series to the catalogs
        try:
            self._refresh(
                t0, t1, job_state, late or LateData(), time.monotonic() if now is None else now
            )
        except BaseException:
            # A refresh that failed part-way leaves the entry half updated: drop it, so the
            # next evaluation reads the job from storage in full rather than from a bad entry.
            self.cache.drop(operator_id, job)
            raise
        self.cache.enforce_bound((operator_id, job))

    # --- refresh --------------------------------------------------------------------------
    def _refresh(
        self, t0: float, t1: float, job_state: tuple[object, ...], late: LateData, now: float
    ) -> None:
        e = self.entry
        op = self.operator_id
        full = t0 < e.start or not np.isfinite(e.through) or t1 < e.through
        cutoff = e.through - OVERLAP_S
        if late.batches != e.late_batches:
            # The entry holds every late batch up to e.late_batches; those it lacks are all
            # counted after `consumed` when e.late_batches >= consumed, and none of them began
            # before late.first_ts. Otherwise (another worker consumed some this entry never
            # saw) the window is read in full.
            if e.late_batches >= late.consumed and late.first_ts is not None:
                cutoff = min(cutoff, late.first_ts)
            else:
                full = True
            e.late_batches = late.batches
        if full:
            self._clear(e)
            cutoff = t0
            e.full_reads += 1
        else:
            cutoff = max(cutoff, t0)
            e.delta_reads += 1
        stale_meta = now - e.meta_read_at >= META_TTL_S or e.meta_key != job_state or full
        with tenant_context(op):
            if stale_meta:
                e.metas = ingest_selectors.job_metas(op, self.spans)
                e.gpu_locations = ingest_selectors.gpu_locations(op)
                first = self.spans.get(self.job, (None, None))[0]
                e.processes = ingest_selectors.job_processes(
                    op, self.job, first, gpus=e.gpu_locations
                )
                whole = full or now - e.catalog_read_at >= CATALOG_FULL_S
                if whole:
                    e.catalog_read_at = now
                known = None if whole else e.catalog
                e.catalog = self._recatalog(
                    e.catalog,
                    ingest_selectors.job_series_catalog(op, self.job, known=known),
                    e.series,
                    cutoff,
                )
                fresh_catalogs = ingest_selectors.nodes_series_catalogs(
                    op, e.node_series, node_level=True, known=None if whole else e.node_catalogs
                )
                for node, catalog in fresh_catalogs.items():
                    e.node_catalogs[node] = self._recatalog(
                        e.node_catalogs.get(node), catalog, e.node_series[node], cutoff
                    )
                e.meta_key = job_state
                e.meta_read_at = now
            self._refresh_samples(cutoff, t1)
            self._refresh_events(list(e.node_series), cutoff, t1)
            e.logs = [r for r in e.logs if r.ts < cutoff] + read_job_logs(op, self.job, cutoff, t1)
            if len(e.logs) > LOG_LIMIT:
                e.logs = e.logs[-LOG_LIMIT:]
        e.start = min(e.start, t0)
        e.through = t1
        self.changed_from = None if full or self._added else cutoff
        # What the window reads from t0 on (within the ms tolerance of its cut) stays held.
        keep_from = t0 - _MS_TOLERANCE
        if e.start < keep_from - TRIM_SLACK_S:
            _trim(e.series, keep_from)
            for held in e.node_series.values():
                _trim(held, keep_from)
            for node, rows in e.events.items():
                e.events[node] = [r for r in rows if r.ts >= keep_from]
            e.logs = [r for r in e.logs if r.ts >= keep_from]
            e.start = keep_from

    def _recatalog(
        self,
        old: ingest_selectors.SeriesCatalog | None,
        new: ingest_selectors.SeriesCatalog,
        held: dict[SeriesInfo, _Held],
        cutoff: float,
    ) -> ingest_selectors.SeriesCatalog:
        """The new catalog; series it adds are read over what the entry already holds (the
        refresh reads every series from `cutoff` on), so a series that appeared since the
        last catalog read is not missing its first samples."""
        e = self.entry
        if old is not None and np.isfinite(e.start):
            added = {sid: info for sid, info in new.infos.items() if sid not in old.infos}
            if added:
                if not self._added:
                    e.added_reads += 1
                self._added = True
                part = ingest_selectors.SeriesCatalog(added, new.node_ids)
                for s in ingest_selectors.catalog_samples(self.operator_id, part, e.start, cutoff):
                    if s.info in held:  # its node's matrix no longer holds it
                        held[s.info].rows.intact = False
                    held[s.info] = _Held.of(s)  # the refresh then replaces it from `cutoff` on
        return new

    @staticmethod
    def _clear(e: _Entry) -> None:
        e.matrices = None
        e.rows_index.clear()
        e.homes = None
        e.series.clear()
        e.node_series.clear()
        e.events.clear()
        e.logs = []
        e.node_catalogs.clear()
        e.start = float("inf")
        e.through = float("-inf")

    def _refresh_samples(self, cutoff: float, t1: float) -> None:
        """The job's series and its nodes' own in one read: they sit in the same nodes'
        blocks, which are then fetched and decoded once."""
        e = self.entry
        job_catalog = e.catalog or ingest_selectors.SeriesCatalog({}, frozenset())
        infos = dict(job_catalog.infos)
        node_ids = set(job_catalog.node_ids)
        for catalog in e.node_catalogs.values():
            infos.update(catalog.infos)
            node_ids |= catalog.node_ids
        combined = ingest_selectors.SeriesCatalog(infos, frozenset(node_ids))
        fresh = ingest_selectors.catalog_sample_rows(self.operator_id, combined, cutoff, t1)
        homes = e.homes
        if homes is None or not homes.same(infos, job_catalog.infos):
            homes = e.homes = _Homes(infos, job_catalog.infos)
        parts: dict[str | None, list[ingest_selectors.SampleRows]] = {}
        for rows in fresh:
            for key, part in _split(rows, [homes.by_id[sid] for sid in rows.ids]).items():
                parts.setdefault(key, []).append(part)
        orders = homes.orders
        _splice(e.series, parts.get(None, ()), orders.get(None, []), cutoff, e.rows_index)
        for node, held in e.node_series.items():
            _splice(held, parts.get(node, ()), orders.get(node, []), cutoff, e.rows_index)
        # A matrix some series left (their node's series changed) is no longer spliced as one:
        # out of the index, so that its arrays go once its last series has left it.
        for first in [k for k, rows in e.rows_index.items() if not rows.intact]:
            del e.rows_index[first]

    def _refresh_events(self, nodes: list[str], cutoff: float, t1: float) -> None:
        """Events of these nodes from `cutoff` on, in one read, replacing what was held."""
        e = self.entry
        if not nodes:
            return
        fresh = ingest_selectors.events_of_nodes(
            self.operator_id, nodes, t0=cutoff, t1=t1, limit=EVENT_LIMIT * len(nodes)
        )
        by_node: dict[str, list[EventRow]] = {node: [] for node in nodes}
        for row in fresh:
            by_node.setdefault(row.node, []).append(row)
        for node, rows in by_node.items():
            old = [r for r in e.events.get(node, []) if r.ts < cutoff]
            e.events[node] = (old + rows)[-EVENT_LIMIT:]

    def _refresh_node(self, node: str, cutoff: float, t1: float) -> None:
        """A node first asked for by the window builder: its own series and events over what
        the entry holds (later refreshes read it with the others)."""
        e = self.entry
        catalog = e.node_catalogs.get(node)
        if catalog is None:
            catalog = e.node_catalogs[node] = ingest_selectors.node_series_catalog(
                self.operator_id, node, node_level=True
            )
        held = e.node_series.setdefault(node, {})
        fresh = ingest_selectors.catalog_sample_rows(self.operator_id, catalog, cutoff, t1)
        _splice(held, fresh, list(catalog.infos.values()), cutoff, e.rows_index)
        self._refresh_events([node], cutoff, t1)

    # --- SignalStore ----------------------------------------------------------------------
    def jobs(self) -> dict[str, JobMeta]:
        metas = self.entry.metas or {}
        out = {}
        for job, meta in metas.items():
            first, last = self.spans.get(job, (float("inf"), float("-inf")))
            out[job] = replace(meta, first_ts=first, last_ts=last)
        return out

    def gpu_locations(self) -> dict[str, tuple[str, int | None]]:
        return dict(self.entry.gpu_locations or {})

    def processes(self, job: str) -> list[ProcessInfo]:
        if job == self.job:
            return list(self.entry.processes or [])
        first = self.spans.get(job, (None, None))[0]
        return ingest_selectors.job_processes(
            self.operator_id, job, first, gpus=self.gpu_locations()
        )

    def job_series(self, job: str, t0: float, t1: float) -> list[SeriesData]:
        if job != self.job:
            return ingest_selectors.job_series(self.operator_id, job, t0, t1)
        return [_cut(h.view(), t0, t1) for h in self.entry.series.values()]

    def node_series(
        self, node: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        """The node's own series (no GPU, process or job key): all a job's window reads of a
        node, its GPU and process series being the job's own (job_series). Reading every
        series of the node here read each GPU's data twice."""
        e = self.entry
        if node not in e.node_series:  # first asked: read it over what the entry holds
            self._refresh_node(node, min(e.start, t0), max(e.through, t1))
        wanted = None if names is None else set(names)
        return [
            _cut(h.view(), t0, t1)
            for h in e.node_series[node].values()
            if wanted is None or h.info.name in wanted
        ]

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]:
        e = self.entry
        if node not in e.node_series:
            self._refresh_node(node, min(e.start, t0), max(e.through, t1))
        return [r for r in e.events.get(node, []) if t0 <= r.ts <= t1]

    def job_logs(self, job: str, t0: float, t1: float) -> list[LogRow]:
        if job != self.job:
            return read_job_logs(self.operator_id, job, t0, t1)
        return [r for r in self.entry.logs if t0 <= r.ts <= t1]

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        return ingest_selectors.gpu_series(self.operator_id, gpu, t0, t1, names)

    def gpus(self) -> list[tuple[str, str, int | None]]:
        return gpu_list(self.gpu_locations())

    def time_range(self) -> tuple[float, float]:
        return spans_range(self.spans)


def read_job_logs(operator_id: int, job: str, t0: float, t1: float) -> list[LogRow]:
    """A job's log lines over [t0, t1] from storage, at most LOG_LIMIT."""
    half = max(0.0, (t1 - t0) / 2)
    return ingest_selectors.job_logs(
        operator_id, job, t0 + half, before_s=half, after_s=half, limit=LOG_LIMIT
    )


def gpu_list(locations: dict[str, tuple[str, int | None]]) -> list[tuple[str, str, int | None]]:
    """`SignalStore.gpus()` from the GPU inventory (uuid → (node, index)), by uuid."""
    return [(uuid, node, index) for uuid, (node, index) in sorted(locations.items())]


def spans_range(spans: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """`SignalStore.time_range()` over the jobs' data spans ((0, 0) for none)."""
    if not spans:
        return (0.0, 0.0)
    return (min(a for a, _ in spans.values()), max(b for _, b in spans.values()))
