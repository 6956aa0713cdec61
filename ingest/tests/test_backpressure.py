"""Backpressure: when storage stalls, the server stops reading and the agent's sends block
(acks are delayed), nothing is acked before it is committed, and everything arrives once
storage resumes."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from contract.wire.client import BatchSender, open_channel
from ingest import services
from ingest.models import BatchReceipt
from ingest.server import IngestServer
from ingest.tests.helpers import gpu_batch
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_stalled_storage_delays_acks_and_blocks_the_sender() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("stalls storage with a PostgreSQL table lock")
    services.clear_caches()
    tenant = make_tenant("bp")
    _, token = tenant_services.do_create_agent_token(tenant.operator.pk, name="bp")
    server = IngestServer("127.0.0.1", 0, writers=1, queue_depth=1)
    port = server.start()
    sender = BatchSender(open_channel(f"127.0.0.1:{port}"), token, window=3)
    start = float(int(time.time()) - 600)
    batches = [gpu_batch(agent_id="bp", sequence=i, start=start + 10 * i) for i in range(1, 11)]
    sent: list[int] = []

    def produce() -> None:
        for batch in batches:
            sender.send(batch, timeout=120)
            sent.append(batch.sequence)

    producer = threading.Thread(target=produce)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # Storage stalls: the writer's receipt INSERT waits on this lock.
            cursor.execute(f"LOCK TABLE {BatchReceipt._meta.db_table} IN EXCLUSIVE MODE")
            producer.start()
            time.sleep(3)
            assert sender.stats.acked == 0  # nothing acked while nothing could commit
            assert sender.unacked() == 3  # the window is full ...
            assert len(sent) == 3  # ... so the agent's send blocks: no unbounded buffering
        producer.join(timeout=120)
        assert sender.flush(timeout=120)
    finally:
        sender.close(timeout=5)
        server.stop(grace=1)
    assert sent == list(range(1, 11))
    assert sender.stats.acked == 10 and sender.stats.duplicates == 0
    with tenant_context(tenant.operator.pk):
        stored = BatchReceipt.objects.for_tenant(tenant.operator.pk).filter(agent_id="bp")
        assert sorted(stored.values_list("sequence", flat=True)) == list(range(1, 11))
