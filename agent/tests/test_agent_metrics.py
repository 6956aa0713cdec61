"""The agent's own /metrics, scraped over HTTP from a running loop with the real gRPC sink and
spool against the in-test ingest server (a real gRPC peer), through an outage and back."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.collectors.nvml import NvmlCollector
from agent.collectors.nvml_sim import SimulatedNvml
from agent.runtime import Agent
from agent.runtime.metrics import parse_address, serve_metrics
from agent.tests.fake_ingest import FakeIngest
from agent.tests.test_transport import sink_for, wait_for

NODE = "metrics-node"


@pytest.fixture
def ingest() -> Iterator[FakeIngest]:
    srv = FakeIngest()
    yield srv
    srv.stop()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class Broken:
    name = "broken"

    def collect(self, now: float) -> list[dict[str, Any]]:
        raise RuntimeError("source gone")


def test_metrics_follow_collection_spool_and_acks(ingest: FakeIngest, tmp_path: Path) -> None:
    sink = sink_for(ingest.address, tmp_path / "spool")
    agent = Agent([NvmlCollector(SimulatedNvml.with_gpus(2), node=NODE), Broken()], sink, node=NODE)
    server = serve_metrics("127.0.0.1:0", agent, sink)
    port = server.server_port
    try:
        for _ in range(3):
            agent.tick()
        sink.flush()
        wait_for(lambda: sink._acked_through >= 1 and not sink.spool.pending_batches)
        m = scrape(port)
        assert m[("proof_agent_ticks_total", ())] == 3
        assert m[("proof_agent_records_total", ())] == agent.stats.records > 0
        nvml_records = m[("proof_agent_collector_records_total", (("collector", "nvml"),))]
        assert nvml_records == agent.stats.collector_records["nvml"] > 0
        assert m[("proof_agent_collector_cpu_seconds_total", (("collector", "nvml"),))] > 0
        assert m[("proof_agent_collector_errors_total", (("collector", "broken"),))] == 3
        assert m[("proof_agent_spool_batches", ())] == 0
        assert m[("proof_agent_unacked_batches", ())] == 0
        assert m[("proof_agent_ack_lag_seconds", ())] == 0
        assert m[("proof_agent_batches_acked_total", ())] >= 1
        assert m[("proof_agent_process_resident_bytes", ())] > 10 << 20

        # Ingest goes away: batches wait in the spool, the lag grows.
        ingest.stop()
        for _ in range(3):
            agent.tick()
        sink.flush()
        wait_for(lambda: sink._last_sent > sink._acked_through)
        first = scrape(port)
        time.sleep(0.3)
        down = scrape(port)
        assert down[("proof_agent_spool_batches", ())] >= 1
        assert down[("proof_agent_spool_bytes", ())] > 0
        assert down[("proof_agent_unacked_batches", ())] >= 1
        lag = down[("proof_agent_ack_lag_seconds", ())]
        assert lag >= first[("proof_agent_ack_lag_seconds", ())] + 0.2

        # Back: everything acked, the lag is 0 again.
        ingest.start()
        wait_for(lambda: not sink.spool.pending_batches and sink._acked_through >= sink._last_sent)
        up = scrape(port)
        assert up[("proof_agent_spool_batches", ())] == 0
        assert up[("proof_agent_ack_lag_seconds", ())] == 0
        assert up[("proof_agent_batches_acked_total", ())] == sink._last_sent
    finally:
        server.shutdown()
        sink.close(timeout=5)


@pytest.mark.parametrize("bad", ["9464", "host:", "host:99999", "host:port"])
def test_a_bad_metrics_address_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match="metrics_address must be host:port"):
        parse_address(bad)


def test_metrics_address_forms() -> None:
    assert parse_address(":9464") == ("0.0.0.0", 9464)  # noqa: S104 - what ":port" means
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:9464") == ("::1", 9464)
