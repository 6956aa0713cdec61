"""The durable transport's internals (agent/transport/sink.py over contract.wire's BatchSender)
against a real gRPC peer, the in-test ingest of agent/tests/fake_ingest.py: what only the agent
can see — its sender's backoff waits and counters, the spool's drop counts, the dead letter's
bookkeeping, what Register carries. What ingest stores of it, with the agent as its own
process, is tested end to end in tests/test_agent_transport_durable.py and
tests/test_dirty_output.py."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.logtail import LogTailCollector, TailSpec
from agent.collectors.nvml import NvmlCollector
from agent.collectors.nvml_sim import SimulatedNvml
from agent.commands._backend import _assemble_node
from agent.runtime import ManualClock
from agent.runtime.loop import Agent
from agent.spool import Spool
from agent.tests.fake_ingest import FakeIngest
from agent.transport.sink import GrpcSink, make_sink
from contract import signals
from contract.trace import validate_trace
from contract.wire.client import BatchSender, open_channel
from contract.wire.decode import batch_records

NODE = "transport-node"


@pytest.fixture
def ingest() -> Iterator[FakeIngest]:
    srv = FakeIngest()
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
            "node": NODE,
            "gpu": f"GPU-durable-{i % 4}",
        }
        for i in range(n)
    ]


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def sink_for(
    address: str,
    spool_dir: Path,
    *,
    retry_delay: float = 0.1,
    max_retry_delay: float = 0.8,
    **spool_kw: Any,
) -> GrpcSink:
    """What make_sink builds, with a short backoff for the test."""
    sender = BatchSender(
        open_channel(address), "token", retry_delay=retry_delay, max_retry_delay=max_retry_delay
    )
    reply = sender.register(agent_id="transport-agent", hostname=NODE, agent_version="test")
    return GrpcSink(
        sender,
        "transport-agent",
        spool=Spool(spool_dir, **spool_kw),
        max_batch_bytes=int(reply.max_batch_bytes),
    )


def test_an_outage_backs_off_jittered_and_capped_then_delivers_exactly_once(
    ingest: FakeIngest, tmp_path: Path
) -> None:
    sink = sink_for(ingest.address, tmp_path / "spool")
    sink.submit(samples(50, 0))
    sink.flush()
    wait_for(lambda: 1 in ingest.stored)
    ingest.stop()
    for tag in range(1, 21):  # 20 intervals with ingest down
        sink.submit(samples(50, tag))
        sink.flush()
        time.sleep(0.15)
    assert sink.spool.pending_batches >= 19  # on disk, not acked
    delays = list(sink.sender.backoff_delays)
    assert len(delays) >= 4 and sink.sender.stats.reconnects >= 4
    assert all(0.05 <= d <= 0.8 for d in delays)  # base/2 .. cap
    assert max(delays) > 0.4  # grew past the base
    assert len({round(d, 6) for d in delays}) == len(delays)  # jittered: no two equal
    ingest.start()
    wait_for(lambda: sink.spool.pending_batches == 0)
    sink.close(timeout=10)
    assert sorted(ingest.stored) == list(range(1, 22))
    assert len(ingest.records("sample")) == 21 * 50  # stored once each (resends: DUPLICATE)


def test_the_spool_cap_drops_the_oldest_counts_logs_and_reports(
    ingest: FakeIngest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = sink_for(ingest.address, tmp_path / "spool", max_bytes=64 << 10, segment_bytes=8 << 10)
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
    for tag in range(3):  # the acks after the drop move the spool past the dropped batches
        sink.submit(samples(10, 100 + tag))
        sink.flush()
    wait_for(lambda: sink.spool.acked_through == sink.spool.next_seq - 1)
    sink.close(timeout=10)
    events = [e for e in ingest.records("event") if e["name"] == signals.EVENT_SPOOL_DROPPED]
    assert events, "the drop reached the server as an event"
    assert sum(int(e["value"]) for e in events) <= dropped
    assert max(int(e["labels"]["dropped_total"]) for e in events) == dropped
    received = len(ingest.stored)
    # Everything still on disk arrived, plus the up-to-`window` batches the sender already held
    # in memory when the spool dropped them from disk; nothing twice.
    assert kept + 4 <= received <= min(44, kept + 4 + sink.sender.window)
    assert len(ingest.records("sample")) == 200 * (received - 4) + 40


def test_registration_carries_the_nodes_gpu_facts(ingest: FakeIngest, tmp_path: Path) -> None:
    """The node backend's facts (from NVML: here the simulated one) go out in Register: each
    GPU's UUID, index, model, memory, driver and CUDA version."""
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
        server=ingest.address, token="t", spool_dir=str(tmp_path / "spool"), meta=assembled.meta
    )
    sink.close(timeout=5)
    (request,) = ingest.registered
    assert request.hostname == "facts-node" and request.agent_id == sink.agent_id
    gpus = sorted(request.gpus, key=lambda g: g.index)
    assert [(g.uuid, g.index) for g in gpus] == [(g.uuid, i) for i, g in enumerate(nv.gpus)]
    assert all(g.model == nv.gpus[0].name and g.memory_mib == 80 * 1024 for g in gpus)
    assert all(g.driver_version and g.cuda_version for g in gpus)


# --- job output through the agent loop (simulated NVML, the real log tail) -------------------


def make_agent(sink: GrpcSink, log_path: Path) -> Agent:
    collectors: list[Any] = [
        NvmlCollector(SimulatedNvml.with_gpus(2), node=NODE),
        LogTailCollector([TailSpec(str(log_path), job="job")], from_start=True),
    ]
    return Agent(collectors, sink, node=NODE)


def run_ticks(agent: Agent, log_path: Path, writes: dict[int, bytes], ticks: int) -> None:
    for i in range(ticks):
        if i in writes:
            with open(log_path, "ab") as fh:
                fh.write(writes[i])
        agent.tick()


def deliver(sink: GrpcSink, timeout: float = 60.0) -> None:
    sink.flush()
    deadline = time.monotonic() + timeout
    while sink.spool.pending_batches or sink.sender.unacked():
        assert time.monotonic() < deadline, "not every batch was acked"
        time.sleep(0.05)


def test_dirty_job_output_is_cleaned_and_every_batch_sent_once(
    ingest: FakeIngest, tmp_path: Path
) -> None:
    log_path = tmp_path / "job.log"
    log_path.write_bytes(b"step 1 loss 2.5\n")
    sink = sink_for(ingest.address, tmp_path / "spool" / "batches", retry_delay=0.2)
    agent = make_agent(sink, log_path)
    writes = {
        3: b"x\n\x00\x00 corrupted\n",
        8: b"bad utf-8 \xff\xfe here\n",
        12: b"A" * 26_498 + b"\n",
    }
    run_ticks(agent, log_path, writes, ticks=30)
    deliver(sink)
    stats = sink.sender.stats
    batches = sink.spool.next_seq - 1
    assert batches == 30
    # Every batch sent exactly once and acked: no resend loop, nothing refused.
    assert stats.sends == batches and stats.resends == 0 and stats.max_attempts == 1
    assert stats.acked == batches and stats.rejected == []
    assert all(n == 1 for n in ingest.sends.values()) and len(ingest.sends) == 30
    lines = [r["line"] for r in ingest.records("log")]
    assert lines[:4] == [
        "step 1 loss 2.5",
        "x",
        "\ufffd\ufffd corrupted",
        "bad utf-8 \ufffd\ufffd here",
    ]
    assert lines[4].startswith("AAAA") and lines[4].endswith(" chars]")
    sink.close(timeout=5)


def test_a_refused_batch_goes_to_the_dead_letter_and_the_agent_goes_on(tmp_path: Path) -> None:
    """Refused for its size (INVALID_ARGUMENT naming it) and by gRPC's own message limit
    (RESOURCE_EXHAUSTED): each sent once, kept in the dead letter, the spool moves past."""
    limit = 64 * 1024
    srv = FakeIngest(
        refuse=lambda seq, attempt, batch: (
            f"{batch.ByteSize()} bytes, over the limit of {limit}"
            if batch.ByteSize() > limit
            else None
        ),
        max_message_bytes=128 * 1024,
    )
    try:
        log_path = tmp_path / "job.log"
        log_path.write_bytes(b"")
        spool_dir = tmp_path / "spool"
        sink = sink_for(srv.address, spool_dir / "batches", retry_delay=0.2)
        sink.max_batch_bytes, sink._record_budget = (
            1 << 20,
            1 << 19,
        )  # an agent that thinks 1 MiB is fine
        agent = make_agent(sink, log_path)

        def out(n: int) -> bytes:
            return b"".join(b"line %06d %s\n" % (i, b"z" * 100) for i in range(n))

        run_ticks(agent, log_path, {6: out(900), 12: out(1800), 15: b"later\n"}, ticks=30)
        deliver(sink)
        stats = sink.sender.stats
        assert [seq for seq, _ in stats.rejected] == [7, 13]
        assert "over the limit of 65536" in stats.rejected[0][1]
        assert "message size limit" in stats.rejected[1][1]
        assert sink.spool.pending_batches == 0
        refusals = len(stats.rejected)
        assert stats.max_attempts <= 1 + refusals
        assert stats.sends <= 30 + refusals * sink.sender.window
        assert sink.dead_letter.stats()["batches"] == 2
        for seq, lines in ((7, 900), (13, 1800)):
            data = sink.dead_letter.read(seq)
            assert data is not None
            assert sum(r["type"] == "log" for r in batch_records(data)) == lines
        report = validate_trace(spool_dir / "dead-letter" / f"{7:020d}.jsonl")
        assert report.ok and report.counts["log"] == 900
        assert 7 not in srv.stored and 13 not in srv.stored
        assert [r["line"] for r in srv.records("log")] == ["later"]
        deliver(sink)  # the next interval's flush carries the batch_refused events
        agent.tick()
        deliver(sink)
        refused = [e for e in srv.records("event") if e["name"] == signals.EVENT_BATCH_REFUSED]
        assert sorted(e["value"] for e in refused) == [7.0, 13.0]
        sink.close(timeout=5)
    finally:
        srv.stop()


def test_a_batch_that_keeps_failing_is_resent_with_a_growing_backoff(tmp_path: Path) -> None:
    """A batch the server fails to store 4 times (UNAVAILABLE): each reconnect waits longer —
    jittered over the upper half of base * 2^k — and it is stored after its 5th send."""
    srv = FakeIngest(fail=lambda seq, attempt, batch: seq == 3 and attempt <= 4)
    try:
        log_path = tmp_path / "job.log"
        log_path.write_bytes(b"")
        sink = sink_for(
            srv.address, tmp_path / "spool" / "batches", retry_delay=0.2, max_retry_delay=60
        )
        agent = make_agent(sink, log_path)
        run_ticks(agent, log_path, {}, ticks=12)
        deliver(sink, timeout=90)
        stats = sink.sender.stats
        assert stats.rejected == [] and stats.reconnects == 4
        assert stats.max_attempts == 5 and srv.sends[3] == 5
        base = sink.sender.retry_delay
        delays = sink.sender.backoff_delays
        assert len(delays) == 4
        for k, delay in enumerate(delays):
            assert base * 2**k / 2 <= delay <= base * 2**k
        gaps = [b - a for a, b in zip(srv.failed_at[3], srv.failed_at[3][1:], strict=False)]
        assert all(gap >= base * 2**k / 2 for k, gap in enumerate(gaps))  # seen by the server
        assert sorted(srv.stored) == list(range(1, 13))
        sink.close(timeout=5)
    finally:
        srv.stop()
