"""Ingest as the end-to-end tests run it and read it back: the real gRPC server on loopback
(stoppable, restartable on its port, with the limits a test gives it), an operator with an
agent token, what ingest stored for that operator (samples, batch receipts, log lines) and
ingest's own Prometheus counters (batches stored and duplicate, refusals, store errors).
The agent's side — the `proof-agent` process and its files — is tests/agentproc.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.db import connection
from prometheus_client import REGISTRY

from contract.wire.client import BatchSender, open_channel
from contract.wire.replay import ReplayReport, replay
from ingest import services
from ingest.models import BatchReceipt, LogLine
from ingest.processing import Limits
from ingest.server import IngestServer
from ingest.storage import BLOCK_TABLE
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant


class Ingest:
    """The real ingest server, stoppable and restartable on the same port."""

    def __init__(self, limits: Limits | None = None, *, writers: int = 2) -> None:
        self.writers = writers
        self.srv: IngestServer | None = None
        self.port = 0
        self.start(limits)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.stop(grace=1)
            self.srv = None

    def start(self, limits: Limits | None = None) -> None:
        services.clear_caches()
        self.srv = IngestServer(
            "127.0.0.1", self.port, writers=self.writers, queue_depth=8, limits=limits
        )
        self.srv.start()
        assert self.port in (0, self.srv.port)
        self.port = self.srv.port

    def replay(self, trace: Path, token: str, **kw: Any) -> ReplayReport:
        """`contract.wire.replay` of a trace file into this server, as an agent would send it."""
        sender = BatchSender(open_channel(self.address), token)
        try:
            return replay(str(trace), sender, **kw)
        finally:
            sender.close()


def agent_token(name: str) -> tuple[int, str]:
    """A new tenant's operator id and an agent token for it."""
    tenant = make_tenant(name)
    return tenant.operator.pk, tenant_services.do_create_agent_token(
        tenant.operator.pk, name="agent"
    )[1]


def stored_samples(operator_id: int) -> int:
    where = "" if connection.vendor == "postgresql" else f" WHERE operator_id = {operator_id:d}"
    with tenant_context(operator_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(sum(sample_count), 0) FROM {BLOCK_TABLE}{where}")
        return int(cursor.fetchone()[0])


def stored(operator_id: int) -> tuple[int, int]:
    """(samples stored, batch receipts) for the operator."""
    with tenant_context(operator_id):
        count = BatchReceipt.objects.for_tenant(operator_id).count()
    return stored_samples(operator_id), int(count)


def receipts(operator_id: int) -> list[tuple[str, int]]:
    """(agent id, sequence) of every batch ingest stored for the operator, in order."""
    with tenant_context(operator_id):
        rows = BatchReceipt.objects.for_tenant(operator_id)
        return sorted(rows.values_list("agent_id", "sequence"))


def stored_lines(operator_id: int) -> list[str]:
    """The operator's log lines as ingest stored them, in time order (then arrival)."""
    with tenant_context(operator_id):
        rows = LogLine.objects.for_tenant(operator_id).order_by("ts_us", "id")
        return list(rows.values_list("line", flat=True))


# ingest/metrics.py: what each count sums (a counter's samples over all of its labels).
_COUNTS = {
    "stored": ("proof_ingest_batches_total", {"status": "stored"}),
    "duplicate": ("proof_ingest_batches_total", {"status": "duplicate"}),
    "refused": ("proof_ingest_rejects_total", {}),
    "records_refused": ("proof_ingest_record_rejects_total", {}),
    "store_errors": ("proof_ingest_store_errors_total", {}),
}


def counter(name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of counter `name`'s samples whose labels include `labels`."""
    want = (labels or {}).items()
    return sum(
        sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == name and want <= sample.labels.items()
    )


def ingest_counts() -> dict[str, float]:
    """Ingest's batch counters now (they are this process's: the server runs in the test)."""
    return {key: counter(name, labels) for key, (name, labels) in _COUNTS.items()}


def counts_since(before: dict[str, float]) -> dict[str, int]:
    return {key: int(value - before[key]) for key, value in ingest_counts().items()}


# What the embedded default must not inherit from the test environment: it runs on its own
# SQLite database in PROOF_DATA_DIR, with no Redis (tasks in-process).
_SERVER_ENV = ("DATABASE_URL", "DATABASE_OWNER_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")


def embedded_default_env(data_dir: Path) -> dict[str, str]:
    """The environment a newcomer's `proof demo` runs in: no external services, its data in
    `data_dir`."""
    env = {k: v for k, v in os.environ.items() if k not in _SERVER_ENV}
    env.update(PROOF_DATA_DIR=str(data_dir), PROOF_ENV="development")
    return env
