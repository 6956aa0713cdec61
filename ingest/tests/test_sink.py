"""The agent's runtime sink over the real server, as a `proof-agent run` process: what the
agent collected is stored once, and its on-disk spool is emptied only by acks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection

from contract import signals
from contract.trace.reader import TraceReader
from ingest import selectors, services
from ingest.server import IngestServer
from tenants import services as tenant_services
from tenants.testing import make_tenant
from tests.agentproc import read_spool, run_agent

pytestmark = pytest.mark.django_db(transaction=True)


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
    trace, spool_dir = tmp_path / "sent.jsonl", tmp_path / "spool"
    try:
        # One simulated GPU for 60 s, collected every 20 s: one batch per interval.
        argv = ["run", "--backend", "sim", "--scenario", "healthy_training", "--seed", "3"]
        argv += ["--nodes", "1", "--gpus-per-node", "1", "--duration", "60", "--speed", "max"]
        argv += ["--interval", "20", "--server", f"127.0.0.1:{port}", "--token", token]
        argv += ["--spool-dir", str(spool_dir), "--out", str(trace)]
        done = run_agent(argv)
    finally:
        server.stop(grace=1)
    assert done.returncode == 0, done.stderr
    stopped = re.search(r"agent stopped after (\d+) intervals", done.stdout)
    assert stopped is not None, done.stdout
    intervals = int(stopped[1])
    reader = TraceReader(trace)
    sent = [
        r for r in reader if r["type"] == "sample" and r["name"] == signals.DCGM_FI_DEV_GPU_TEMP
    ]
    assert reader.meta is not None
    (node,) = reader.meta["nodes"]
    assert len(sent) == 60
    start, end = sent[0]["ts"], sent[-1]["ts"]
    got = selectors.node_series(
        tenant.operator.pk, node, start, end, names=[signals.DCGM_FI_DEV_GPU_TEMP]
    )
    # Every value the agent sent, stored once, under the identity it was sent with (the
    # identity join keys the GPU to its job's rank once it has seen the process).
    stored = sorted(
        (round(float(t), 3), float(v), s.info.job, s.info.pid)
        for s in got
        for t, v in zip(s.ts, s.values, strict=True)
    )
    assert stored == sorted(
        (round(r["ts"], 3), float(r["value"]), r.get("job", ""), r.get("pid")) for r in sent
    )
    spool = read_spool(spool_dir)
    assert spool.batches == intervals >= 3  # one batch per interval
    assert spool.pending_batches == 0 and spool.acked_through == intervals
