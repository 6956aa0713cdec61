"""Issue 16: two writer threads deadlocked on `ingest_jobrank` storing one job's batches. The
rows a batch's processes touch are locked in one global order — the job rows it may end with
the jobs it describes (pk order), then every process row, process and exit records together
((node, pid) order), then the ranks ((job, rank) order) — so batches whose pids map to ranks
in different orders (a rank restarted with a new pid, an elastic restart) never hold one lock
each and wait for the other. store_batch() is called directly: no retry hides a deadlock.
PostgreSQL only: SQLite takes one writer at a time."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from django.db import connection

from contract.wire.encode import BatchBuilder
from ingest import services
from ingest.models import BatchReceipt, Job, JobRank, Process
from ingest.processing import Limits, decode_batch
from ingest.tests.test_concurrency import _store_all
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 2
BATCHES_PER_THREAD = 25
RANKS = 8
JOB = "job-ranks"
NODE = "node-ranks"


def _batch(agent: str, sequence: int, rng: random.Random, t0: float) -> Any:
    """Every rank's process under a fresh pid of its own (pids in an order unrelated to the
    ranks'), some of them exiting; every other batch describes the job too."""
    builder = BatchBuilder(agent)
    ts = t0 + sequence
    pids = rng.sample(range(10_000, 90_000), RANKS)
    if sequence % 2 == 0:
        builder.add({"type": "job", "ts": ts, "job": JOB, "state": "running"})
    for rank, pid in enumerate(pids):
        builder.add(
            {
                "type": "process",
                "ts": ts,
                "node": NODE,
                "pid": pid,
                "job": JOB,
                "rank": rank,
                "local_rank": rank,
                "world_size": RANKS * 4,  # never all exited: the job stays running
                "gpu": f"GPU-{rank}",
            }
        )
    for pid in rng.sample(pids, 3):
        builder.add({"type": "exit", "ts": ts + 0.5, "node": NODE, "pid": pid, "exit_code": 0})
    return builder.build(sequence)


def test_batches_of_one_job_with_ranks_in_different_pid_orders_never_deadlock() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    op = make_tenant("rankdl").operator.pk
    rng = random.Random(16)  # noqa: S311 (a test's shuffle)
    t0 = time.time() - 3600
    work = [
        [
            decode_batch(_batch(f"agent-{k}", s + 1, rng, t0 + k), Limits())
            for s in range(BATCHES_PER_THREAD)
        ]
        for k in range(THREADS)
    ]
    for batches in work:
        for batch in batches:
            assert not batch.rejected_records, batch.rejections
    services.clear_caches()
    errors = _store_all(op, work)
    assert [str(e).splitlines()[0] for e in errors] == []
    with tenant_context(op):
        assert BatchReceipt.objects.filter(operator_id=op).count() == THREADS * BATCHES_PER_THREAD
        job = Job.objects.get(operator_id=op, job_id=JOB)
        assert JobRank.objects.filter(job=job).count() == RANKS
        assert (
            Process.objects.filter(operator_id=op).count() == THREADS * BATCHES_PER_THREAD * RANKS
        )
        assert Process.objects.filter(operator_id=op, exited_at__isnull=False).count() == (
            THREADS * BATCHES_PER_THREAD * 3
        )
