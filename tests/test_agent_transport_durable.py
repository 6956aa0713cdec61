"""The agent's durable transport against the real ingest server on loopback: an ingest outage
(batches pile up in the on-disk spool; reconnects back off exponentially, jittered and capped;
everything is delivered exactly once when ingest returns), an agent restart with a non-empty
spool (resent after the restart), and the spool's size cap (oldest dropped, the drop counted,
logged and stored by the server as a `spool_dropped` event)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from agent.spool import Spool
from agent.transport.sink import GrpcSink, make_sink
from contract import signals
from contract.wire.client import BatchSender, open_channel
from ingest import services
from ingest.models import BatchReceipt, Event
from ingest.server import IngestServer
from ingest.storage import BLOCK_TABLE
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Ingest:
    """The real ingest server, stoppable and restartable on the same port."""

    def __init__(self) -> None:
        services.clear_caches()
        self.srv: IngestServer | None = IngestServer("127.0.0.1", 0, writers=2, queue_depth=8)
        self.srv.start()
        self.port = self.srv.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.srv is not None:
            self.srv.stop(grace=1)
            self.srv = None

    def start(self) -> None:
        services.clear_caches()
        self.srv = IngestServer("127.0.0.1", self.port, writers=2, queue_depth=8)
        self.srv.start()
        assert self.srv.port == self.port


@pytest.fixture
def ingest() -> Iterator[Ingest]:
    srv = Ingest()
    yield srv
    srv.stop()


def samples(n: int, tag: int) -> list[dict[str, Any]]:
    now = time.time()
    return [
        {
            "type": "sample",
            "ts": now - 1 + i / (10 * n),
            "name": signals.DCGM_FI_DEV_GPU_UTIL,
            "value": float(tag),
            "node": "durable-1",
            "gpu": f"GPU-durable-{i % 4}",
        }
        for i in range(n)
    ]


def stored(operator_id: int) -> tuple[int, int]:
    """(samples stored, batch receipts) for the operator."""
    where = "" if connection.vendor == "postgresql" else f" WHERE operator_id = {operator_id:d}"
    with tenant_context(operator_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(sum(sample_count), 0) FROM {BLOCK_TABLE}{where}")
        total = int(cursor.fetchone()[0])
        receipts = BatchReceipt.objects.for_tenant(operator_id).count()  # type: ignore[attr-defined]
    return total, receipts


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def agent_token(name: str) -> tuple[int, str]:
    tenant = make_tenant(name)
    return tenant.operator.pk, tenant_services.do_create_agent_token(
        tenant.operator.pk, name="agent"
    )[1]


def sink_for(address: str, token: str, spool_dir: Path, **spool_kw: Any) -> GrpcSink:
    """What make_sink builds, with a short backoff (base 0.1 s, cap 0.8 s) for the test."""
    sender = BatchSender(open_channel(address), token, retry_delay=0.1, max_retry_delay=0.8)
    agent_id = "durable-agent"
    sender.register(agent_id=agent_id, hostname="durable-1", agent_version="test")
    return GrpcSink(sender, agent_id, spool=Spool(spool_dir, **spool_kw))


def test_outage_spools_backs_off_and_delivers_exactly_once(ingest: Ingest, tmp_path: Path) -> None:
    operator, token = agent_token("durable-outage")
    sink = sink_for(ingest.address, token, tmp_path / "spool")
    sink.submit(samples(50, 0))
    sink.flush()
    wait_for(lambda: stored(operator) == (50, 1))
    ingest.stop()
    for tag in range(1, 21):  # 20 intervals with ingest down
        sink.submit(samples(50, tag))
        sink.flush()
        time.sleep(0.15)
    assert sink.spool.pending_batches >= 19  # on disk, not acked
    assert stored(operator) == (50, 1)
    delays = list(sink.sender.backoff_delays)
    assert len(delays) >= 4 and sink.sender.stats.reconnects >= 4
    assert all(0.05 <= d <= 0.8 for d in delays)  # base/2 .. cap
    assert max(delays) > 0.4  # grew past the base
    assert len({round(d, 6) for d in delays}) == len(delays)  # jittered: no two equal
    ingest.start()
    wait_for(lambda: stored(operator) == (21 * 50, 21))
    wait_for(lambda: sink.spool.pending_batches == 0)
    sink.close(timeout=10)
    time.sleep(0.5)
    assert stored(operator) == (21 * 50, 21)  # exactly once: no batch stored twice


def test_restart_with_a_non_empty_spool_resends(ingest: Ingest, tmp_path: Path) -> None:
    operator, token = agent_token("durable-restart")
    spool_dir = tmp_path / "agent"
    first = make_sink(server=ingest.address, token=token, spool_dir=str(spool_dir))
    first.submit(samples(30, 1))
    first.flush()
    wait_for(lambda: stored(operator) == (30, 1))
    ingest.stop()
    for tag in range(2, 6):
        first.submit(samples(30, tag))
        first.flush()
    first.close(timeout=1)  # the agent stops (or is killed) with 4 batches unacked
    left = Spool(spool_dir / "batches")
    assert left.pending_batches == 4
    left.close()
    ingest.start()
    second = make_sink(server=ingest.address, token=token, spool_dir=str(spool_dir))
    assert second.agent_id == first.agent_id  # same identity: resends are deduplicated
    second.submit(samples(30, 6))
    second.flush()
    wait_for(lambda: stored(operator) == (6 * 30, 6))
    wait_for(lambda: second.spool.pending_batches == 0)
    second.close(timeout=10)
    assert stored(operator) == (6 * 30, 6)


def test_spool_cap_drops_oldest_counts_and_reports(
    ingest: Ingest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    operator, token = agent_token("durable-cap")
    sink = sink_for(
        ingest.address, token, tmp_path / "spool", max_bytes=64 << 10, segment_bytes=8 << 10
    )
    ingest.stop()
    caplog.set_level(logging.WARNING, logger="agent.transport.sink")
    for tag in range(40):  # ~40 x 4 KiB batches into a 64 KiB spool
        sink.submit(samples(200, tag))
        sink.flush()
    dropped = sink.spool.dropped_batches
    assert dropped > 0
    said = [r.getMessage() for r in caplog.records if "spool full" in r.getMessage()]
    assert said and "dropped" in said[0]
    kept = sink.spool.pending_batches
    assert kept + dropped == 40
    ingest.start()
    sink.submit(samples(10, 99))  # the next interval: carries the last drop report, if pending
    sink.flush()
    wait_for(lambda: sink.spool.pending_batches == 0)
    sink.close(timeout=10)
    with tenant_context(operator):
        events = list(
            Event.objects.for_tenant(operator).filter(name=signals.EVENT_SPOOL_DROPPED)  # type: ignore[attr-defined]
        )
    assert events, "the drop reached the server as an event"
    assert sum(int(e.value) for e in events) <= dropped
    assert max(int(e.labels["dropped_total"]) for e in events) == dropped
    total, receipts = stored(operator)
    # Everything still on disk arrived, plus the up-to-`window` batches the sender already held
    # in memory when the spool dropped them from disk; nothing twice.
    assert kept + 1 <= receipts <= min(41, kept + 1 + sink.sender.window)
    assert total == 200 * (receipts - 1) + 10


def test_agent_starting_during_an_outage_spools_then_delivers(
    ingest: Ingest, tmp_path: Path
) -> None:
    operator, token = agent_token("durable-cold")
    ingest.stop()
    sink = make_sink(server=ingest.address, token=token, spool_dir=str(tmp_path / "agent"))
    for tag in range(3):
        sink.submit(samples(20, tag))
        sink.flush()
    assert sink.spool.pending_batches == 3
    ingest.start()
    wait_for(lambda: stored(operator) == (60, 3), timeout=60)
    sink.close(timeout=10)


def test_node_backend_run_from_config_into_ingest(ingest: Ingest, tmp_path: Path) -> None:
    """`proof-agent run --config FILE` (the node backend on fixture roots) with the config's
    [server] (plaintext to loopback, token_file) and [spool]: what it collected is stored."""
    from agent.cli import main as agent_main
    from agent.tests.fileserver import serve
    from agent.tests.test_node_backend import ROUTES, _toml, fake_proc, node_config

    operator, token = agent_token("node-backend-run")
    (tmp_path / "token").write_text(token + "\n")
    proc = fake_proc(tmp_path)
    with serve(ROUTES) as base:
        cfg = node_config(
            tmp_path,
            proc,
            base,
            server={"address": ingest.address, "tls": False, "token_file": str(tmp_path / "token")},
            ebpf={"enabled": False},
            slurm={"enabled": False},
        )
        path = tmp_path / "agent.toml"
        path.write_text(_toml(cfg))
        trace = tmp_path / "sent.jsonl"
        assert (
            agent_main(["run", "--config", str(path), "--duration", "3", "--out", str(trace)]) == 0
        )
    from contract.trace import validate_trace

    report = validate_trace(trace)
    assert report.ok and report.counts["sample"] > 100
    wait_for(lambda: stored(operator)[0] == report.counts["sample"])
    left = Spool(tmp_path / "spool" / "batches")
    assert left.pending_batches == 0
    left.close()


def test_registration_carries_the_nodes_gpu_facts(ingest: Ingest, tmp_path: Path) -> None:
    """The node backend's facts (from NVML: here the simulated one) registered through the
    transport: each GPU's UUID, index, model, memory, driver and CUDA version reach ingest."""
    import argparse

    from agent.collectors.nvml_sim import SimulatedNvml
    from agent.commands._backend import _assemble_node
    from agent.runtime import ManualClock
    from ingest.models import Gpu, Node

    operator, token = agent_token("node-facts")
    path = tmp_path / "agent.toml"
    path.write_text(
        f'[agent]\nnode = "facts-node"\n[spool]\ndir = "{tmp_path / "spool"}"\n'
        '[dcgm]\nmode = "off"\n[slurm]\nenabled = false\n[inference]\ndiscover = false\n'
    )
    args = argparse.Namespace(config=str(path), scenario=None, node=None, interval=None, duration=1)
    nv = SimulatedNvml.with_gpus(2)
    assembled = _assemble_node(
        args, clock=ManualClock(0.0), nvml=nv, ebpf_status=lambda: (False, "test")
    )
    sink = make_sink(
        server=ingest.address, token=token, spool_dir=str(tmp_path / "spool"), meta=assembled.meta
    )
    sink.close(timeout=5)
    with tenant_context(operator):
        node = Node.objects.for_tenant(operator).get(hostname="facts-node")  # type: ignore[attr-defined]
        gpus = list(Gpu.objects.for_tenant(operator).filter(node=node).order_by("index"))  # type: ignore[attr-defined]
    assert [(g.uuid, g.index) for g in gpus] == [(g.uuid, i) for i, g in enumerate(nv.gpus)]
    assert all(g.model == nv.gpus[0].name and g.memory_mib == 80 * 1024 for g in gpus)
    assert all(g.driver_version and g.cuda_version for g in gpus)


def test_doctor_proves_the_token_against_ingest(ingest: Ingest, tmp_path: Path) -> None:
    from agent.commands.doctor import OK, UNAVAILABLE, check_server
    from agent.config import parse_config

    _operator, token = agent_token("doctor-token")
    for value, status, words in (
        (token, OK, "token accepted"),
        ("wrong", UNAVAILABLE, "token refused"),
    ):
        (tmp_path / "token").write_text(value + "\n")
        cfg = parse_config(
            {
                "server": {
                    "address": ingest.address,
                    "tls": False,
                    "token_file": str(tmp_path / "token"),
                }
            },
            env={},
        )
        check = check_server(cfg, timeout=10)
        assert check.status == status and words in check.detail, check
