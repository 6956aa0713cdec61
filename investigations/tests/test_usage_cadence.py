"""GPU-time accounting runs once `ACCOUNT_EVERY_S` of settled data has gathered, not at every
evaluation: the evaluations in between leave the usage rows and their mark alone, and the next
one that accounts counts every second they skipped, once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from contract.wire.encode import BatchBuilder
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from investigations import services
from investigations.models import JobActivity, JobGpuUsage
from investigations.tests.live_helpers import job_pk, register_gpus
from simulator import simulate
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


class Feed:
    """A simulated 4-GPU run stored one second-batch at a time, up to a chosen data time."""

    def __init__(self, operator_id: int, duration_s: float) -> None:
        self.operator_id = operator_id
        end = time.time()
        self.run = simulate(
            "healthy_training",
            seed=3,
            duration_s=duration_s,
            nodes=1,
            gpus_per_node=4,
            start_ts=end - duration_s,
        )
        register_gpus(operator_id, self.run.records())
        self.records: Iterator[dict[str, Any]] = iter(self.run.records())
        self.pending: dict[str, Any] | None = None
        self.builder = BatchBuilder("usage-cadence")
        self.sequence = 0
        self.job: str | None = None

    def until(self, seconds: float) -> None:
        """Store every record up to `seconds` after the run's start."""
        cut = self.run.start_ts + seconds
        batch_end = None
        while True:
            record = self.pending or next(self.records, None)
            self.pending = None
            if record is None or record["ts"] >= cut:
                self.pending = record
                break
            if batch_end is None:
                batch_end = record["ts"] + 1.0
            if record["ts"] >= batch_end:
                self._flush()
                batch_end = record["ts"] + 1.0
            self.job = self.job or record.get("job")
            self.builder.add(record)
        self._flush()

    def _flush(self) -> None:
        if len(self.builder):
            self.sequence += 1
            batch = decode_batch(self.builder.build(self.sequence), Limits())
            ingest_services.store_batch(self.operator_id, batch)


def _usage(op: int, pk: int) -> tuple[float | None, float]:
    with tenant_context(op):
        through = JobActivity.objects.for_tenant(op).get(job_id=pk).usage_through_ts
        seconds = sum(
            JobGpuUsage.objects.for_tenant(op)
            .filter(job_id=pk)
            .values_list("gpu_seconds", flat=True)
        )
    return through, seconds


def test_accounting_waits_for_settled_data_and_skips_no_second() -> None:
    op = make_tenant("usage-cadence").operator.pk
    feed = Feed(op, 300.0)
    feed.until(120)
    assert feed.job is not None
    pk = job_pk(op, feed.job)
    services.evaluate_job(op, pk)
    first_through, first_seconds = _usage(op, pk)
    assert first_through is not None and first_seconds > 0

    # 10 s more: evaluated, but less than ACCOUNT_EVERY_S has settled since — nothing moves.
    feed.until(130)
    assert services.evaluate_job(op, pk).status == "evaluated"
    assert _usage(op, pk) == (first_through, first_seconds)

    # 35 s past the first: accounted now, the skipped seconds included (4 GPUs, 1 Hz).
    feed.until(120 + services.ACCOUNT_EVERY_S + 5)
    services.evaluate_job(op, pk)
    through, seconds = _usage(op, pk)
    assert through is not None and through - first_through >= services.ACCOUNT_EVERY_S
    assert seconds - first_seconds == pytest.approx(4 * (through - first_through), abs=8)
