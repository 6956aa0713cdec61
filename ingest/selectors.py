"""Ingest's reads, for detectors and the console. Every function runs as the tenant
(tenant_context) and returns the contract's row types (contract.rows): per series, numpy
arrays of timestamps (float seconds since the epoch, millisecond resolution) and values.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from django.db import connection
from django.db.models import Max, Min, Q, Sum, TextField
from django.db.models.functions import Cast

from contract import signals
from contract.rows import (
    EventRow,
    JobMeta,
    LogRow,
    ProcessInfo,
    SeriesData,
    SeriesInfo,
    labels_key,
)
from ingest import blocks
from ingest.models import (
    TERMINAL_JOB_STATES,
    Event,
    Gpu,
    Job,
    JobRank,
    LogLine,
    Node,
    Process,
    Series,
    SeriesRollup,
)
from ingest.storage import read_block_payloads
from tenants.access import Principal, get_object_for_tenant
from tenants.context import system_context, tenant_context

# The cumulative hardware counters of docs/design.md §4 (GPU scope) that long-range reads ask for.
GPU_COUNTERS: tuple[str, ...] = (
    signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
    signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
    signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    signals.DCGM_FI_DEV_ROW_REMAP_FAILURE,
    signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
)


@dataclass(frozen=True)
class RollupData:
    info: SeriesInfo
    bucket_start: np.ndarray  # float64 seconds, start of each hour
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray
    first: np.ndarray
    last: np.ndarray


def _raw_fetchall(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Rows of one query on the current connection (same transaction, same tenant setting).

    On PostgreSQL through a plain psycopg cursor: parameters are bound server-side instead of
    being spliced into the SQL text client-side.
    """
    if connection.vendor == "postgresql":
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as raw:
            raw.execute(sql, params)
            rows: list[tuple[Any, ...]] = raw.fetchall()
            return rows
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def _series_of(qs: Any) -> tuple[list[int], set[int]]:
    """The ids and node ids of the series the (tenant-scoped) queryset selects, in one plain
    query (no ORM row objects)."""
    sql, params = qs.values_list("id", "node_id").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        pairs = cursor.fetchall()
    return [p[0] for p in pairs], {p[1] for p in pairs}


def _fill_infos(qs: Any, ids: list[int]) -> dict[int, SeriesInfo]:
    """SeriesInfo of these series (those `qs` selects).

    Series rows never change once written, so they are cached per process, as are node
    hostnames and job ids by pk. On a miss, the queryset's rows come in one plain query (the
    ORM's per-row JSON decoding cost more than the rest of a 6,400-series read), without
    joins: the few nodes and jobs they name are looked up apart.
    """
    if any(i not in _INFO_CACHE for i in ids):
        sql, params = (
            qs.annotate(labels_text=Cast("labels", TextField()))
            .values_list(
                "id",
                "name",
                "node_id",
                "gpu",
                "gpu_index",
                "pid",
                "job_id",
                "rank",
                "local_rank",
                "labels_text",
            )
            .query.sql_with_params()
        )
        rows = [r for r in _raw_fetchall(sql, list(params)) if r[0] not in _INFO_CACHE]
        nodes = {r[2] for r in rows if r[2] is not None} - _HOSTNAMES.keys()
        if nodes:
            _HOSTNAMES.update(Node.objects.filter(id__in=nodes).values_list("id", "hostname"))
        jobs = {r[6] for r in rows if r[6] is not None} - _JOB_IDS.keys()
        if jobs:
            _JOB_IDS.update(Job.objects.filter(id__in=jobs).values_list("id", "job_id"))
        for sid, name, node_id, gpu, gidx, pid, job_pk, rank, lrank, labels in rows:
            if isinstance(labels, str):
                labels = {} if labels in ("{}", "") else json.loads(labels)
            node = _HOSTNAMES.get(node_id, "") if node_id is not None else ""
            job = _JOB_IDS.get(job_pk, "") if job_pk is not None else ""
            _INFO_CACHE[sid] = (
                SeriesInfo(name, node, gpu, gidx, pid, job, rank, lrank, labels_key(labels)),
                node_id,
            )
    infos: dict[int, SeriesInfo] = {}
    for sid in ids:
        cached = _INFO_CACHE.get(sid)
        if cached is not None:
            infos[sid] = cached[0]
    return infos


def _infos(qs: Any) -> tuple[dict[int, SeriesInfo], set[int]]:
    """SeriesInfo of the series the (tenant-scoped) queryset selects, with their node ids."""
    ids, node_ids = _series_of(qs)
    return _fill_infos(qs, ids), node_ids


def _read_query(operator_id: int, qs: Any, t0: float, t1: float) -> list[SeriesData]:
    """Samples over [t0, t1] of the series the queryset selects. The blocks are fetched first
    and decode on the pool while the series catalog (on a first read) is fetched."""
    ids, node_ids = _series_of(qs)
    if not ids:
        return []
    t0_ms, t1_ms = _ms(t0), _ms(t1)
    pending = _fetch_and_decode(operator_id, node_ids, t0_ms, t1_ms)
    infos = _fill_infos(qs, ids)
    return _in_order(_assemble(pending, infos, t0_ms, t1_ms), infos)


_INFO_CACHE: dict[int, tuple[SeriesInfo, int]] = {}
_HOSTNAMES: dict[int, str] = {}
_JOB_IDS: dict[int, str] = {}


def clear_cache() -> None:
    _INFO_CACHE.clear()
    _HOSTNAMES.clear()
    _JOB_IDS.clear()


def _ms(ts: float) -> int:
    return round(ts * 1000)


_POOL: ThreadPoolExecutor | None = None
_DECODE_WORKERS = min(4, os.cpu_count() or 1)
# CPU seconds the pool's threads spent decoding, summed over the process's life: a caller's
# own thread time (what `proof bench live` measures per task) does not include them.
_pool_cpu = [0.0]
_pool_cpu_lock = threading.Lock()
# Per caller thread, the pool CPU of its own reads (added as it collects each task).
_caller = threading.local()


def pool_decode_cpu_s() -> float:
    """CPU seconds spent decoding blocks on the decode pool by this process so far."""
    return _pool_cpu[0]


def caller_pool_cpu_s() -> float:
    """CPU seconds the decode pool spent on this thread's reads so far: what a task's own
    `time.thread_time()` leaves out of its cost (the cadence adds it to an evaluation's)."""
    spent: float = getattr(_caller, "cpu_s", 0.0)
    return spent


# One node's blocks, decoded: (node id, its blocks, a run of one layout each as one).
_NodeBlocks = list[tuple[int, list[blocks.DecodedBlock]]]


def _decode_nodes(nodes: list[tuple[int, list[bytes]]]) -> _NodeBlocks:
    return [(node, blocks.decode_many(payloads)) for node, payloads in nodes]


def _decode_on_pool(nodes: list[tuple[int, list[bytes]]]) -> tuple[_NodeBlocks, float]:
    """The decoded nodes and the task's CPU seconds (the caller adds them to its own)."""
    began = time.thread_time()
    try:
        decoded = _decode_nodes(nodes)
    finally:  # raised or not, the CPU counts for the process
        spent = time.thread_time() - began
        with _pool_cpu_lock:
            _pool_cpu[0] += spent
    return decoded, spent


def _decode_pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_DECODE_WORKERS, thread_name_prefix="decode")
    return _POOL


@dataclass(frozen=True)
class SampleRows:
    """Samples of series that share their timestamps: `values[i]` is series `ids[i]`'s
    (`infos[i]`). A node's regular blocks read as one; any other series alone."""

    ids: list[int]
    infos: list[SeriesInfo]
    ts: np.ndarray  # float64 seconds
    values: np.ndarray  # float64, series × samples

    def series(self) -> list[SeriesData]:
        return [
            SeriesData(info, self.ts, row)
            for info, row in zip(self.infos, self.values, strict=True)
        ]


def read_samples(
    operator_id: int, infos: dict[int, SeriesInfo], node_ids: Iterable[int], t0: float, t1: float
) -> list[SeriesData]:
    """Samples of the given series over [t0, t1] (inside the caller's tenant_context), in the
    order of `infos` (a series without samples in it: empty arrays).

    Vectorised over blocks: the runs of each decoded block (one contiguous run per series) are
    ordered by (series, block) and gathered in one numpy indexing step, so the cost grows with
    the samples read, not with series × blocks in Python.
    """
    return _in_order(read_sample_rows(operator_id, infos, node_ids, t0, t1), infos)


def _in_order(read: list[SampleRows], infos: dict[int, SeriesInfo]) -> list[SeriesData]:
    """Each series of `infos` in its order, from the rows read (none: empty arrays)."""
    out: dict[int, SeriesData] = {}
    for rows in read:
        out.update(zip(rows.ids, rows.series(), strict=True))
    empty = np.zeros(0)
    return [out.get(sid) or SeriesData(info, empty, empty) for sid, info in infos.items()]


def read_sample_rows(
    operator_id: int, infos: dict[int, SeriesInfo], node_ids: Iterable[int], t0: float, t1: float
) -> list[SampleRows]:
    """read_samples' samples as they were stored: a node's series that share timestamps as
    one matrix (a reader that keeps them, the live window cache, then handles a node at a
    time, not a series); series without samples in [t0, t1] left out."""
    if not infos:
        return []
    t0_ms, t1_ms = _ms(t0), _ms(t1)
    return _assemble(_fetch_and_decode(operator_id, node_ids, t0_ms, t1_ms), infos, t0_ms, t1_ms)


# The decoded nodes, or the futures of them (with their task's CPU seconds).
_Pending = list["Future[tuple[_NodeBlocks, float]] | _NodeBlocks"]
# Blocks decoded per pool task, at least: a task's submit and result cost about what
# decoding a few blocks does, so small reads decode on the caller's thread.
DECODE_CHUNK = 64


def _fetch_and_decode(
    operator_id: int, node_ids: Iterable[int], t0_ms: int, t1_ms: int
) -> _Pending:
    """The blocks overlapping [t0_ms, t1_ms], decoded node by node (or their futures): each
    node's blocks in time order, its runs of one layout decoded together (blocks.decode_many)."""
    rows = read_block_payloads(operator_id, node_ids, t0_ms, t1_ms, with_node=True)
    by_node: dict[int, list[bytes]] = {}
    for node, payload in rows:
        by_node.setdefault(node, []).append(payload)
    if len(rows) <= DECODE_CHUNK:
        return [_decode_nodes(list(by_node.items()))]
    # zstd and numpy release the GIL: decode on a few threads, whole nodes a task.
    pool = _decode_pool()
    size = max(DECODE_CHUNK, -(-len(rows) // _DECODE_WORKERS))
    pending: _Pending = []
    task: list[tuple[int, list[bytes]]] = []
    in_task = 0
    for node, payloads in by_node.items():
        task.append((node, payloads))
        in_task += len(payloads)
        if in_task >= size:
            pending.append(pool.submit(_decode_on_pool, task))
            task, in_task = [], 0
    if task:
        pending.append(pool.submit(_decode_on_pool, task))
    return pending


def _collect(item: Future[tuple[_NodeBlocks, float]] | _NodeBlocks) -> _NodeBlocks:
    if isinstance(item, list):
        return item
    decoded, spent = item.result()
    _caller.cpu_s = caller_pool_cpu_s() + spent
    return decoded


def _assemble(
    pending: _Pending, infos: dict[int, SeriesInfo], t0_ms: int, t1_ms: int
) -> list[SampleRows]:
    out: list[SampleRows] = []
    irregular: list[blocks.DecodedBlock] = []
    for item in pending:
        for _node, node_blocks in _collect(item):
            rows = _read_regular(node_blocks, infos, t0_ms, t1_ms) if node_blocks else None
            if rows is None:
                irregular += node_blocks
            elif rows.ids:
                out.append(rows)
    for sid, s in _read_general(irregular, infos, t0_ms, t1_ms).items():
        out.append(SampleRows([sid], [s.info], s.ts, s.values.reshape(1, -1)))
    return out


def _read_regular(
    node_blocks: list[blocks.DecodedBlock],
    infos: dict[int, SeriesInfo],
    t0_ms: int,
    t1_ms: int,
) -> SampleRows | None:
    """Fast path for the usual shape: every block of the node holds the same series, each with
    the same timestamps (one collection tick for all). Then the node's samples are one
    (series × time) matrix and each series a row of it. None when the shape differs."""
    first = node_blocks[0].series_ids
    n = len(first)
    if n == 0:
        return None
    ts_rows, value_rows = [], []
    for block in node_blocks:
        if len(block.series_ids) != n or not np.array_equal(block.series_ids, first):
            return None
        if block.row_ts is not None:  # format 2 says so: no need to compare the rows
            ts_rows.append(block.row_ts)
            value_rows.append(block.values.reshape(n, len(block.row_ts)))
            continue
        per = len(block.ts_ms) // n
        if per * n != len(block.ts_ms) or not np.all(block.counts == per):
            return None
        ts = block.ts_ms.reshape(n, per)
        if not np.array_equal(ts, np.broadcast_to(ts[0], ts.shape)):
            return None
        ts_rows.append(ts[0])
        value_rows.append(block.values.reshape(n, per))
    ts_all = np.concatenate(ts_rows)
    keep = (ts_all >= t0_ms) & (ts_all <= t1_ms)
    if len(ts_all) > 1 and not np.all(np.diff(ts_all[keep]) >= 0):
        return None
    wanted = np.fromiter((i in infos for i in first.tolist()), dtype=bool, count=n)
    # Select rows (series) and columns (time) block by block: one copy of what is kept.
    parts = []
    at = 0
    for values in value_rows:
        width = values.shape[1]
        cols = keep[at : at + width]
        at += width
        if cols.any():
            parts.append(values[wanted][:, cols] if not cols.all() else values[wanted])
    matrix = np.concatenate(parts, axis=1) if parts else np.zeros((int(wanted.sum()), 0))
    ids = first[wanted].tolist()
    return SampleRows(ids, [infos[sid] for sid in ids], ts_all[keep] / 1000.0, matrix)


def _read_general(
    decoded: list[blocks.DecodedBlock], infos: dict[int, SeriesInfo], t0_ms: int, t1_ms: int
) -> dict[int, SeriesData]:
    """Any block shape: gather each series' runs across blocks (blocks in time order)."""
    if not decoded:
        return {}
    wanted = np.fromiter(infos.keys(), dtype=np.int64)
    # Which blocks' series are wanted, in one membership test over every block: np.isin
    # sorts both sides on each call, and one call per block cost a 200-GPU inference job's
    # evaluation ~7 s on the fleet bench (cProfile's wall time under load, 194 blocks).
    every_sid = np.concatenate([block.series_ids for block in decoded])
    wanted_rows = np.split(
        np.isin(every_sid, wanted), np.cumsum([len(b.series_ids) for b in decoded])[:-1]
    )
    run_sid, run_start, run_len, ts_parts, value_parts = [], [], [], [], []
    offset = 0
    for block, keep in zip(decoded, wanted_rows, strict=True):
        starts = np.concatenate(([0], np.cumsum(block.counts)[:-1])) + offset
        run_sid.append(block.series_ids[keep])
        run_start.append(starts[keep])
        run_len.append(block.counts[keep])
        ts_parts.append(block.ts_ms)
        value_parts.append(block.values)
        offset += len(block.ts_ms)
    sids = np.concatenate(run_sid)
    if not len(sids):  # none of the wanted series is in these blocks
        return {}
    starts = np.concatenate(run_start)
    lens = np.concatenate(run_len)
    order = np.argsort(sids, kind="stable")  # blocks arrive in time order: stable keeps it
    sids, starts, lens = sids[order], starts[order], lens[order]
    run_offsets = np.concatenate(([0], np.cumsum(lens)))
    total = int(run_offsets[-1])
    gather = np.arange(total, dtype=np.int64) + np.repeat(starts - run_offsets[:-1], lens)
    ts = np.concatenate(ts_parts)[gather]
    values = np.concatenate(value_parts)[gather]
    inside = (ts >= t0_ms) & (ts <= t1_ms)
    # Per-series bounds from the runs (no sort over samples): series i owns the runs between
    # its first run and the next series' first run; `kept` maps run bounds past the filter.
    kept = np.concatenate(([0], np.cumsum(inside)))
    first_run = np.flatnonzero(np.concatenate(([True], sids[1:] != sids[:-1])))
    bounds = kept[run_offsets[np.append(first_run, len(sids))]]
    ts, values = ts[inside] / 1000.0, values[inside]
    return {
        int(sids[r]): SeriesData(infos[int(sids[r])], ts[a:b], values[a:b])
        for r, a, b in zip(first_run, bounds[:-1], bounds[1:], strict=True)
    }


def _job_series_selection(operator_id: int, job_id: str) -> tuple[Any, frozenset[str]] | None:
    """The series of job J (inside the caller's tenant_context): those carrying the job's id,
    plus the GPU-scope series (no job key) of the GPUs its ranks ran on — as a queryset, with
    those GPUs. None: no such job."""
    job = Job.objects.for_tenant(operator_id).filter(job_id=job_id).first()
    if job is None:
        return None
    gpus = frozenset(
        g
        for g in JobRank.objects.for_tenant(operator_id)
        .filter(job=job)
        .values_list("gpu", flat=True)
        if g
    )
    query = Q(job=job)
    if gpus:
        query |= Q(job__isnull=True, gpu__in=sorted(gpus))
    return Series.objects.for_tenant(operator_id).filter(query), gpus


def _job_series_query(operator_id: int, job_id: str) -> Any:
    """`_job_series_selection`'s queryset (None: no such job)."""
    selection = _job_series_selection(operator_id, job_id)
    return None if selection is None else selection[0]


def job_series(operator_id: int, job_id: str, t0: float, t1: float) -> list[SeriesData]:
    """All series of job J over [t0, t1] (see `_job_series_query`)."""
    with tenant_context(operator_id):
        qs = _job_series_query(operator_id, job_id)
        return [] if qs is None else _read_query(operator_id, qs, t0, t1)


@dataclass(frozen=True)
class SeriesCatalog:
    """Which series a read covers: their identities by series id, and the nodes whose blocks
    hold them. For readers that read the same series again and again (the live pipeline reads
    each job's newest samples every few seconds) and need not look them up each time."""

    infos: dict[int, SeriesInfo]
    node_ids: frozenset[int]
    # What a later read may start from (`known=`): series rows are never changed once
    # written and their ids only grow, so the series a catalog lacks are those with a higher
    # id — unless what selects them changed (a job's rank GPUs, whose GPU-scope series
    # already existed).
    max_id: int = 0
    gpus: frozenset[str] = frozenset()


def _extend(
    known: SeriesCatalog | None,
    infos: dict[int, SeriesInfo],
    node_ids: set[int],
    gpus: frozenset[str] = frozenset(),
) -> SeriesCatalog:
    """`known` plus the series just read (all of them when `known` is None)."""
    top = max(infos, default=0)
    if known is None:
        return SeriesCatalog(infos, frozenset(node_ids), top, gpus)
    if not infos:
        return known
    return SeriesCatalog(
        {**known.infos, **infos}, known.node_ids | node_ids, max(known.max_id, top), gpus
    )


def job_series_catalog(
    operator_id: int, job_id: str, known: SeriesCatalog | None = None
) -> SeriesCatalog:
    """The catalog of `job_series` (empty for an unknown job). With `known` (an earlier
    catalog of the same job) only series newer than it are read, unless the job's rank GPUs
    changed: the live pipeline re-reads a 200-GPU job's 6,400-series catalog every 15 s, and
    reading it whole was a tenth of the evaluation."""
    with tenant_context(operator_id):
        selection = _job_series_selection(operator_id, job_id)
        if selection is None:
            return SeriesCatalog({}, frozenset())
        qs, gpus = selection
        if known is not None and known.gpus == gpus:
            infos, node_ids = _infos(qs.filter(id__gt=known.max_id))
            return _extend(known, infos, node_ids, gpus)
        infos, node_ids = _infos(qs)
        return _extend(None, infos, node_ids, gpus)


def node_series_catalog(
    operator_id: int, hostname: str, *, node_level: bool = False
) -> SeriesCatalog:
    """The catalog of `node_series` (all of the node's series), or with `node_level` only the
    node's own (no GPU, process or job key: InfiniBand ports, storage mounts, host readings),
    which is what a job's window reads of its nodes beside the job's own series."""
    with tenant_context(operator_id):
        qs = Series.objects.for_tenant(operator_id).filter(node__hostname=hostname)
        if node_level:
            qs = qs.filter(gpu="", pid__isnull=True, job__isnull=True)
        infos, node_ids = _infos(qs)
        return _extend(None, infos, node_ids)


def nodes_series_catalogs(
    operator_id: int,
    hostnames: Iterable[str],
    *,
    node_level: bool = False,
    known: dict[str, SeriesCatalog] | None = None,
) -> dict[str, SeriesCatalog]:
    """`node_series_catalog` of several nodes in one query (hostname → catalog; every
    hostname asked has one, empty for an unknown node): a 25-node job's window refreshes its
    nodes' catalogs together, and one query each was 25 round trips every META_TTL_S. With
    `known` (earlier catalogs of these nodes, read with the same `node_level`) holding every
    hostname asked, only series newer than the oldest of them are read."""
    wanted = sorted(set(hostnames))
    out = {hostname: SeriesCatalog({}, frozenset()) for hostname in wanted}
    if not wanted:
        return out
    since = None
    if known is not None and all(h in known for h in wanted):
        since = min(known[h].max_id for h in wanted)
    with tenant_context(operator_id):
        qs = Series.objects.for_tenant(operator_id).filter(node__hostname__in=wanted)
        if node_level:
            qs = qs.filter(gpu="", pid__isnull=True, job__isnull=True)
        if since is not None:
            qs = qs.filter(id__gt=since)
        infos, _ = _infos(qs)
    by_node: dict[str, dict[int, SeriesInfo]] = {}
    for sid, info in infos.items():
        by_node.setdefault(info.node, {})[sid] = info
    # Every series of these nodes with an id up to here has been read (now or before): the
    # next read of any of them need not go further back, even for a node with nothing new.
    scanned = max(max(infos, default=0), since or 0)
    for hostname in wanted:
        node_infos = by_node.get(hostname, {})
        node_ids = {_INFO_CACHE[sid][1] for sid in node_infos if sid in _INFO_CACHE}
        if since is not None and known is not None:
            catalog = _extend(known[hostname], node_infos, node_ids)
        else:
            catalog = _extend(None, node_infos, node_ids)
        out[hostname] = replace(catalog, max_id=max(catalog.max_id, scanned))
    return out


def catalog_samples(
    operator_id: int, catalog: SeriesCatalog, t0: float, t1: float
) -> list[SeriesData]:
    """Samples over [t0, t1] of the catalog's series (one block query)."""
    with tenant_context(operator_id):
        return read_samples(operator_id, catalog.infos, catalog.node_ids, t0, t1)


def catalog_sample_rows(
    operator_id: int, catalog: SeriesCatalog, t0: float, t1: float
) -> list[SampleRows]:
    """catalog_samples as read_sample_rows gives them (series without samples left out)."""
    with tenant_context(operator_id):
        return read_sample_rows(operator_id, catalog.infos, catalog.node_ids, t0, t1)


def gpu_series(
    operator_id: int, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
) -> list[SeriesData]:
    """Every series of one GPU (by UUID) over [t0, t1], whichever job or process they carry
    (or those of the signals named)."""
    with tenant_context(operator_id):
        qs = Series.objects.for_tenant(operator_id).filter(gpu=gpu)
        if names is not None:
            qs = qs.filter(name__in=list(names))
        return _read_query(operator_id, qs, t0, t1)


def node_series(
    operator_id: int, hostname: str, t0: float, t1: float, names: Iterable[str] | None = None
) -> list[SeriesData]:
    """A node's signals (all its series, or those named) over [t0, t1]."""
    with tenant_context(operator_id):
        qs = Series.objects.for_tenant(operator_id).filter(node__hostname=hostname)
        if names is not None:
            qs = qs.filter(name__in=list(names))
        return _read_query(operator_id, qs, t0, t1)


def gpu_counters(
    operator_id: int,
    gpu_uuid: str,
    t0: float,
    t1: float,
    names: Iterable[str] = GPU_COUNTERS,
) -> list[RollupData]:
    """One GPU's counters over a long range (e.g. 30 days) from the hourly rollups."""
    with tenant_context(operator_id):
        infos, _ = _infos(
            Series.objects.for_tenant(operator_id).filter(gpu=gpu_uuid, name__in=list(names))
        )
        rows = (
            SeriesRollup.objects.for_tenant(operator_id)
            .filter(
                series_id__in=list(infos),
                bucket_start_ms__gte=_ms(t0) - _ms(t0) % 3_600_000,
                bucket_start_ms__lte=_ms(t1),
            )
            .order_by("series_id", "bucket_start_ms")
            .values_list("series_id", "bucket_start_ms", "count", "min", "max", "first", "last")
        )
        table = np.array(list(rows), dtype=np.float64).reshape(-1, 7)
    out = []
    for sid, info in infos.items():
        part = table[table[:, 0] == sid]
        out.append(
            RollupData(
                info,
                part[:, 1] / 1000.0,
                part[:, 2].astype(np.int64),
                part[:, 3],
                part[:, 4],
                part[:, 5],
                part[:, 6],
            )
        )
    return out


def job_logs(
    operator_id: int,
    job_id: str,
    around: float,
    before_s: float = 60.0,
    after_s: float = 60.0,
    limit: int = 1000,
) -> list[LogRow]:
    """Log lines of job J from `before_s` before to `after_s` after `around`, oldest first."""
    lo, hi = int((around - before_s) * 1e6), int((around + after_s) * 1e6)
    with tenant_context(operator_id):
        rows = (
            LogLine.objects.for_tenant(operator_id)
            .filter(job__job_id=job_id, ts_us__gte=lo, ts_us__lte=hi)
            .order_by("ts_us", "id")
            .values_list("ts_us", "node__hostname", "pid", "rank", "step", "stream", "line")[:limit]
        )
        return [
            LogRow(ts / 1e6, node or "", pid, rank, s, line, step)
            for ts, node, pid, rank, step, s, line in rows
        ]


def events(
    operator_id: int,
    *,
    gpu: str | None = None,
    node: str | None = None,
    t0: float | None = None,
    t1: float | None = None,
    limit: int = 1000,
) -> list[EventRow]:
    """Events of a GPU (by UUID) or of a node (by hostname; its GPUs' events included)."""
    if (gpu is None) == (node is None):
        raise ValueError("pass exactly one of gpu= or node=")
    with tenant_context(operator_id):
        qs = Event.objects.for_tenant(operator_id)
        qs = qs.filter(gpu=gpu) if gpu is not None else qs.filter(node__hostname=node)
        if t0 is not None:
            qs = qs.filter(ts_us__gte=int(t0 * 1e6))
        if t1 is not None:
            qs = qs.filter(ts_us__lte=int(t1 * 1e6))
        return _event_rows(qs, limit)


def _event_rows(qs: Any, limit: int) -> list[EventRow]:
    """The events a (tenant-scoped) queryset selects, oldest first, at most `limit`."""
    rows = qs.order_by("ts_us", "id").values_list(
        "ts_us",
        "name",
        "node__hostname",
        "gpu",
        "gpu_index",
        "job__job_id",
        "value",
        "text",
        "labels",
    )[:limit]
    return [
        EventRow(ts / 1e6, name, n or "", g, gi, j or "", v, text, labels or {})
        for ts, name, n, g, gi, j, v, text, labels in rows
    ]


def events_of_nodes(
    operator_id: int,
    hostnames: Iterable[str],
    *,
    t0: float,
    t1: float,
    limit: int = 1000,
) -> list[EventRow]:
    """Events of several nodes (their GPUs' included) over [t0, t1], oldest first: one query
    for a job's nodes rather than one per node."""
    with tenant_context(operator_id):
        qs = Event.objects.for_tenant(operator_id).filter(
            node__hostname__in=list(hostnames),
            ts_us__gte=int(t0 * 1e6),
            ts_us__lte=int(t1 * 1e6),
        )
        return _event_rows(qs, limit)


def node_inventory(operator_id: int, hostname: str) -> dict[str, Any] | None:
    """A node with its GPUs, as registered."""
    with tenant_context(operator_id):
        node = Node.objects.for_tenant(operator_id).filter(hostname=hostname).first()
        if node is None:
            return None
        gpus = list(
            Gpu.objects.for_tenant(operator_id)
            .filter(node=node)
            .order_by("index")
            .values("uuid", "index", "model", "memory_mib", "driver_version", "cuda_version")
        )
        return {"hostname": node.hostname, "agent_version": node.agent_version, "gpus": gpus}


# --- inventory, for the detectors' stores ----------------------------------------------------


def gpu_location(operator_id: int, gpu: str) -> tuple[str, int | None] | None:
    """One registered GPU's (node hostname, index on the node), or None if unknown."""
    with tenant_context(operator_id):
        row = (
            Gpu.objects.for_tenant(operator_id)
            .filter(uuid=gpu)
            .values_list("node__hostname", "index")
            .first()
        )
    return None if row is None else (row[0] or "", row[1])


def gpu_locations(operator_id: int) -> dict[str, tuple[str, int | None]]:
    """Every registered GPU of the tenant: UUID → (node hostname, index on the node)."""
    with tenant_context(operator_id):
        return {
            uuid: (node or "", index)
            for uuid, node, index in Gpu.objects.for_tenant(operator_id).values_list(
                "uuid", "node__hostname", "index"
            )
        }


def job_metas(operator_id: int, spans: dict[str, tuple[float, float]]) -> dict[str, JobMeta]:
    """The jobs of `spans` and their reruns and originals (not the whole fleet), as the
    detectors see them. `spans` gives each job's data span (first, last sample ts): the job
    rows carry wall-clock times only, which say nothing of a replayed trace."""
    names = set(spans)
    with tenant_context(operator_id):
        qs = Job.objects.for_tenant(operator_id)
        rows = list(qs.filter(job_id__in=names))
        related = {j.rerun_of for j in rows if j.rerun_of}
        rows += list(qs.filter(job_id__in=related - names))
        rows += list(qs.filter(rerun_of__in=names).exclude(job_id__in=names | related))
    out = {}
    for job in rows:
        first, last = spans.get(job.job_id, (float("inf"), float("-inf")))
        out[job.job_id] = JobMeta(
            job=job.job_id,
            kind=job.kind or "training",
            name=job.name,
            nodes=[str(n) for n in (job.nodes or [])],
            world_size=job.world_size,
            state=job.state if job.state != "unknown" else "running",
            exit_code=job.exit_code,
            rerun_of=job.rerun_of or None,
            config=dict(job.config or {}),
            first_ts=first,
            last_ts=last,
            end_ts=job.ended_at.timestamp() if job.ended_at else None,
        )
    return out


def job_processes(
    operator_id: int,
    job_id: str,
    first_ts: float | None,
    gpus: dict[str, tuple[str, int | None]] | None = None,
) -> list[ProcessInfo]:
    """The processes of job J with their rank, GPU and exit. `first_ts` is the job's first
    data time where known (ingest's first-seen wall clock says nothing of a replay); `gpus`
    is gpu_locations() when the caller has it already."""
    gpus = gpu_locations(operator_id) if gpus is None else gpus
    with tenant_context(operator_id):
        rows = list(
            Process.objects.for_tenant(operator_id)
            .filter(job__job_id=job_id)
            .values_list(
                "node__hostname",
                "pid",
                "rank",
                "local_rank",
                "gpu",
                "cmd",
                "first_seen_at",
                "exit_code",
                "exited_at",
            )
        )
    return [
        ProcessInfo(
            node=node or "",
            pid=int(pid),
            job=job_id,
            rank=rank,
            local_rank=local_rank,
            gpu=gpu or "",
            gpu_index=gpus.get(gpu, ("", None))[1] if gpu else None,
            cmd=cmd or "",
            first_ts=first_ts if first_ts is not None else seen.timestamp(),
            exit_code=exit_code,
            exit_ts=exited.timestamp() if exited else None,
        )
        for node, pid, rank, local_rank, gpu, cmd, seen, exit_code, exited in rows
    ]


def job_by_pk(operator_id: int, job_pk: int) -> Job | None:
    """The tenant's job row, or None (another tenant's pk is None too)."""
    with tenant_context(operator_id):
        return Job.objects.for_tenant(operator_id).filter(pk=job_pk).first()


def jobs_oldest_first(operator_id: int) -> list[Job]:
    """Every job of the tenant, oldest first, with its ranks (`job.ranks.all()` is read along:
    no query per job)."""
    with tenant_context(operator_id):
        return list(Job.objects.for_tenant(operator_id).order_by("pk").prefetch_related("ranks"))


def job_for(principal: Principal, job_id: str) -> Job:
    """The job `job_id` as `principal` may see it; Http404 otherwise (another tenant's job, or
    another customer's for a customer principal)."""
    return get_object_for_tenant(Job, principal, job_id=job_id)


def running_jobs_on_nodes(operator_id: int, node_pks: Iterable[int]) -> list[tuple[int, int]]:
    """(job pk, node pk) of every job not yet ended with a rank on one of these nodes."""
    with tenant_context(operator_id):
        return list(
            JobRank.objects.for_tenant(operator_id)
            .filter(node_id__in=list(node_pks))
            .exclude(job__state__in=list(TERMINAL_JOB_STATES))
            .values_list("job_id", "node_id")
            .distinct()
        )


def gpus_seen_since(since: datetime) -> list[tuple[int, str]]:
    """(operator id, GPU uuid) of every GPU any agent of any operator reported since `since`:
    the fleet-health fan-out's list, read across tenants on purpose."""
    with system_context():
        rows = Gpu.objects.filter(last_seen_at__gte=since)
        return [(int(o), str(u)) for o, u in rows.values_list("operator_id", "uuid")]


def nodes_with_gpus_seen_since(since: datetime) -> list[tuple[int, str]]:
    """(operator id, node hostname) of every node with a GPU reported since `since`, across
    tenants on purpose: the fleet-health fan-out evaluates a node's GPUs together."""
    with system_context():
        rows = (
            Gpu.objects.filter(last_seen_at__gte=since)
            .values_list("operator_id", "node__hostname")
            .distinct()
        )
        return sorted((int(o), str(h)) for o, h in rows)


def gpus_reported_between(
    operator_id: int, t0_ms: int, t1_ms: int
) -> dict[str, tuple[str, set[str]]]:
    """GPU uuid → (model, hostnames) of every GPU with at least one sample in an hourly
    rollup bucket starting in [t0_ms, t1_ms): the stored proof that an agent reported the GPU
    then (billing's metering, docs/billing.md). By NVML UUID, so a GPU moved to another node,
    or a node re-imaged under the same name, is the same GPU; the hostnames say where it was."""
    with tenant_context(operator_id):
        # Two reads, not one join: the series of the period's buckets (an index range of the
        # rollups), then those series' GPU and node. Joined in one statement, a planner
        # without fresh statistics (right after a bulk of rollups) nested-looped every bucket
        # over the nodes: 2 s for a 1,000-GPU day, against tens of ms this way.
        series_ids = list(
            SeriesRollup.objects.for_tenant(operator_id)
            .filter(bucket_start_ms__gte=t0_ms, bucket_start_ms__lt=t1_ms, count__gt=0)
            .values_list("series_id", flat=True)
            .distinct()
        )
        rows = (
            Series.objects.for_tenant(operator_id)
            .filter(pk__in=series_ids)
            .exclude(gpu="")
            .values_list("gpu", "node__hostname")
            .distinct()
        )
        found: dict[str, set[str]] = {}
        for uuid, hostname in rows:
            found.setdefault(str(uuid), set()).update([hostname] if hostname else [])
        models = dict(
            Gpu.objects.for_tenant(operator_id)
            .filter(uuid__in=list(found))
            .values_list("uuid", "model")
        )
        return {u: (str(models.get(u) or ""), hosts) for u, hosts in found.items()}


def gpus_seen_count(operator_id: int, since: datetime) -> int:
    """How many of the operator's GPUs an agent reported since `since` (the inventory's
    last_seen_at, moved by every batch): the GPUs reporting now, before their hour's rollup
    exists (billing's projection of today)."""
    with tenant_context(operator_id):
        return Gpu.objects.for_tenant(operator_id).filter(last_seen_at__gte=since).count()


def gpus_of_node(operator_id: int, hostname: str) -> dict[str, int | None]:
    """GPU uuid → index of the node's registered GPUs."""
    with tenant_context(operator_id):
        return dict(
            Gpu.objects.for_tenant(operator_id)
            .filter(node__hostname=hostname)
            .values_list("uuid", "index")
        )


# --- rollups of many GPUs at once, for the console's fleet pages -----------------------------


@dataclass(frozen=True)
class GpuBucket:
    """One GPU's readings of one signal over one hourly rollup bucket, across every series of
    that GPU and signal (a GPU's samples carry the running job's keys, so one GPU has one
    series per job it ran, and one without job keys for the time it ran none)."""

    gpu: str
    name: str
    bucket_start: float  # seconds
    count: int
    mean: float
    min: float
    max: float


def _gpu_rollup_rows(
    operator_id: int, names: Iterable[str], gpus: Iterable[str] | None, since_ms: int
) -> Any:
    """(gpu, name, bucket) aggregates of the rollups of GPU-scope series named `names` (of
    `gpus`, or of every GPU) from `since_ms` on: one row per GPU, signal and bucket."""
    series = Series.objects.for_tenant(operator_id).filter(name__in=list(names)).exclude(gpu="")
    if gpus is not None:
        series = series.filter(gpu__in=list(gpus))
    return (
        SeriesRollup.objects.for_tenant(operator_id)
        .filter(series__in=series.values("id"), bucket_start_ms__gte=since_ms)
        .values("series__gpu", "series__name", "bucket_start_ms")
        .annotate(n=Sum("count"), total=Sum("sum"), lo=Min("min"), hi=Max("max"))
    )


def latest_gpu_buckets(
    operator_id: int,
    names: Iterable[str],
    *,
    since: float,
    gpus: Iterable[str] | None = None,
) -> dict[tuple[str, str], GpuBucket]:
    """(gpu uuid, signal) → the newest rollup bucket holding samples from `since` on, of each
    GPU (`gpus`, or every GPU of the tenant) for each signal: what a fleet view at 10,000 GPUs
    can afford instead of reading samples. The rollups are hourly and rebuilt every 15 minutes
    (ingest-rollups), so "newest" is the current hour, up to 15 min behind. The bucket that
    `since` falls in counts: a GPU last heard 65 min ago is in the last 2 h whatever the minute
    of the hour (a bucket-start cut-off dropped it in the hour's first 5 minutes).

    Two index reads — the series (by GPU and name), then their buckets by series id — summed
    per (GPU, signal, bucket) here. As one query joining the rollups to their series, with
    the newest bucket picked by a window function, PostgreSQL scanned every series of the
    tenant (a seq scan evaluating the row-level security policy on each): ~60 ms for one
    fleet page's 400 GPUs of the bench's 10,000, against ~8 ms for the two reads."""
    with tenant_context(operator_id):
        since_ms = _ms(since)
        series = Series.objects.for_tenant(operator_id).filter(name__in=list(names)).exclude(gpu="")
        if gpus is not None:
            series = series.filter(gpu__in=list(gpus))
        keys = {sid: (gpu, name) for sid, gpu, name in series.values_list("id", "gpu", "name")}
        if not keys:
            return {}
        rows = (
            SeriesRollup.objects.for_tenant(operator_id)
            .filter(series_id__in=list(keys), bucket_start_ms__gte=since_ms - since_ms % 3_600_000)
            .values_list("series_id", "bucket_start_ms", "count", "sum", "min", "max")
        )
        # (gpu, name) → [bucket, count, sum, min, max] of its newest bucket so far.
        newest: dict[tuple[str, str], list[Any]] = {}
        for sid, bucket, count, total, lo, hi in rows:
            key = keys[sid]
            cur = newest.get(key)
            if cur is None or bucket > cur[0]:
                newest[key] = [bucket, count, total, lo, hi]
            elif bucket == cur[0]:
                cur[1] += count
                cur[2] += total
                cur[3] = min(cur[3], lo)
                cur[4] = max(cur[4], hi)
        return {
            (gpu, name): GpuBucket(gpu, name, b / 1000.0, int(n), total / n if n else 0.0, lo, hi)
            for (gpu, name), (b, n, total, lo, hi) in newest.items()
        }


def gpu_buckets(
    operator_id: int, gpus: Iterable[str], names: Iterable[str], t0: float
) -> dict[tuple[str, str], list[GpuBucket]]:
    """(gpu uuid, signal) → the GPU's hourly buckets since `t0`, oldest first, for several
    GPUs and signals in one query (trend charts over days: 24 points a day per line)."""
    with tenant_context(operator_id):
        start = _ms(t0) - _ms(t0) % 3_600_000
        rows = (
            _gpu_rollup_rows(operator_id, names, gpus, start)
            .order_by("series__gpu", "series__name", "bucket_start_ms")
            .values_list("series__gpu", "series__name", "bucket_start_ms", "n", "total", "lo", "hi")
        )
        out: dict[tuple[str, str], list[GpuBucket]] = {}
        for gpu, name, b, n, total, lo, hi in rows:
            out.setdefault((gpu, name), []).append(
                GpuBucket(gpu, name, b / 1000.0, int(n), total / n if n else 0.0, lo, hi)
            )
        return out


@dataclass(frozen=True)
class IdleHolder:
    """A GPU whose newest rollup bucket shows memory held all along and next to no activity."""

    gpu: str
    bucket_start: float  # seconds
    samples: int  # memory samples in the bucket
    memory_min_mib: float
    memory_mean_mib: float
    activity: float  # mean over the bucket, 0–1


def idle_gpus_holding_memory(
    operator_id: int,
    *,
    since: float,
    min_memory_mib: float,
    max_activity: float,
    activity_names: tuple[str, str] = (
        signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        signals.DCGM_FI_DEV_GPU_UTIL,
    ),
    limit: int = 50,
) -> tuple[int, float | None, list[IdleHolder]]:
    """GPUs idle while holding memory in the tenant's newest rollup hour starting at or after
    `since` (one query over the whole fleet): framebuffer used ≥ `min_memory_mib` at every
    sample of the hour so far (its minimum) while the mean activity — the first of
    `activity_names` (a 0–1 ratio) the GPU reports, else the second (a percentage) — is at
    most `max_activity`. A process holding memory and launching nothing: a hung or abandoned
    job, a notebook left open. Returns (how many GPUs, the hour's start, the `limit` holding
    most memory).

    One hour for the whole fleet (the newest any series has, found by the (operator, bucket)
    index), not each series' own newest: the hour's rows are one index range, where finding
    every series' newest bucket is one index probe per series (30,000 at 10,000 GPUs). A GPU
    whose rollup of that hour is missing (its node's batches late) is not listed until it is
    there."""
    fb = signals.DCGM_FI_DEV_FB_USED
    ratio, percent = activity_names
    series, rollup = Series._meta.db_table, SeriesRollup._meta.db_table
    # S608: table names are the models' own; every value is a bound parameter.
    sql = f"""
        WITH hour AS (
            SELECT MAX(bucket_start_ms) AS bucket FROM {rollup}
            WHERE operator_id = %s AND bucket_start_ms >= %s
        ), latest AS (
            SELECT s.gpu, s.name, SUM(r.count) AS n, SUM(r.sum) / SUM(r.count) AS mean,
                   MIN(r.min) AS lo
            FROM {rollup} r JOIN {series} s ON s.id = r.series_id
            WHERE r.operator_id = %s AND r.bucket_start_ms = (SELECT bucket FROM hour)
              AND s.operator_id = %s AND s.gpu <> '' AND s.name IN (%s, %s, %s)
            GROUP BY s.gpu, s.name
        ), per_gpu AS (
            SELECT gpu,
                   MAX(CASE WHEN name = %s THEN n END) AS n,
                   MAX(CASE WHEN name = %s THEN lo END) AS memory_min,
                   MAX(CASE WHEN name = %s THEN mean END) AS memory_mean,
                   COALESCE(MAX(CASE WHEN name = %s THEN mean END),
                            MAX(CASE WHEN name = %s THEN mean END) / 100.0) AS activity
            FROM latest GROUP BY gpu
        )
        SELECT gpu, (SELECT bucket FROM hour), n, memory_min, memory_mean, activity,
               COUNT(*) OVER () AS total
        FROM per_gpu
        WHERE memory_min >= %s AND activity <= %s
        ORDER BY memory_min DESC, gpu
        LIMIT %s
    """  # noqa: S608
    params: list[Any] = [
        operator_id,
        _ms(since),
        operator_id,
        operator_id,
        fb,
        ratio,
        percent,
        fb,
        fb,
        fb,
        ratio,
        percent,
        float(min_memory_mib),
        float(max_activity),
        int(limit),
    ]
    with tenant_context(operator_id), connection.cursor() as cursor:
        # Django's cursor (not _raw_fetchall's): one small result, and the console's query
        # counts (django_assert_num_queries) see the statement.
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return 0, None, []
    return (
        int(rows[0][6]),
        rows[0][1] / 1000.0,
        [
            IdleHolder(str(g), b / 1000.0, int(n or 0), float(lo), float(mean or 0.0), float(a))
            for g, b, n, lo, mean, a, _ in rows
        ],
    )
