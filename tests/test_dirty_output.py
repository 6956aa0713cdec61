"""Job output as dirty as real jobs make it, through the real agent and the real ingest (gRPC
on loopback, PostgreSQL): a NUL written to a tailed job log, a 26 KB `\\r`-collapsed progress
line, a batch with one bad record from an agent that does not clean, and batches the server
refuses (too big; data PostgreSQL itself refuses) — every good sample stored, the lines stored
cleaned, every batch sent once (no resend loop), a refused batch kept in the dead letter with
its reason while the agent goes on. See contract/limits.py, docs/ingest.md and docs/agent.md."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from django.db import connection, connections
from prometheus_client import REGISTRY

from agent.collectors.logtail import LogTailCollector, TailSpec
from agent.collectors.nvml import NvmlCollector
from agent.collectors.nvml_sim import SimulatedNvml
from agent.runtime.loop import Agent
from agent.spool import Spool
from agent.transport.sink import GrpcSink
from contract import limits, signals
from contract.trace import validate_trace
from contract.wire.client import BatchSender, open_channel
from contract.wire.decode import batch_records
from contract.wire.encode import BatchBuilder
from ingest import services
from ingest.models import Event, LogLine
from ingest.processing import Limits
from ingest.server import IngestServer
from ingest.storage import BLOCK_TABLE
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODE = "dirty-node"
JOB = "dirty-job"


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the threaded ingest server needs PostgreSQL (see ingest/tests/conftest.py)")


def start_ingest(limits_: Limits | None = None) -> IngestServer:
    services.clear_caches()
    srv = IngestServer("127.0.0.1", 0, writers=2, queue_depth=8, limits=limits_)
    srv.start()
    return srv


@pytest.fixture
def ingest() -> Iterator[IngestServer]:
    srv = start_ingest()
    yield srv
    srv.stop(grace=1)


def agent_token(name: str) -> tuple[int, str]:
    tenant = make_tenant(name)
    token = tenant_services.do_create_agent_token(tenant.operator.pk, name="agent")[1]
    return tenant.operator.pk, token


class CountingSink(GrpcSink):
    """The real gRPC sink, counting what the agent hands it by record type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submitted: Counter[str] = Counter()

    def submit(self, records: Sequence[Any]) -> None:
        self.submitted.update(r["type"] for r in records)
        super().submit(records)


def make_sink(
    port: int, token: str, spool_dir: Path, agent_id: str, max_batch_bytes: int | None = None
) -> CountingSink:
    """What agent.transport.sink.make_sink builds (batches cut to the server's limit, which
    Register reports, unless `max_batch_bytes` says otherwise)."""
    sender = BatchSender(open_channel(f"127.0.0.1:{port}"), token, retry_delay=0.2)
    reply = sender.register(agent_id=agent_id, hostname=NODE, agent_version="test")
    return CountingSink(
        sender,
        agent_id,
        spool=Spool(spool_dir / "batches"),
        max_batch_bytes=max_batch_bytes or reply.max_batch_bytes,
    )


def make_agent(sink: CountingSink, log_path: Path) -> Agent:
    """The agent loop with the simulated NVML (2 GPUs) and the real log tail on `log_path`."""
    collectors: list[Any] = [
        NvmlCollector(SimulatedNvml.with_gpus(2), node=NODE),
        LogTailCollector([TailSpec(str(log_path), job=JOB)], from_start=True),
    ]
    return Agent(collectors, sink, node=NODE)


def stored_samples(operator_id: int) -> int:
    with tenant_context(operator_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(sum(sample_count), 0) FROM {BLOCK_TABLE}")
        return int(cursor.fetchone()[0])


def stored_lines(operator_id: int) -> list[str]:
    with tenant_context(operator_id):
        rows = LogLine.objects.for_tenant(operator_id).order_by("ts_us", "id")  # type: ignore[attr-defined]
        return list(rows.values_list("line", flat=True))


def run_ticks(agent: Agent, log_path: Path, writes: dict[int, bytes], ticks: int = 30) -> None:
    """`ticks` agent intervals; before tick i, `writes[i]` is appended to the job log."""
    for i in range(ticks):
        if i in writes:
            with open(log_path, "ab") as fh:
                fh.write(writes[i])
        agent.tick()


def deliver(sink: CountingSink, timeout: float = 60.0) -> None:
    """Flush the sink and wait until the spool holds nothing unacked."""
    sink.flush()
    deadline = time.monotonic() + timeout
    while sink.spool.pending_batches or sink.sender.unacked():
        assert time.monotonic() < deadline, "not every batch was acked"
        time.sleep(0.05)


def owner_ddl(sql: str) -> None:
    """Run DDL as the schema owner on this test database (the app role may not alter tables)."""
    params = connections["owner"].get_connection_params()
    params["dbname"] = connection.settings_dict["NAME"]
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(sql)


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_a_nul_in_a_tailed_job_log_is_stored_cleaned_and_sent_once(
    ingest: IngestServer, tmp_path: Path
) -> None:
    operator, token = agent_token("dirty-nul")
    log_path = tmp_path / "job.log"
    log_path.write_bytes(b"step 1 loss 2.5\n")
    sink = make_sink(ingest.port, token, tmp_path / "spool", "dirty-nul-agent")
    agent = make_agent(sink, log_path)
    writes = {
        3: b"step 2 loss 2.4\n",
        5: b"x\n\x00\x00 corrupted\n",  # printf 'x\n\x00\x00 corrupted\n' >> job.log
        8: b"bad utf-8 \xff\xfe here\n",
        12: b"step 3 loss 2.3\n",
    }
    run_ticks(agent, log_path, writes)
    deliver(sink)
    stats = sink.sender.stats
    batches = sink.spool.next_seq - 1
    assert batches == 30
    # Every batch sent exactly once and acked: no resend loop, nothing refused.
    assert stats.sends == batches and stats.resends == 0 and stats.max_attempts == 1
    assert stats.acked == batches and stats.rejected == [] and stats.records_refused == 0
    assert sink.spool.pending_batches == 0
    assert stored_samples(operator) == sink.submitted["sample"] > 0
    lines = stored_lines(operator)
    assert "x" in lines and "\ufffd\ufffd corrupted" in lines
    assert "bad utf-8 \ufffd\ufffd here" in lines
    assert len(lines) == sink.submitted["log"] == 6
    assert not any("\x00" in line for line in lines)
    sink.close(timeout=5)


def test_a_26_kb_progress_line_keeps_every_sample_and_is_stored_cleaned(
    ingest: IngestServer, tmp_path: Path
) -> None:
    operator, token = agent_token("dirty-long")
    log_path = tmp_path / "job.log"
    log_path.write_bytes(b"")
    sink = make_sink(ingest.port, token, tmp_path / "spool", "dirty-long-agent")
    agent = make_agent(sink, log_path)
    # A tqdm bar redrawn with \r 700 times on one line (~28 KB), then the HF Trainer's dict.
    redraws = [
        f" {i * 100 // 600:3d}%|{'#' * (i // 60):10s}| {i}/600 [00:{i // 10:02d}<00:10]"
        for i in range(700)
    ]
    bar = ("\r".join(redraws) + "{'loss': '4.046', 'grad_norm': '0.92'}\n").encode()
    assert len(bar) > 26_000
    plain = b"A" * 26_498 + b"\n"  # one long line, no \r: truncated with a marker
    run_ticks(agent, log_path, {4: bar, 9: plain, 15: b"after\n"})
    deliver(sink)
    stats = sink.sender.stats
    batches = sink.spool.next_seq - 1
    assert batches == 30 and stats.sends == batches and stats.resends == 0
    assert stats.rejected == [] and stats.records_refused == 0
    assert stored_samples(operator) == sink.submitted["sample"] > 0
    lines = stored_lines(operator)
    assert lines[0] == redraws[-1] + "{'loss': '4.046', 'grad_norm': '0.92'}"
    assert len(lines[1]) == limits.MAX_LOG_LINE_CHARS
    assert lines[1].startswith("AAAA") and lines[1].endswith(" chars]")
    assert f"…[truncated {26_498 - lines[1].index('…')} chars]" in lines[1]
    assert lines[2] == "after"
    sink.close(timeout=5)


def test_one_bad_record_from_an_agent_that_does_not_clean_is_refused_alone(
    ingest: IngestServer,
) -> None:
    operator, token = agent_token("dirty-raw")
    now = time.time()
    builder = BatchBuilder("raw-agent", clean=False)  # an older agent: no cleaning
    for gpu in range(2):
        builder.add_samples(
            signals.DCGM_FI_DEV_GPU_UTIL,
            {signals.NODE: NODE, signals.GPU: f"GPU-{gpu}", signals.GPU_INDEX: gpu},
            now - 10 + np.arange(10.0),
            np.arange(10.0),
        )
    builder.extend(
        [
            {
                "type": "sample",
                "ts": now,
                "name": "g",
                "value": 1.0,
                "node": NODE,
                "gpu": "GPU-" + "e" * 196,
            },
            {
                "type": "sample",
                "ts": now,
                "name": "l",
                "value": 2.0,
                "node": NODE,
                "labels": {"device": "mlx5\x00_0"},
            },
            {"type": "log", "ts": now, "line": "\x00\x00 corrupted", "node": NODE},
            {"type": "log", "ts": now, "line": "fine", "node": NODE, "job": JOB},
            {"type": "job", "ts": now, "job": JOB, "config": {"lr": "3e-3\x00"}},
        ]
    )
    before = metric("proof_ingest_record_rejects_total", {"kind": "series", "reason": "too_long"})
    sender = BatchSender(open_channel(f"127.0.0.1:{ingest.port}"), token)
    acks: list[Any] = []
    sender.on_ack = acks.append
    sender.send(builder.build(1))
    assert sender.flush(timeout=30)
    sender.close(timeout=5)
    assert len(acks) == 1 and acks[0].rejected_records == 4 and acks[0].rejected_samples == 2
    assert sorted((r.kind, r.reason) for r in acks[0].rejections) == [
        ("job", "nul"),
        ("log", "nul"),
        ("series", "nul"),
        ("series", "too_long"),
    ]
    assert any("gpu: 200 characters, over the limit of 96" in r.message for r in acks[0].rejections)
    assert sender.stats.records_refused == 4
    assert stored_samples(operator) == 20
    assert stored_lines(operator) == ["fine"]
    after = metric("proof_ingest_record_rejects_total", {"kind": "series", "reason": "too_long"})
    assert after == before + 1


def job_output(n_lines: int) -> bytes:
    return b"".join(b"line %06d %s\n" % (i, b"z" * 100) for i in range(n_lines))


def test_a_tick_of_more_output_than_a_batch_may_hold_is_split_not_refused(
    tmp_path: Path,
) -> None:
    srv = start_ingest(Limits(max_batch_bytes=64 * 1024))
    try:
        operator, token = agent_token("dirty-split")
        log_path = tmp_path / "job.log"
        log_path.write_bytes(b"")
        sink = make_sink(srv.port, token, tmp_path / "spool", "dirty-split-agent")
        assert sink.max_batch_bytes == 64 * 1024  # from Register
        agent = make_agent(sink, log_path)
        run_ticks(agent, log_path, {3: job_output(1100)}, ticks=8)  # 120 KB in one interval
        deliver(sink)
        stats = sink.sender.stats
        assert stats.rejected == [] and sink.spool.next_seq - 1 > 8
        assert stats.sends == sink.spool.next_seq - 1
        assert len(stored_lines(operator)) == 1100
        assert stored_samples(operator) == sink.submitted["sample"]
        sink.close(timeout=5)
    finally:
        srv.stop(grace=1)


def test_a_refused_batch_goes_to_the_dead_letter_and_the_agent_goes_on(
    tmp_path: Path,
) -> None:
    srv = start_ingest(Limits(max_batch_bytes=64 * 1024))
    try:
        operator, token = agent_token("dirty-dead")
        log_path = tmp_path / "job.log"
        log_path.write_bytes(b"")
        spool_dir = tmp_path / "spool"
        # An agent that believes batches of 1 MiB are fine (the server's limit was lowered
        # since): ingest refuses the 100 KB batch (INVALID_ARGUMENT, over 64 KiB), and gRPC
        # itself the 200 KB one (RESOURCE_EXHAUSTED, over its 128 KiB message limit).
        sink = make_sink(srv.port, token, spool_dir, "dirty-dead-agent", 1 << 20)
        agent = make_agent(sink, log_path)
        run_ticks(agent, log_path, {6: job_output(900), 12: job_output(1800), 15: b"later\n"})
        deliver(sink)
        stats = sink.sender.stats
        assert [seq for seq, _ in stats.rejected] == [7, 13]
        assert "over the limit of 65536" in stats.rejected[0][1]
        assert "message size limit" in stats.rejected[1][1]
        assert sink.spool.pending_batches == 0  # the spool moved past them
        # No loop: a refused batch is sent once; each refusal ends the stream, so the batches
        # in flight behind it are sent once more (ingest answers DUPLICATE where it had them).
        refusals = len(stats.rejected)
        assert stats.max_attempts <= 1 + refusals
        assert stats.sends <= 30 + refusals * sink.sender.window
        # Kept in the dead letter with the reason, as bytes and as a readable trace.
        dead = spool_dir / "dead-letter"
        entry = json.loads((dead / f"{7:020d}.json").read_text())
        assert entry["sequence"] == 7 and "over the limit of 65536" in entry["reason"]
        assert (dead / entry["batch_file"]).stat().st_size > 64 * 1024
        report = validate_trace(dead / entry["trace_file"])
        assert report.ok and report.counts["log"] == 900 and report.counts["sample"] > 0
        assert sink.dead_letter.stats()["batches"] == 2
        # Everything else was stored, "later" included.
        lines = stored_lines(operator)
        assert lines == ["later"]
        refused_samples = 0
        for seq in (7, 13):
            data = sink.dead_letter.read(seq)
            assert data is not None
            refused_samples += sum(r["type"] == "sample" for r in batch_records(data))
        assert stored_samples(operator) == sink.submitted["sample"] - refused_samples
        # Reported to ingest too, in the next batch (the next interval's flush sends it).
        deliver(sink)
        with tenant_context(operator):
            refused = sorted(
                Event.objects.for_tenant(operator)  # type: ignore[attr-defined]
                .filter(name=signals.EVENT_BATCH_REFUSED)
                .values_list("value", "text")
            )
        assert [v for v, _ in refused] == [7.0, 13.0] and "over the limit" in refused[0][1]
        sink.close(timeout=5)
    finally:
        srv.stop(grace=1)


def test_a_batch_postgresql_refuses_is_dead_lettered_not_resent_in_a_loop(
    ingest: IngestServer, tmp_path: Path
) -> None:
    """A batch that decodes but that the database refuses (here: a CHECK constraint on the log
    table, standing in for any value PostgreSQL will not store): refused once with
    INVALID_ARGUMENT, kept in the dead letter; the batches around it are stored."""
    operator, token = agent_token("dirty-pg")
    table = LogLine._meta.db_table
    owner_ddl(
        f"ALTER TABLE {table} ADD CONSTRAINT proof_test_poison "
        "CHECK (line <> 'poison pill') NOT VALID"
    )
    try:
        log_path = tmp_path / "job.log"
        log_path.write_bytes(b"")
        sink = make_sink(ingest.port, token, tmp_path / "spool", "dirty-pg-agent")
        agent = make_agent(sink, log_path)
        errors_before = metric("proof_ingest_store_errors_total")
        run_ticks(agent, log_path, {5: b"poison pill\n", 8: b"fine\n"}, ticks=15)
        deliver(sink)
        stats = sink.sender.stats
        assert [seq for seq, _ in stats.rejected] == [6]
        assert "the database refused its data" in stats.rejected[0][1]
        # The poisoned batch was tried once; in all, sends = batches + the few batches of the
        # window after it that the stream's end made the agent resend.
        assert metric("proof_ingest_store_errors_total") - errors_before == 1
        assert stats.sends <= 15 + sink.sender.window and stats.max_attempts <= 2
        assert stored_lines(operator) == ["fine"]
        assert (tmp_path / "spool" / "dead-letter" / f"{6:020d}.batch").exists()
        sink.close(timeout=5)
    finally:
        owner_ddl(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS proof_test_poison")


def test_a_batch_that_keeps_failing_to_store_is_resent_with_a_growing_backoff(
    ingest: IngestServer, tmp_path: Path
) -> None:
    """A transient store failure of one batch (a serialization failure, the first 4 times),
    while the batches after it are stored (and acked) by the other writer: the failures are
    counted against that batch, so each reconnect waits longer — before, every out-of-order ack
    reset the backoff and the batch was resent about every 0.3 s (39 sends in 30 s)."""
    operator, token = agent_token("dirty-flaky")
    table = LogLine._meta.db_table
    owner_ddl("CREATE SEQUENCE IF NOT EXISTS proof_test_flaky_tries")
    owner_ddl(
        "CREATE OR REPLACE FUNCTION proof_test_flaky() RETURNS trigger "
        "LANGUAGE plpgsql SECURITY DEFINER AS $$ BEGIN "
        "IF NEW.line = 'flaky' AND nextval('proof_test_flaky_tries') <= 4 THEN "
        "RAISE EXCEPTION 'test: could not serialize' USING ERRCODE = '40001'; END IF; "
        "RETURN NEW; END $$"
    )
    owner_ddl(
        f"CREATE TRIGGER proof_test_flaky BEFORE INSERT ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION proof_test_flaky()"
    )
    try:
        log_path = tmp_path / "job.log"
        log_path.write_bytes(b"")
        sink = make_sink(ingest.port, token, tmp_path / "spool", "dirty-flaky-agent")
        agent = make_agent(sink, log_path)
        run_ticks(agent, log_path, {3: b"flaky\n"}, ticks=12)
        deliver(sink, timeout=90)
        stats = sink.sender.stats
        assert stats.rejected == [] and stats.reconnects == 4
        assert stats.max_attempts == 5  # the flaky batch: 4 failures, then stored
        base = sink.sender.retry_delay
        delays = sink.sender.backoff_delays
        assert len(delays) == 4
        for k, delay in enumerate(delays):  # jittered over the upper half of base * 2^k
            assert base * 2**k / 2 <= delay <= base * 2**k
        assert stored_lines(operator) == ["flaky"]
        assert stored_samples(operator) == sink.submitted["sample"]
        sink.close(timeout=5)
    finally:
        owner_ddl(f"DROP TRIGGER IF EXISTS proof_test_flaky ON {table}")
        owner_ddl("DROP FUNCTION IF EXISTS proof_test_flaky()")
        owner_ddl("DROP SEQUENCE IF EXISTS proof_test_flaky_tries")
