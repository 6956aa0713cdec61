"""End to end: `proof-agent run --backend sim --server … --token …`, a real agent process,
streams a simulated node through the agent runtime, the gRPC transport with its on-disk spool,
and the real ingest server on loopback, into storage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contract.trace import validate_trace
from tenants import services as tenant_services
from tenants.testing import make_tenant
from tests.agentproc import dead_letter, read_spool, run_agent
from tests.helpers import Ingest, stored_samples

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_streams_a_simulated_node_into_ingest(ingest: Ingest, tmp_path: Path) -> None:
    tenant = make_tenant("agent-run-e2e")
    token = tenant_services.do_create_agent_token(tenant.operator.pk, name="agent")[1]
    trace = tmp_path / "sent.jsonl"
    spool_dir = tmp_path / "spool"
    argv = ["run", "--backend", "sim", "--scenario", "healthy_training", "--seed", "2"]
    argv += ["--nodes", "1", "--gpus-per-node", "2", "--duration", "20", "--speed", "max"]
    # No --start-ts: at --speed max the run is placed to end now, inside ingest's time window.
    argv += ["--server", ingest.address, "--token", token]
    argv += ["--spool-dir", str(spool_dir), "--out", str(trace)]
    done = run_agent(argv)
    assert done.returncode == 0, done.stderr
    stopped = re.search(r"agent stopped after (\d+) intervals", done.stdout)
    assert stopped is not None, done.stdout
    intervals = int(stopped[1])
    report = validate_trace(trace)
    assert report.ok and report.counts["sample"] > 100
    # Everything the agent collected (the same records went to the trace) was stored, and the
    # spool holds nothing unacknowledged.
    assert stored_samples(tenant.operator.pk) == report.counts["sample"]
    spool = read_spool(spool_dir)
    # One batch per interval that collected anything, each acked: nothing left, none refused.
    assert 20 <= spool.batches <= intervals and spool.acked_through == spool.batches
    assert spool.pending_batches == 0 and spool.dropped_batches == 0
    assert dead_letter(spool_dir) == []


def test_run_refuses_a_bad_token_clearly(ingest: Ingest) -> None:
    argv = ["run", "--scenario", "healthy_training", "--duration", "5", "--speed", "max"]
    argv += ["--server", ingest.address, "--token", "not-a-token"]
    done = run_agent(argv)
    assert done.returncode == 2
    err = done.stderr
    assert "cannot start the transport to 127.0.0.1:" in err and "agent token" in err


def test_run_says_when_ingest_rejects_what_it_sent(ingest: Ingest) -> None:
    tenant = make_tenant("agent-run-old")
    token = tenant_services.do_create_agent_token(tenant.operator.pk, name="agent")[1]
    argv = ["run", "--scenario", "healthy_training", "--nodes", "1", "--gpus-per-node", "1"]
    argv += ["--duration", "5", "--speed", "max", "--start-ts", "1600000000"]  # 2020: too old
    argv += ["--server", ingest.address, "--token", token]
    done = run_agent(argv)
    assert done.returncode == 1, done.stderr
    assert "proof-agent run: ingest rejected" in done.stderr
    assert stored_samples(tenant.operator.pk) == 0
