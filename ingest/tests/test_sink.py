"""The agent's runtime Sink over the real server: records submitted → stored once, spool
emptied only by acks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import connection

from agent.spool import Spool
from agent.transport.sink import make_sink
from contract import signals
from ingest import selectors, services
from ingest.server import IngestServer
from tenants import services as tenant_services
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def records(start: float, seconds: int) -> list[dict[str, object]]:
    return [
        {
            "type": "sample",
            "ts": start + i,
            "name": signals.DCGM_FI_DEV_GPU_TEMP,
            "value": 40 + i,
            "node": "sink-node",
            "gpu": "GPU-s0",
            "gpu_index": 0,
        }
        for i in range(seconds)
    ]


def test_spooled_sink_delivers_and_empties_its_spool(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        # The in-memory SQLite test database (shared cache) answers concurrent writers with
        # "table is locked" instead of waiting; the embedded default's file database waits.
        pytest.skip("needs a database that serialises concurrent writers by waiting")
    services.clear_caches()
    tenant = make_tenant("sink")
    _, token = tenant_services.do_create_agent_token(tenant.operator.pk, name="sink")
    server = IngestServer("127.0.0.1", 0, writers=1)
    port = server.start()
    start = float(int(time.time()) - 120)
    try:
        sink = make_sink(
            server=f"127.0.0.1:{port}",
            token=token,
            spool_dir=str(tmp_path),
            meta={"node": "sink-node"},
        )
        for k in range(3):
            sink.submit(records(start + 20 * k, 20))
            sink.flush()
        sink.close()
    finally:
        server.stop(grace=1)
    (series,) = selectors.node_series(tenant.operator.pk, "sink-node", start, start + 60)
    assert len(series.values) == 60
    assert list(series.values[:3]) == [40.0, 41.0, 42.0]
    spool = Spool(tmp_path / "batches")
    assert spool.pending_batches == 0 and spool.acked_through == 3
    spool.close()
