"""The agent's durable transport, the agent a real `proof-agent run` process, against the real
ingest server on loopback: an ingest outage (batches pile up in the on-disk spool; the agent
reconnects; everything is delivered exactly once when ingest returns), an agent killed with a
non-empty spool (resent by the next agent on that spool), the spool's size cap (oldest
dropped, the drop logged and stored by the server as a `spool_dropped` event), an agent that
starts during an outage, the node backend from a config file, and `proof-agent doctor` proving
the token. The backoff's waits and the sender's counters, which only the agent sees, are
tested in agent/tests/test_transport.py."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from contract import signals
from contract.trace import validate_trace
from ingest.models import Event, Node
from tenants.context import tenant_context
from tests.agentproc import AgentProcess, node_config, read_spool, run_agent, wait_for
from tests.helpers import Ingest, agent_token, receipts, stored

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def sim_args(
    address: str, token: str, tmp: Path, *, duration: float, speed: str = "1", out: str = "sent"
) -> list[str]:
    """`proof-agent run` of one simulated 1-GPU node, shipping to `address`, spooled under
    tmp/spool, with a trace of what it collected in tmp/<out>.jsonl."""
    argv = ["run", "--backend", "sim", "--scenario", "healthy_training", "--seed", "5"]
    argv += ["--nodes", "1", "--gpus-per-node", "1", "--duration", str(duration)]
    argv += ["--speed", speed, "--server", address, "--token", token]
    return [*argv, "--spool-dir", str(tmp / "spool"), "--out", str(tmp / f"{out}.jsonl")]


def test_outage_spools_reconnects_and_delivers_exactly_once(ingest: Ingest, tmp_path: Path) -> None:
    operator, token = agent_token("durable-outage")
    agent = AgentProcess(sim_args(ingest.address, token, tmp_path, duration=8), tmp_path / "logs")
    try:
        wait_for(lambda: stored(operator)[1] >= 1, what="the first batch stored")
        ingest.stop()
        before = stored(operator)
        time.sleep(3)  # 3 intervals with ingest down
        down = read_spool(tmp_path / "spool")
        assert down.pending_batches >= 2  # on disk, not acked
        assert stored(operator) == before
        ingest.start()
        assert agent.wait(timeout=60) == 0, agent.stderr
    finally:
        agent.kill()
    assert "ingest stream broke" in agent.stderr and "reconnecting" in agent.stderr
    report = validate_trace(tmp_path / "sent.jsonl")
    spool = read_spool(tmp_path / "spool")
    assert spool.pending_batches == 0 and spool.acked_through == spool.batches >= 8
    total = (report.counts["sample"], spool.batches)
    wait_for(lambda: stored(operator) == total)
    time.sleep(0.5)
    assert stored(operator) == total  # exactly once: no batch stored twice


def test_an_agent_killed_with_a_non_empty_spool_is_resent_by_the_next(
    ingest: Ingest, tmp_path: Path
) -> None:
    operator, token = agent_token("durable-restart")
    spool_dir = tmp_path / "spool"
    first = AgentProcess(sim_args(ingest.address, token, tmp_path, duration=60), tmp_path / "l1")
    try:
        wait_for(lambda: stored(operator)[1] >= 1, what="the first batch stored")
        ingest.stop()
        wait_for(lambda: read_spool(spool_dir).pending_batches >= 3, what="3 batches spooled")
    finally:
        first.kill()  # kill -9: the agent stops with batches unacked, no clean shutdown
    left = read_spool(spool_dir)
    assert left.pending_batches >= 3
    agent_id = (spool_dir / "agent_id").read_text().strip()
    ingest.start()
    second = run_agent(sim_args(ingest.address, token, tmp_path, duration=5, speed="max"))
    assert second.returncode == 0, second.stderr
    assert (spool_dir / "agent_id").read_text().strip() == agent_id  # resends deduplicated
    after = read_spool(spool_dir)
    assert after.pending_batches == 0 and after.batches > left.batches
    # Every batch either agent spooled was stored, each once, under the one agent id.
    wait_for(lambda: len(receipts(operator)) == after.batches)
    assert receipts(operator) == [(agent_id, seq) for seq in range(1, after.batches + 1)]
    second_trace = validate_trace(tmp_path / "sent.jsonl")
    assert stored(operator)[0] > second_trace.counts["sample"]


def test_spool_cap_drops_oldest_logs_and_reports(ingest: Ingest, tmp_path: Path) -> None:
    operator, token = agent_token("durable-cap")
    config = node_config(tmp_path, ingest.address, token, spool={"max_mib": 1})
    job_log = tmp_path / "logs" / "job.log"
    job_log.write_bytes(b"")  # there at start: followed from its end, as `tail -F`
    ingest.stop()
    agent = AgentProcess(["run", "--config", str(config), "--interval", "0.1"], tmp_path / "out")
    try:
        wait_for(lambda: read_spool(tmp_path / "spool").batches >= 1, what="the agent runs")
        # ~1.5 MB of job output while ingest is down, into a 1 MiB spool, in pieces that keep
        # each interval's batch under the spool's 64 KiB segments.
        chunk = b"".join(b"line %06d %s\n" % (i, b"z" * 100) for i in range(180))
        with open(job_log, "ab") as fh:
            for _ in range(75):
                fh.write(chunk)
                fh.flush()
                time.sleep(0.05)
        wait_for(lambda: "spool full" in agent.stderr, what="the drop logged")
        time.sleep(0.5)
        ingest.start()
        wait_for(lambda: read_spool(tmp_path / "spool").pending_batches == 0, timeout=60)
        with tenant_context(operator):
            events = Event.objects.for_tenant(operator).filter(name=signals.EVENT_SPOOL_DROPPED)
            wait_for(lambda: events.exists(), what="the spool_dropped event stored")
        agent.stop(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0, agent.stderr
    finally:
        agent.kill()
    said = [line for line in agent.stderr.splitlines() if "spool full" in line]
    assert said and "spool full (cap 1048576 bytes): dropped" in said[0]
    spool = read_spool(tmp_path / "spool")
    dropped = spool.dropped_batches
    assert dropped > 0 and spool.pending_batches == 0
    with tenant_context(operator):
        dropped_events = list(
            Event.objects.for_tenant(operator).filter(name=signals.EVENT_SPOOL_DROPPED)
        )
    assert all(e.value is not None for e in dropped_events)
    assert sum(int(e.value or 0) for e in dropped_events) <= dropped
    assert max(int(e.labels["dropped_total"]) for e in dropped_events) == dropped
    # Everything still on disk arrived, plus what the transport already held in memory when
    # the spool dropped it from disk — the sender's window (8) and the one batch its pump
    # waits to hand over; nothing twice.
    got = len(receipts(operator))
    assert spool.batches - dropped <= got <= spool.batches - dropped + 8 + 1


def test_agent_starting_during_an_outage_spools_then_delivers(
    ingest: Ingest, tmp_path: Path
) -> None:
    operator, token = agent_token("durable-cold")
    ingest.stop()
    agent = AgentProcess(sim_args(ingest.address, token, tmp_path, duration=4), tmp_path / "logs")
    try:
        wait_for(lambda: read_spool(tmp_path / "spool").pending_batches >= 2, what="spooling")
        assert stored(operator) == (0, 0)
        ingest.start()
        assert agent.wait(timeout=90) == 0, agent.stderr
    finally:
        agent.kill()
    assert "unreachable at start; spooling until it answers" in agent.stderr
    report = validate_trace(tmp_path / "sent.jsonl")
    spool = read_spool(tmp_path / "spool")
    assert spool.pending_batches == 0
    wait_for(lambda: stored(operator) == (report.counts["sample"], spool.batches), timeout=60)


class _Fixtures(http.server.BaseHTTPRequestHandler):
    routes: dict[str, bytes] = {}

    def do_GET(self) -> None:
        body = self.routes.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: Any) -> None:
        pass


def test_node_backend_run_from_config_into_ingest(ingest: Ingest, tmp_path: Path) -> None:
    """`proof-agent run --config FILE` (the node backend: this machine's /proc, a
    dcgm-exporter and a vLLM server serving the fixtures) with the config's [server]
    (plaintext to loopback, token_file) and [spool]: registered, and what it collected stored."""
    operator, token = agent_token("node-backend-run")
    data = REPO / "agent" / "tests" / "data"
    _Fixtures.routes = {
        "/dcgm": (data / "dcgm" / "dcgm_exporter_metrics_L40S_upcloud.prom").read_bytes(),
        "/vllm": (data / "vllm" / "vllm_metrics_datadog_fixture.prom").read_bytes(),
    }
    http_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fixtures)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{http_server.server_address[1]}"
    try:
        config = node_config(
            tmp_path,
            ingest.address,
            token,
            agent={"node": "config-node", "interval_s": 1.0},
            dcgm={"mode": "exporter", "exporter_url": f"{base}/dcgm"},
            inference={"endpoints": [f"{base}/vllm"]},
        )
        trace = tmp_path / "sent.jsonl"
        done = run_agent(["run", "--config", str(config), "--duration", "3", "--out", str(trace)])
    finally:
        http_server.shutdown()
    assert done.returncode == 0, done.stderr
    report = validate_trace(trace)
    assert report.ok and report.counts["sample"] > 100
    wait_for(lambda: stored(operator)[0] == report.counts["sample"])
    assert read_spool(tmp_path / "spool").pending_batches == 0
    with tenant_context(operator):
        assert Node.objects.for_tenant(operator).filter(hostname="config-node").exists()


def test_doctor_proves_the_token_against_ingest(ingest: Ingest, tmp_path: Path) -> None:
    _operator, token = agent_token("doctor-token")
    for value, status, words in (
        (token, "OK", "token accepted"),
        ("wrong", "unavailable", "token refused"),
    ):
        config = node_config(tmp_path, ingest.address, value)
        done = run_agent(["doctor", "--config", str(config), "--json"])
        assert done.returncode == 0, done.stderr
        checks = {c["source"]: c for c in json.loads(done.stdout)["checks"]}
        check = checks["ingest server"]
        assert check["status"] == status and words in check["detail"], check
