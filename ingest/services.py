"""Ingest's writes. Each public function owns its transaction and runs as the tenant.

`store_batch()` is the whole processing of one validated batch: the receipt (idempotency),
inventory (nodes, jobs with their customer, ranks, processes), the series catalog, the sample
blocks, logs and events — all in one transaction, so a batch is either stored entirely and
exactly once, or not at all.

Concurrency: batches sharing nodes and jobs are stored at once (the writer threads, other
ingest processes), so every statement that locks several rows of a table locks them in one
order, ascending by key — node hostnames and series hashes on insert, job pks, process
(node, pid), job activity by job pk — and takes no lock stronger than it needs (FOR NO KEY
UPDATE on a job: the foreign-key checks of other batches' rows that reference it do not wait
for it). Two batches then never wait for each other in a cycle; docs/ingest.md, "Concurrency".
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

import numpy as np
from django.db import connection, transaction
from django.db.models import Max, Q

from contract.rows import SeriesInfo
from ingest import blocks, selectors, signals
from ingest.models import (
    TERMINAL_JOB_STATES,
    BatchReceipt,
    Event,
    Gpu,
    Job,
    JobRank,
    JobState,
    LogLine,
    Node,
    Process,
    Series,
    SeriesRollup,
)
from ingest.processing import DecodedBatch, clear_series_cache
from ingest.storage import (
    BLOCK_TABLE,
    MAX_BLOCK_SPAN_MS,
    BlockRow,
    read_block_payloads,
    write_blocks,
)
from tenants import services as tenant_services
from tenants.context import system_context, tenant_context
from tenants.models import Operator

HOUR_MS = 3_600_000


class StoreStatus(Enum):
    STORED = "stored"
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class StoreOutcome:
    status: StoreStatus
    samples: int


# Process-wide caches of ids that never change once committed. Entries are published only
# after the transaction that created them commits (on_commit), so a rolled-back batch can
# never leave an id here that points at nothing.
_cache_lock = threading.Lock()
_series_ids: dict[tuple[int, str], int] = {}
_node_ids: dict[tuple[int, str], int] = {}
# (operator, job id) → the job's pk: a job row is never deleted or re-keyed, so the lookup of
# the jobs a batch names (every batch of a job's nodes) is one dict read once it is known.
_job_ids: dict[tuple[int, str], int] = {}
# Node pk → when this process last wrote its last_seen_at (time.monotonic()). Batches move
# last_seen_at forward at most once per NODE_SEEN_INTERVAL_S per node: one UPDATE per node
# per interval, not one per batch.
NODE_SEEN_INTERVAL_S = 30.0
_node_seen: dict[int, float] = {}


def clear_caches() -> None:
    """Forget cached ids (tests: a rolled-back SQLite transaction can hand an id out again)."""
    with _cache_lock:
        _series_ids.clear()
        _node_ids.clear()
        _job_ids.clear()
        _node_seen.clear()
    selectors.clear_cache()
    clear_series_cache()  # its memos hold series ids


def series_key_hash(key: SeriesInfo) -> str:
    return hashlib.blake2b(repr(tuple(key)).encode("utf-8"), digest_size=16).hexdigest()


def _dt(ts_us: int) -> datetime:
    return datetime.fromtimestamp(ts_us / 1e6, tz=UTC)


def _publish(cache: dict[tuple[int, str], int], entries: dict[tuple[int, str], int]) -> None:
    if not entries:
        return

    def publish() -> None:
        with _cache_lock:
            cache.update(entries)

    transaction.on_commit(publish)


# --- registration ----------------------------------------------------------------------------


def register_agent(
    operator_id: int,
    *,
    agent_id: str,
    hostname: str,
    agent_version: str,
    gpus: Iterable[dict[str, Any]],
    now: datetime | None = None,
    agent_token_id: int | None = None,
) -> tuple[str, int]:
    """Record the node and its GPUs (and the agent token it registered with, when known);
    returns (session id, highest stored sequence)."""
    now = now or datetime.now(UTC)
    node_fields: dict[str, Any] = {
        "agent_id": agent_id,
        "agent_version": agent_version,
        "registered_at": now,
        "last_seen_at": now,
    }
    if agent_token_id is not None:
        node_fields["agent_token_id"] = agent_token_id
    with tenant_context(operator_id):
        node, _ = Node.objects.update_or_create(
            operator_id=operator_id, hostname=hostname, defaults=node_fields
        )
        for gpu in gpus:
            Gpu.objects.update_or_create(
                operator_id=operator_id,
                uuid=gpu["uuid"],
                defaults={
                    **{k: v for k, v in gpu.items() if k != "uuid"},
                    "node": node,
                    "last_seen_at": now,
                },
            )
        last = BatchReceipt.objects.filter(operator_id=operator_id, agent_id=agent_id).aggregate(
            last=Max("sequence")
        )["last"]
    return uuid.uuid4().hex, int(last or 0)


# --- batches ---------------------------------------------------------------------------------


def store_batch(operator_id: int, batch: DecodedBatch, now: datetime | None = None) -> StoreOutcome:
    """Store one validated batch for `operator_id` (the token's tenant, never the payload's)."""
    now = now or datetime.now(UTC)
    with tenant_context(operator_id):
        if not _claim_receipt(operator_id, batch, now):
            return StoreOutcome(StoreStatus.DUPLICATE, batch.sample_count)
        node_ids = _ensure_nodes(operator_id, _node_names(batch), now)
        touched = _touch_nodes(node_ids.values(), now)
        _touch_gpus(operator_id, batch, node_ids, touched, now)
        job_ids = _ensure_jobs(operator_id, batch, now, node_ids)
        series_ids = _resolve_series(
            operator_id, batch.series, node_ids, job_ids, batch.series_memo
        )
        write_blocks(_block_rows(operator_id, batch, series_ids, node_ids))
        _store_rows(LogLine, batch.logs, _LOG_FIELDS, operator_id, node_ids, job_ids)
        _store_rows(Event, batch.events, _EVENT_FIELDS, operator_id, node_ids, job_ids)
        _store_processes(operator_id, batch, node_ids, job_ids)
        # Announced in the same transaction: what a receiver records commits with the batch
        # (investigations notes the jobs' activity and schedules their evaluation on commit).
        job_spans, node_spans = _data_spans(batch, job_ids, node_ids)
        signals.batch_stored.send(
            sender=store_batch,
            operator_id=operator_id,
            job_spans=job_spans,
            node_spans=node_spans,
            batch=batch,
            job_ids=job_ids,
            node_ids=node_ids,
        )
    return StoreOutcome(StoreStatus.STORED, batch.sample_count)


Spans = dict[int, tuple[float, float]]


def _data_spans(
    batch: DecodedBatch, job_ids: dict[str, int], node_ids: dict[str, int]
) -> tuple[Spans, Spans]:
    """(job pk → (first, last) data time of its records, node pk → the same for samples that
    carry no job, e.g. GPU readings the agent could not attribute), seconds."""
    jobs: Spans = {}
    nodes: Spans = {}

    def add(spans: Spans, pk: int | None, lo_ms: float, hi_ms: float) -> None:
        if pk is not None:
            a, b = spans.get(pk, (lo_ms / 1e3, hi_ms / 1e3))
            spans[pk] = (min(a, lo_ms / 1e3), max(b, hi_ms / 1e3))

    if batch.sample_count:
        # Per series (min, max) with reduceat over the contiguous runs, then per job/node.
        nonzero = np.flatnonzero(batch.counts)
        starts = (np.cumsum(batch.counts) - batch.counts)[nonzero]
        lo = np.minimum.reduceat(batch.ts_ms, starts)
        hi = np.maximum.reduceat(batch.ts_ms, starts)
        groups, series_group = _span_groups(batch)
        group = series_group[nonzero]
        group_lo = np.full(len(groups), np.iinfo(np.int64).max)
        group_hi = np.full(len(groups), np.iinfo(np.int64).min)
        np.minimum.at(group_lo, group, lo)
        np.maximum.at(group_hi, group, hi)
        for (is_job, name), g in groups.items():
            if group_lo[g] > group_hi[g]:
                continue  # none of its series has a sample in this batch
            spans_of, ids = (jobs, job_ids) if is_job else (nodes, node_ids)
            add(spans_of, ids.get(name), float(group_lo[g]), float(group_hi[g]))
    for records in (batch.logs, batch.events, batch.processes, batch.exits, batch.jobs):
        for r in records:
            if r["job"]:
                add(jobs, job_ids.get(r["job"]), r["ts_us"] / 1e3, r["ts_us"] / 1e3)
    return jobs, nodes


def _span_groups(batch: DecodedBatch) -> tuple[dict[tuple[bool, str], int], np.ndarray]:
    """The (has a job, job or node name) groups of the batch's series and each series' group,
    kept in the series' memo (the same for every batch of an agent whose series are unchanged:
    850 series cost ~1.5 ms to group)."""
    memo = batch.series_memo
    known = memo.get("span_groups")
    if known is None:
        groups: dict[tuple[bool, str], int] = {}
        series_group = np.fromiter(
            (groups.setdefault((bool(k.job), k.job or k.node), len(groups)) for k in batch.series),
            dtype=np.int64,
            count=len(batch.series),
        )
        series_group.flags.writeable = False
        known = memo["span_groups"] = (groups, series_group)
    return known


def _claim_receipt(operator_id: int, batch: DecodedBatch, now: datetime) -> bool:
    """Insert the batch's receipt; False when (agent id, sequence) was stored before."""
    table = BatchReceipt._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            # S608: the table name is one of ours (a model's db_table), never input.
            f"INSERT INTO {table} (operator_id, agent_id, sequence, samples, received_at) "  # noqa: S608
            "VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (operator_id, agent_id, sequence) DO NOTHING RETURNING id",
            [operator_id, batch.agent_id, batch.sequence, batch.sample_count, now],
        )
        return cursor.fetchone() is not None


def _node_names(batch: DecodedBatch) -> set[str]:
    names = {key.node for key in batch.series}
    for records in (batch.logs, batch.events, batch.processes, batch.exits):
        names.update(r["node"] for r in records)
    return names


def _ensure_nodes(operator_id: int, names: set[str], now: datetime) -> dict[str, int]:
    found: dict[str, int] = {}
    missing = []
    for name in names:
        node_id = _node_ids.get((operator_id, name))
        if node_id is None:
            missing.append(name)
        else:
            found[name] = node_id
    if missing:
        # Sorted: a concurrent batch inserting some of the same nodes waits on each conflicting
        # row in turn, so two inserting in opposite orders would each wait for the other.
        Node.objects.bulk_create(
            [Node(operator_id=operator_id, hostname=n, last_seen_at=now) for n in sorted(missing)],
            ignore_conflicts=True,
        )
        fresh = dict(
            Node.objects.filter(operator_id=operator_id, hostname__in=missing).values_list(
                "hostname", "id"
            )
        )
        found.update(fresh)
        _publish(_node_ids, {(operator_id, n): i for n, i in fresh.items()})
    return found


def _touch_nodes(node_pks: Iterable[int], now: datetime) -> set[int]:
    """Move the batch's nodes' last_seen_at to `now`, for those not touched within
    NODE_SEEN_INTERVAL_S by this process (one statement for all of them).

    A node whose row another open transaction is updating right now is skipped, never waited
    for (SKIP LOCKED): that one is moving last_seen_at to about now itself, and waiting would
    let two batches holding each other's nodes deadlock."""
    tick = time.monotonic()
    due = sorted(pk for pk in node_pks if tick - _node_seen.get(pk, -1e18) >= NODE_SEEN_INTERVAL_S)
    if not due:
        return set()
    stale = Node.objects.filter(
        Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=now), id__in=due
    ).order_by("id")
    if connection.features.has_select_for_update_skip_locked:
        stale = stale.select_for_update(skip_locked=True, no_key=True)
    Node.objects.filter(id__in=stale.values("id")).update(last_seen_at=now)
    with _cache_lock:
        for pk in due:
            _node_seen[pk] = tick
    return set(due)


def _touch_gpus(
    operator_id: int,
    batch: DecodedBatch,
    node_ids: dict[str, int],
    touched: set[int],
    now: datetime,
) -> None:
    """The GPUs whose samples the batch carries, on the nodes `_touch_nodes` just touched: each
    gets its inventory row if it has none (an agent whose Register listed no GPUs, or a GPU
    that appeared since) and its last_seen_at moved to `now`, at the nodes' cadence (two
    statements per interval, not per batch). A GPU was "seen" only when its agent registered:
    one streaming for over a day dropped out of the fleet-health pass and the heat map."""
    if not touched:
        return
    seen: dict[str, tuple[int, int | None]] = {}
    for key in batch.series:
        if key.gpu and key.gpu not in seen:
            node = node_ids.get(key.node)
            if node in touched:
                seen[key.gpu] = (node, key.gpu_index)
    if not seen:
        return
    Gpu.objects.bulk_create(
        [
            Gpu(operator_id=operator_id, node_id=node, uuid=uuid, index=index, last_seen_at=now)
            for uuid, (node, index) in sorted(seen.items())
        ],
        ignore_conflicts=True,  # registered already (or by a concurrent batch): updated below
    )
    stale = Gpu.objects.filter(
        Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=now),
        operator_id=operator_id,
        uuid__in=list(seen),
    ).order_by("id")
    if connection.features.has_select_for_update_skip_locked:
        stale = stale.select_for_update(skip_locked=True, no_key=True)
    Gpu.objects.filter(id__in=stale.values("id")).update(last_seen_at=now)


def _job_refs(batch: DecodedBatch) -> set[str]:
    refs = {key.job for key in batch.series if key.job}
    for records in (batch.logs, batch.events, batch.processes, batch.exits):
        refs.update(r["job"] for r in records if r["job"])
    refs.update(j["job"] for j in batch.jobs)
    return refs


def _ensure_jobs(
    operator_id: int, batch: DecodedBatch, now: datetime, node_ids: dict[str, int]
) -> dict[str, int]:
    """The pk of every job the batch names (created if new). Locks, in pk order, the jobs it
    describes and those its exits may end (see _lock_order)."""
    refs = _job_refs(batch)
    if not refs:
        ending = _jobs_its_exits_may_end(operator_id, batch, node_ids, {})
        if ending:
            _apply_job_records(operator_id, {}, ending)
        return {}
    # Every record of a job in the batch, in order: one record may carry the scheduler and
    # another the state, so each applies what it says (a later value wins per field).
    records: dict[str, list[dict[str, Any]]] = {}
    for j in batch.jobs:
        records.setdefault(j["job"], []).append(j)
    existing = {ref: pk for ref in refs if (pk := _job_ids.get((operator_id, ref))) is not None}
    if len(existing) < len(refs):
        existing.update(
            Job.objects.filter(
                operator_id=operator_id, job_id__in=refs - existing.keys()
            ).values_list("job_id", "id")
        )
    missing = refs - existing.keys()
    if missing:
        new_jobs = []
        for job_id in sorted(missing):  # sorted, as the nodes (_ensure_nodes)
            attrs: dict[str, Any] = {"job_id": job_id}
            for rec in records.get(job_id, []):
                attrs = {**attrs, **rec.get("attributes", {}), "job_id": job_id}
            customer = tenant_services.customer_for_job(operator_id, attrs)
            new_jobs.append(
                Job(
                    operator_id=operator_id,
                    job_id=job_id,
                    customer=customer,
                    attributes=attrs,
                    first_seen_at=now,
                    last_seen_at=now,
                    state=JobState.RUNNING,
                )
            )
        Job.objects.bulk_create(new_jobs, ignore_conflicts=True)
        existing.update(
            Job.objects.filter(operator_id=operator_id, job_id__in=missing).values_list(
                "job_id", "id"
            )
        )
    _publish(
        _job_ids,
        {(operator_id, j): pk for j, pk in existing.items() if (operator_id, j) not in _job_ids},
    )
    ending = _jobs_its_exits_may_end(operator_id, batch, node_ids, existing)
    if records or ending:
        _apply_job_records(
            operator_id, {existing[job_id]: recs for job_id, recs in records.items()}, ending
        )
    return existing


def _jobs_its_exits_may_end(
    operator_id: int, batch: DecodedBatch, node_ids: dict[str, int], job_ids: dict[str, int]
) -> set[int]:
    """The jobs whose end the batch's exit records may decide (_end_job_when_every_rank_exited
    locks them): the job each exiting process belongs to, by its record in this batch or its
    stored row. A plain read; the rows are locked with the described jobs."""
    if not batch.exits:
        return set()
    exiting = {(node_ids[r["node"]], r["pid"]) for r in batch.exits}
    jobs = {
        job_ids[r["job"]]
        for r in batch.processes
        if r["job"] in job_ids and (node_ids[r["node"]], r["pid"]) in exiting
    }
    jobs.update(r_job for r in batch.exits if (r_job := job_ids.get(r["job"])) is not None)
    stored = Process.objects.filter(
        operator_id=operator_id,
        node_id__in={node for node, _pid in exiting},
        pid__in={pid for _node, pid in exiting},
        job__isnull=False,
    ).values_list("node_id", "pid", "job_id")
    jobs.update(job for node, pid, job in stored if (node, pid) in exiting)
    return jobs


def _apply_job_records(
    operator_id: int, recs_by_pk: dict[int, list[dict[str, Any]]], ending: Iterable[int] = ()
) -> None:
    """One locked read of the batch's described jobs and those its exits may end, in pk order
    (row by row in the ORDER BY's order: two batches naming the same jobs in different orders
    must not hold one each and wait for the other), then one save per described job of all its
    records, in order. The jobs to end are locked here, before any process or rank row: one
    that took a job's ranks and then the job deadlocked with a batch describing it (issue 16).
    FOR NO KEY UPDATE: other batches' foreign-key checks (FOR KEY SHARE) do not wait on it."""
    wanted = set(recs_by_pk) | set(ending)
    jobs = Job.objects.select_for_update(no_key=True).filter(pk__in=wanted).order_by("pk")
    for job in jobs:
        if job.pk not in recs_by_pk:
            continue
        previous = job.state
        for rec in recs_by_pk[job.pk]:
            _apply_job_record(operator_id, job, rec)
        job.save()
        if job.state != previous:
            _announce_state(job, previous)


def _apply_job_record(operator_id: int, job: Job, rec: dict[str, Any]) -> None:
    for name in ("kind", "name", "scheduler", "rerun_of"):
        if rec[name]:
            setattr(job, name, rec[name])
    for name in ("world_size", "exit_code", "config"):
        if rec[name] is not None:
            setattr(job, name, rec[name])
    if rec["nodes"]:
        job.nodes = rec["nodes"]
    if rec["attributes"]:
        job.attributes = {**job.attributes, **rec["attributes"]}
        if job.customer_id is None:
            job.customer = tenant_services.customer_for_job(operator_id, job.attributes)
    seen = _dt(rec["ts_us"])
    if rec["state"]:
        job.state = rec["state"]
        if rec["state"] in TERMINAL_JOB_STATES:
            job.ended_at = seen
    job.last_seen_at = max(job.last_seen_at, seen)


def _resolve_series(
    operator_id: int,
    keys: list[SeriesInfo],
    node_ids: dict[str, int],
    job_ids: dict[str, int],
    memo: dict[Any, Any] | None = None,
) -> np.ndarray:
    """The series ids of `keys`, inserting the new ones. `memo` (DecodedBatch.series_memo) is
    shared by the batches of an agent whose series are unchanged: it keeps their key hashes,
    and their ids once every one of them came from the committed cache."""
    memo = {} if memo is None else memo
    known = memo.get(("ids", operator_id))
    if known is not None:
        return known  # type: ignore[no-any-return]
    hashes = memo.get("hashes")
    if hashes is None:
        hashes = memo["hashes"] = [series_key_hash(k) for k in keys]
    ids = [_series_ids.get((operator_id, h)) for h in hashes]
    if None not in ids:
        # Committed ids only (_publish puts them in the cache on commit), which never change.
        found = np.array(ids, dtype=np.int64)
        found.flags.writeable = False
        memo[("ids", operator_id)] = found
        return found
    missing = {h: k for h, k, i in zip(hashes, keys, ids, strict=True) if i is None}
    if missing:
        missing = dict(sorted(missing.items()))  # inserted in hash order, as the nodes
        Series.objects.bulk_create(
            [
                Series(
                    operator_id=operator_id,
                    key_hash=h,
                    name=k.name,
                    node_id=node_ids[k.node],
                    gpu=k.gpu,
                    gpu_index=k.gpu_index,
                    pid=k.pid,
                    job_id=job_ids.get(k.job),
                    rank=k.rank,
                    local_rank=k.local_rank,
                    labels=dict(k.labels),
                )
                for h, k in missing.items()
            ],
            ignore_conflicts=True,
        )
        fresh = dict(
            Series.objects.filter(operator_id=operator_id, key_hash__in=list(missing)).values_list(
                "key_hash", "id"
            )
        )
        ids = [i if i is not None else fresh[h] for h, i in zip(hashes, ids, strict=True)]
        _publish(_series_ids, {(operator_id, h): i for h, i in fresh.items()})
    return np.array(ids, dtype=np.int64)


def _block_rows(
    operator_id: int, batch: DecodedBatch, series_ids: np.ndarray, node_ids: dict[str, int]
) -> list[BlockRow]:
    if batch.sample_count == 0:
        return []
    series_node = np.array([node_ids[k.node] for k in batch.series], dtype=np.int64)
    rows = []
    for node_id in np.unique(series_node):
        keep = (series_node == node_id) & (batch.counts > 0)
        if not keep.any():
            continue
        if keep.all():
            sids, counts, ts, values = series_ids, batch.counts, batch.ts_ms, batch.values
        else:
            sample_keep = np.repeat(keep, batch.counts)
            sids, counts = series_ids[keep], batch.counts[keep]
            ts, values = batch.ts_ms[sample_keep], batch.values[sample_keep]
        rows.append(
            BlockRow(
                operator_id=operator_id,
                node_id=int(node_id),
                start_ms=int(ts.min()),
                end_ms=int(ts.max()),
                series_count=len(sids),
                sample_count=len(ts),
                payload=blocks.encode(sids, counts, ts, values),
            )
        )
    return rows


_Row = TypeVar("_Row", LogLine, Event)
# The record fields a log line and an event keep as they are (their node and job references
# are resolved to ids).
_LOG_FIELDS = ("ts_us", "pid", "rank", "step", "stream", "line")
_EVENT_FIELDS = ("ts_us", "name", "gpu", "gpu_index", "pid", "rank", "value", "text", "labels")


def _store_rows(
    model: type[_Row],
    records: list[dict[str, Any]],
    fields: tuple[str, ...],
    operator_id: int,
    node_ids: dict[str, int],
    job_ids: dict[str, int],
) -> None:
    """Insert one row of `model` per record: `fields` copied, the node and the job by id."""
    if records:
        model.objects.bulk_create(
            [
                model(
                    operator_id=operator_id,
                    node_id=node_ids[r["node"]],
                    job_id=job_ids.get(r["job"]),
                    **{f: r[f] for f in fields},
                )
                for r in records
            ],
            batch_size=2000,
        )


def _store_processes(
    operator_id: int, batch: DecodedBatch, node_ids: dict[str, int], job_ids: dict[str, int]
) -> None:
    """Process and exit records, then the ranks they name, then the end of the jobs whose
    last rank exited (locked already, by _ensure_jobs): every process row in (node, pid) order,
    a pid's process records before its exits, then every rank row in (job, rank) order. Ranks
    written with their processes were locked in pid order, not the ranks' once a rank restarts
    under a new pid: two batches of one job deadlocked there (issue 16)."""
    ranks: dict[tuple[int, int], tuple[bool, dict[str, Any]]] = {}
    ended_jobs: set[int] = set()
    records = [(r["node"], r["pid"], 0, r) for r in batch.processes]
    records += [(r["node"], r["pid"], 1, r) for r in batch.exits]
    # Stable: one process's records keep their order.
    records.sort(key=lambda item: item[:3])
    for _node, _pid, is_exit, r in records:
        if is_exit:
            job = _store_exit(operator_id, r, node_ids)
            if job is not None:
                ended_jobs.add(job)
        else:
            _store_process(operator_id, r, node_ids, job_ids, ranks)
    for (job_id, rank), (with_gpu, rank_fields) in sorted(ranks.items()):
        # A rank's input workers (DataLoader processes) inherit its RANK but hold no GPU:
        # they name the rank only until its GPU process does, and never replace it (the
        # rank's GPU selects the job's GPU series that carry no job id).
        if with_gpu:
            JobRank.objects.update_or_create(
                operator_id=operator_id, job_id=job_id, rank=rank, defaults=rank_fields
            )
        else:
            JobRank.objects.get_or_create(
                operator_id=operator_id, job_id=job_id, rank=rank, defaults=rank_fields
            )
    for job_pk in sorted(ended_jobs):
        _end_job_when_every_rank_exited(job_pk)


def _store_process(
    operator_id: int,
    r: dict[str, Any],
    node_ids: dict[str, int],
    job_ids: dict[str, int],
    ranks: dict[tuple[int, int], tuple[bool, dict[str, Any]]],
) -> None:
    """One process record; the rank it names noted in `ranks`: the last with a GPU wins,
    else the first without (what update_or_create / get_or_create record by record left)."""
    seen = _dt(r["ts_us"])
    job_id = job_ids.get(r["job"])
    process, created = Process.objects.get_or_create(
        operator_id=operator_id,
        node_id=node_ids[r["node"]],
        pid=r["pid"],
        defaults={"first_seen_at": seen, "last_seen_at": seen},
    )
    if not created and process.exited_at is not None and seen > process.exited_at:
        # The pid was reused by a new process.
        process.first_seen_at, process.exit_code, process.exited_at = seen, None, None
    process.last_seen_at = max(process.last_seen_at, seen)
    for name in ("rank", "local_rank", "world_size"):
        if r[name] is not None:
            setattr(process, name, r[name])
    if job_id is not None:
        process.job_id = job_id
    if r["gpu"]:
        process.gpu = r["gpu"]
    if r["cmd"]:
        process.cmd = r["cmd"]
    process.save()
    if job_id is not None and r["rank"] is not None:
        rank_fields = {
            "local_rank": r["local_rank"],
            "node_id": node_ids[r["node"]],
            "gpu": r["gpu"],
            "pid": r["pid"],
        }
        key = (job_id, r["rank"])
        if r["gpu"]:
            ranks[key] = (True, rank_fields)
        elif key not in ranks:
            ranks[key] = (False, rank_fields)


def _store_exit(operator_id: int, r: dict[str, Any], node_ids: dict[str, int]) -> int | None:
    """One exit record; the exited process's job, if it has one."""
    ended = _dt(r["ts_us"])
    process, _ = Process.objects.get_or_create(
        operator_id=operator_id,
        node_id=node_ids[r["node"]],
        pid=r["pid"],
        defaults={"first_seen_at": ended, "last_seen_at": ended},
    )
    process.exit_code, process.exited_at = r["exit_code"], ended
    process.last_seen_at = max(process.last_seen_at, ended)
    process.save(update_fields=["exit_code", "exited_at", "last_seen_at"])
    return process.job_id


# Jobs whose scheduler reports their end itself (Slurm through its job records, Kubernetes
# through the pod): their ranks exiting is not the job's end (a Slurm job may run more steps).
SCHEDULERS_THAT_REPORT_ENDS = frozenset({"slurm", "kubernetes"})


def _end_job_when_every_rank_exited(job_pk: int) -> None:
    """A job no scheduler describes (torchrun workers, a plain process) ends when every one
    of its ranks' processes has exited: completed if all exited 0, else failed with the first
    non-zero code. Its world size, if no job record gave one, is what the ranks' processes
    said. Nothing changes while a rank is still running or has not been seen yet."""
    job = Job.objects.select_for_update(no_key=True).get(pk=job_pk)
    if job.state in TERMINAL_JOB_STATES or job.scheduler in SCHEDULERS_THAT_REPORT_ENDS:
        return
    ranks = list(JobRank.objects.filter(job_id=job_pk).values_list("rank", "node_id", "pid"))
    procs = {
        (p.node_id, p.pid): p
        for p in Process.objects.filter(job_id=job_pk, rank__isnull=False).only(
            "node_id", "pid", "world_size", "exit_code", "exited_at"
        )
    }
    world = job.world_size or max((p.world_size or 0 for p in procs.values()), default=0)
    if not world or len({rank for rank, _n, _p in ranks}) < world:
        return
    exits = []
    for _rank, node_id, pid in ranks:
        # A rank whose pid was never reported has no process to have exited.
        proc = procs.get((node_id, pid)) if pid is not None else None
        if proc is None or proc.exited_at is None:
            return
        exits.append(proc)
    codes = [p.exit_code for p in exits if p.exit_code is not None]
    failed = next((c for c in codes if c != 0), None)
    previous = job.state
    job.world_size = world
    job.state = JobState.FAILED if failed is not None else JobState.COMPLETED
    job.exit_code = failed if failed is not None else (0 if codes else None)
    job.ended_at = max(p.exited_at for p in exits if p.exited_at is not None)
    job.last_seen_at = max(job.last_seen_at, job.ended_at)
    job.save(update_fields=["world_size", "state", "exit_code", "ended_at", "last_seen_at"])
    _announce_state(job, previous)


def _announce_state(job: Job, previous: str) -> None:
    signals.job_state_changed.send(
        sender=Job,
        operator_id=job.operator_id,
        job_pk=job.pk,
        job_id=job.job_id,
        customer_id=job.customer_id,
        state=job.state,
        previous=previous,
    )


# --- rollups and retention -------------------------------------------------------------------


def build_rollups(operator_id: int, hour_start_ms: int) -> int:
    """(Re)compute the hourly rollup of every series of the operator for one hour; returns the
    number of rollup rows written. Idempotent: late data is picked up by running it again."""
    hour_start_ms -= hour_start_ms % HOUR_MS
    hour_end_ms = hour_start_ms + HOUR_MS
    written = 0
    with tenant_context(operator_id):
        with connection.cursor() as cursor:
            cursor.execute(
                # S608: BLOCK_TABLE is a constant of ingest.storage, never input.
                f"SELECT DISTINCT node_id FROM {BLOCK_TABLE} WHERE operator_id = %s "  # noqa: S608
                "AND start_ms >= %s AND start_ms < %s AND end_ms >= %s",
                [operator_id, hour_start_ms - MAX_BLOCK_SPAN_MS, hour_end_ms, hour_start_ms],
            )
            node_list = [row[0] for row in cursor.fetchall()]
        for node_id in node_list:
            written += _rollup_node(operator_id, node_id, hour_start_ms, hour_end_ms)
    return written


def _rollup_node(operator_id: int, node_id: int, lo: int, hi: int) -> int:
    decoded = [blocks.decode(p) for p in read_block_payloads(operator_id, [node_id], lo, hi - 1)]
    if not decoded:
        return 0
    sid = np.concatenate([d.sample_series() for d in decoded])
    ts = np.concatenate([d.ts_ms for d in decoded])
    values = np.concatenate([d.values for d in decoded])
    keep = (ts >= lo) & (ts < hi)
    sid, ts, values = sid[keep], ts[keep], values[keep]
    if not len(sid):
        return 0
    order = np.lexsort((ts, sid))
    sid, values = sid[order], values[order]
    uniq, starts, counts = np.unique(sid, return_index=True, return_counts=True)
    mins = np.minimum.reduceat(values, starts)
    maxs = np.maximum.reduceat(values, starts)
    sums = np.add.reduceat(values, starts)
    firsts = values[starts]
    lasts = values[starts + counts - 1]
    SeriesRollup.objects.filter(series_id__in=uniq.tolist(), bucket_start_ms=lo).delete()
    SeriesRollup.objects.bulk_create(
        [
            SeriesRollup(
                operator_id=operator_id,
                series_id=int(s),
                bucket_start_ms=lo,
                count=int(c),
                min=float(a),
                max=float(b),
                sum=float(t),
                first=float(f),
                last=float(la),
            )
            for s, c, a, b, t, f, la in zip(
                uniq, counts, mins, maxs, sums, firsts, lasts, strict=True
            )
        ],
        batch_size=5000,
    )
    return len(uniq)


def rollup_recent_hours(hours: int = 3, now: datetime | None = None) -> int:
    """Roll up the last `hours` hours (the current one included) for every operator."""
    now = now or datetime.now(UTC)
    with system_context():
        operator_ids = list(Operator.objects.values_list("id", flat=True))
    current = int(now.timestamp() * 1000) // HOUR_MS * HOUR_MS
    total = 0
    for operator_id in operator_ids:
        for back in range(hours):
            total += build_rollups(operator_id, current - back * HOUR_MS)
    return total


def delete_expired_rows(retention_days: int, now: datetime | None = None) -> int:
    """Retention for the row tables (logs, events, rollups kept 10× longer, receipts)."""
    now = now or datetime.now(UTC)
    cutoff_us = int((now - timedelta(days=retention_days)).timestamp() * 1e6)
    rollup_cutoff_ms = int((now - timedelta(days=retention_days * 10)).timestamp() * 1000)
    with system_context():
        deleted = LogLine.objects.filter(ts_us__lt=cutoff_us).delete()[0]
        deleted += Event.objects.filter(ts_us__lt=cutoff_us).delete()[0]
        deleted += SeriesRollup.objects.filter(bucket_start_ms__lt=rollup_cutoff_ms).delete()[0]
        deleted += BatchReceipt.objects.filter(
            received_at__lt=now - timedelta(days=retention_days)
        ).delete()[0]
    return deleted
