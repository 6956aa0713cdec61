"""Concurrent batches that share nodes and jobs, stored by several threads at once (ingest's
writer threads and other ingest processes do exactly this): none may deadlock, and each is
stored exactly once. PostgreSQL only: SQLite takes one writer at a time."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np
import pytest
from django.db import OperationalError, connection, connections

from contract import signals
from contract.wire.encode import BatchBuilder
from ingest import server, services
from ingest.models import BatchReceipt, Job, JobRank
from ingest.processing import DecodedBatch, Limits, decode_batch
from ingest.storage import BLOCK_TABLE
from ingest.tests.helpers import gpu_batch
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 4
BATCHES_PER_THREAD = 8
NODES = [f"node-{i}" for i in range(6)]
JOBS = [f"job-{i}" for i in range(6)]
SECONDS = 5


def _shuffled_batch(agent: str, sequence: int, rng: random.Random, t0: float) -> Any:
    """Samples of every job on every node, job records of every job and a process per job
    and node (its rank), each in an order of its own: the rows that two such batches lock,
    they would lock in different orders if ingest followed the batch's order."""
    builder = BatchBuilder(agent)
    ts = t0 + sequence * SECONDS + np.arange(SECONDS, dtype=np.float64)
    pairs = [(n, j) for n in range(len(NODES)) for j in range(len(JOBS))]
    rng.shuffle(pairs)
    for n, j in pairs:
        identity = {
            signals.NODE: NODES[n],
            signals.GPU: f"GPU-{n}-{j}",
            signals.GPU_INDEX: j,
            signals.JOB: JOBS[j],
            signals.RANK: n * len(JOBS) + j,
        }
        builder.add_samples(signals.DCGM_FI_DEV_GPU_UTIL, identity, ts, np.full(SECONDS, 1.0))
    # Samples no job claims, per node (the node's running jobs' activity is widened too).
    for n in rng.sample(range(len(NODES)), len(NODES)):
        identity = {signals.NODE: NODES[n], signals.GPU: f"GPU-{n}-x", signals.GPU_INDEX: 99}
        builder.add_samples(signals.DCGM_FI_DEV_POWER_USAGE, identity, ts, np.full(SECONDS, 2.0))
    for j in rng.sample(range(len(JOBS)), len(JOBS)):
        builder.add(
            {"type": "job", "ts": ts[-1], "job": JOBS[j], "state": "running", "world_size": 36}
        )
    for n, j in pairs:
        builder.add(
            {
                "type": "process",
                "ts": ts[0],
                "node": NODES[n],
                "pid": 1000 + j,
                "job": JOBS[j],
                "rank": n * len(JOBS) + j,
                "local_rank": j,
                "gpu": f"GPU-{n}-{j}",
            }
        )
    return builder.build(sequence)


def _store_all(op: int, work: list[list[DecodedBatch]]) -> list[BaseException]:
    barrier = threading.Barrier(len(work))
    errors: list[BaseException] = []

    def run(batches: list[DecodedBatch]) -> None:
        barrier.wait()
        try:
            for batch in batches:
                try:
                    services.store_batch(op, batch)
                except Exception as exc:  # counted, and the thread goes on with the next batch
                    errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(batches,)) for batches in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_batches_sharing_nodes_and_jobs_never_deadlock() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    op = make_tenant("deadlock").operator.pk
    rng = random.Random(7)  # noqa: S311 (a test's shuffle)
    t0 = time.time() - 3600
    work = [
        [
            decode_batch(_shuffled_batch(f"agent-{k}", s + 1, rng, t0 + k), Limits())
            for s in range(BATCHES_PER_THREAD)
        ]
        for k in range(THREADS)
    ]
    services.clear_caches()  # every thread creates the nodes, jobs and series afresh
    errors = _store_all(op, work)
    # Before the rows were locked in key order, 20-26 of these 32 batches failed with
    # "deadlock detected" (at the batch's job rows, locked in its job records' order).
    assert [str(e).splitlines()[0] for e in errors] == []
    with tenant_context(op):
        assert BatchReceipt.objects.filter(operator_id=op).count() == THREADS * BATCHES_PER_THREAD
        assert Job.objects.filter(operator_id=op).count() == len(JOBS)
        assert JobRank.objects.filter(operator_id=op).count() == len(JOBS) * len(NODES)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT sum(sample_count) FROM {BLOCK_TABLE} WHERE operator_id = %s", [op]
            )
            stored = cursor.fetchone()[0]
    per_batch = (len(NODES) * len(JOBS) + len(NODES)) * SECONDS
    assert stored == THREADS * BATCHES_PER_THREAD * per_batch


class _Deadlock(Exception):
    sqlstate = "40P01"


def _aborted() -> OperationalError:
    exc = OperationalError("deadlock detected")
    exc.__cause__ = _Deadlock()
    return exc


def test_the_writer_stores_again_a_batch_aborted_by_a_deadlock(monkeypatch: Any) -> None:
    calls: list[int] = []
    stored = services.StoreOutcome(services.StoreStatus.STORED, 1)

    def flaky(operator_id: int, batch: Any) -> services.StoreOutcome:
        calls.append(operator_id)
        if len(calls) < server.STORE_ATTEMPTS:
            raise _aborted()
        return stored

    monkeypatch.setattr(services, "store_batch", flaky)
    monkeypatch.setattr(server, "STORE_RETRY_WAIT_S", 0.0)
    item = server.WriteItem(1, decode_batch(gpu_batch(), Limits()), 0.0, lambda o, e: None)
    assert server.StorageWriter._store(item) is stored
    assert len(calls) == server.STORE_ATTEMPTS


def test_the_writer_gives_up_after_its_attempts_and_at_once_on_other_errors(
    monkeypatch: Any,
) -> None:
    calls: list[BaseException] = []

    def failing(exc: BaseException) -> Any:
        def store(operator_id: int, batch: Any) -> services.StoreOutcome:
            calls.append(exc)
            raise exc

        return store

    monkeypatch.setattr(server, "STORE_RETRY_WAIT_S", 0.0)
    item = server.WriteItem(1, decode_batch(gpu_batch(), Limits()), 0.0, lambda o, e: None)
    monkeypatch.setattr(services, "store_batch", failing(_aborted()))
    with pytest.raises(OperationalError, match="deadlock"):
        server.StorageWriter._store(item)
    assert len(calls) == server.STORE_ATTEMPTS  # bounded: then not acked, the agent resends
    calls.clear()
    monkeypatch.setattr(services, "store_batch", failing(OperationalError("server closed")))
    with pytest.raises(OperationalError, match="server closed"):
        server.StorageWriter._store(item)
    assert len(calls) == 1
