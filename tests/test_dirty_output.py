"""Job output as dirty as real jobs make it, through the real agent — a `proof-agent run
--config` process (the node backend, following a job log) — and the real ingest (gRPC on
loopback, PostgreSQL): a NUL written to the tailed job log, a 26 KB `\\r`-collapsed progress
line, a batch with one bad record from an agent that does not clean, and batches the server
refuses (too big; data PostgreSQL itself refuses) — every good sample stored, the lines stored
cleaned, every batch stored once (ingest's own counters: no duplicates, so no resend loop), a
refused batch kept in the dead letter with its reason while the agent goes on. What only the
agent sees (its sender's sends and backoff waits) is tested in agent/tests/test_transport.py.
See contract/limits.py, docs/ingest.md and docs/agent.md."""

from __future__ import annotations

import inspect
import itertools
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from django.db import connection, connections

from contract import limits, signals
from contract.trace import ValidationReport, validate_trace
from contract.wire.client import BatchSender, open_channel
from contract.wire.encode import BatchBuilder
from ingest.models import BatchReceipt, Event, LogLine
from ingest.processing import Limits
from tenants.context import tenant_context
from tests.agentproc import (
    AgentProcess,
    SpoolState,
    dead_letter,
    node_config,
    read_spool,
    wait_for,
)
from tests.helpers import (
    Ingest,
    agent_token,
    counter,
    counts_since,
    ingest_counts,
    receipts,
    stored_lines,
    stored_samples,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODE = "dirty-node"
JOB = "dirty-job"
SMALL_LIMITS = Limits(max_batch_bytes=64 * 1024)


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the threaded ingest server needs PostgreSQL (see ingest/tests/conftest.py)")


@dataclass
class Run:
    """A `proof-agent run --config` process following tmp/logs/job.log and shipping to
    ingest, with a trace (`--out`) of everything it collected."""

    agent: AgentProcess
    tmp: Path
    before: dict[str, float]  # ingest's counters when it started

    @property
    def spool_dir(self) -> Path:
        return self.tmp / "spool"

    def write(self, data: bytes) -> None:
        """Append to the job log while the agent is stopped: the agent reads all of it in one
        interval (as a job that writes it at once), never a part."""
        with self.agent.paused(), open(self.tmp / "logs" / "job.log", "ab") as fh:
            fh.write(data)

    def finish(self, status: int = 0) -> tuple[ValidationReport, SpoolState]:
        """SIGTERM (the agent delivers what it spooled, then exits with `status`: 1 when
        ingest refused a batch); what it collected and its spool."""
        self.agent.stop()
        assert self.agent.wait(timeout=60) == status, self.agent.stderr
        report = validate_trace(self.tmp / "sent.jsonl")
        assert report.ok, report
        return report, read_spool(self.spool_dir)

    @property
    def agent_id(self) -> str:
        return (self.spool_dir / "agent_id").read_text().strip()


@contextmanager
def agent_run(ingest: Ingest, token: str, tmp: Path) -> Iterator[Run]:
    """The agent on this node (its host sources; no GPU: the samples are CPU, memory and
    disks) at a 0.1 s interval, after its first interval (the job log followed from there)."""
    config = node_config(tmp, ingest.address, token, agent={"node": NODE, "interval_s": 0.1})
    (tmp / "logs" / "job.log").write_bytes(b"")
    before = ingest_counts()
    argv = ["run", "--config", str(config), "--out", str(tmp / "sent.jsonl")]
    agent = AgentProcess(argv, tmp / "out")
    try:
        wait_for(lambda: read_spool(tmp / "spool").batches >= 1, what="the agent's first interval")
        yield Run(agent, tmp, before)
    finally:
        agent.kill()


def assert_stored_once(run: Run, operator: int, sent: ValidationReport, spool: SpoolState) -> None:
    """Every batch the agent spooled was acked and stored exactly once (ingest counted no
    duplicate: nothing was resent), nothing refused, every sample it collected stored."""
    assert spool.pending_batches == 0 and spool.dropped_batches == 0
    assert spool.acked_through == spool.batches
    assert receipts(operator) == [(run.agent_id, s) for s in range(1, spool.batches + 1)]
    counts = counts_since(run.before)
    assert counts == {
        "stored": spool.batches,
        "duplicate": 0,
        "refused": 0,
        "records_refused": 0,
        "store_errors": 0,
    }
    assert dead_letter(run.spool_dir) == []
    assert "reconnecting" not in run.agent.stderr
    assert stored_samples(operator) == sent.counts["sample"] > 0


def test_a_nul_in_a_tailed_job_log_is_stored_cleaned_and_sent_once(
    ingest: Ingest, tmp_path: Path
) -> None:
    operator, token = agent_token("dirty-nul")
    with agent_run(ingest, token, tmp_path) as run:
        for data in (
            b"step 1 loss 2.5\n",
            b"step 2 loss 2.4\n",
            b"x\n\x00\x00 corrupted\n",  # printf 'x\n\x00\x00 corrupted\n' >> job.log
            b"bad utf-8 \xff\xfe here\n",
            b"step 3 loss 2.3\n",
        ):
            run.write(data)
            time.sleep(0.2)
        sent, spool = run.finish()
    assert_stored_once(run, operator, sent, spool)
    assert stored_lines(operator) == [
        "step 1 loss 2.5",
        "step 2 loss 2.4",
        "x",
        "\ufffd\ufffd corrupted",
        "bad utf-8 \ufffd\ufffd here",
        "step 3 loss 2.3",
    ]
    assert sent.counts["log"] == 6


def test_a_26_kb_progress_line_keeps_every_sample_and_is_stored_cleaned(
    ingest: Ingest, tmp_path: Path
) -> None:
    operator, token = agent_token("dirty-long")
    # A tqdm bar redrawn with \r 700 times on one line (~28 KB), then the HF Trainer's dict.
    redraws = [
        f" {i * 100 // 600:3d}%|{'#' * (i // 60):10s}| {i}/600 [00:{i // 10:02d}<00:10]"
        for i in range(700)
    ]
    bar = ("\r".join(redraws) + "{'loss': '4.046', 'grad_norm': '0.92'}\n").encode()
    assert len(bar) > 26_000
    plain = b"A" * 26_498 + b"\n"  # one long line, no \r: truncated with a marker
    with agent_run(ingest, token, tmp_path) as run:
        for data in (bar, plain, b"after\n"):
            run.write(data)
            time.sleep(0.3)
        sent, spool = run.finish()
    assert_stored_once(run, operator, sent, spool)
    lines = stored_lines(operator)
    assert len(lines) == sent.counts["log"] == 3
    assert lines[0] == redraws[-1] + "{'loss': '4.046', 'grad_norm': '0.92'}"
    assert len(lines[1]) == limits.MAX_LOG_LINE_CHARS
    assert lines[1].startswith("AAAA") and lines[1].endswith(" chars]")
    assert f"…[truncated {26_498 - lines[1].index('…')} chars]" in lines[1]
    assert lines[2] == "after"


def test_one_bad_record_from_an_agent_that_does_not_clean_is_refused_alone(
    ingest: Ingest,
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
    too_long = {"kind": "series", "reason": "too_long"}
    before = counter("proof_ingest_record_rejects_total", too_long)
    sender = BatchSender(open_channel(ingest.address), token)
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
    assert counter("proof_ingest_record_rejects_total", too_long) == before + 1


def job_output(n_lines: int) -> bytes:
    return b"".join(b"line %06d %s\n" % (i, b"z" * 100) for i in range(n_lines))


def test_a_tick_of_more_output_than_a_batch_may_hold_is_split_not_refused(
    ingest: Ingest, tmp_path: Path
) -> None:
    """120 KB of job output in one interval, to a server that takes batches of 64 KiB (the
    agent learns it in Register): cut into batches under the limit, every line stored."""
    ingest.stop()
    ingest.start(SMALL_LIMITS)
    operator, token = agent_token("dirty-split")
    with agent_run(ingest, token, tmp_path) as run:
        run.write(job_output(1100))
        wait_for(lambda: len(stored_lines(operator)) == 1100, what="every line stored")
        sent, spool = run.finish()
    assert_stored_once(run, operator, sent, spool)
    intervals = re.search(r"agent stopped after (\d+) intervals", run.agent.stdout)
    assert intervals is not None, run.agent.stdout
    # One interval's lines (one time stamp) in 4 batches or more: more batches than intervals.
    with tenant_context(operator):
        stamps = LogLine.objects.for_tenant(operator).values_list("ts_us", flat=True)
        assert len(set(stamps)) == 1
    assert len(job_output(1100)) > 120_000
    assert spool.batches >= int(intervals[1]) + 3


def test_a_refused_batch_goes_to_the_dead_letter_and_the_agent_goes_on(
    ingest: Ingest, tmp_path: Path
) -> None:
    """An agent that started while ingest was down never heard its limit (64 KiB) and cuts
    batches as ingest's default allows (32 MiB): ingest refuses the 100 KB batch
    (INVALID_ARGUMENT, over 64 KiB), and gRPC itself the 200 KB one (RESOURCE_EXHAUSTED, over
    its 128 KiB message limit). Each is sent once, kept in the dead letter with its reason and
    reported to ingest as an event; the batches after them are stored."""
    operator, token = agent_token("dirty-dead")
    ingest.stop()
    with agent_run(ingest, token, tmp_path) as run:
        ingest.start(SMALL_LIMITS)
        # Each refusal is reported in the agent's next batch — the 1800 lines' batch, refused
        # too, when they come right after the first refusal: its report rides again after it.
        run.write(job_output(900))
        wait_for(lambda: len(dead_letter(run.spool_dir)) == 1, what="the first refusal")
        run.write(job_output(1800))
        wait_for(lambda: len(dead_letter(run.spool_dir)) == 2, what="the second refusal")
        run.write(b"later\n")
        with tenant_context(operator):
            refused = Event.objects.for_tenant(operator).filter(name=signals.EVENT_BATCH_REFUSED)
            wait_for(lambda: refused.count() == 2, what="both refusals reported to ingest")
        wait_for(lambda: stored_lines(operator) == ["later"], what="the agent went on")
        sent, spool = run.finish(status=1)
    assert "proof-agent run: ingest rejected 2 batch(es)" in run.agent.stderr
    first, second = dead_letter(run.spool_dir)
    assert "over the limit of 65536" in first["reason"]
    assert "message size limit" in second["reason"]
    dead = run.spool_dir / "dead-letter"
    assert (dead / first["batch_file"]).stat().st_size > 64 * 1024
    kept = [validate_trace(dead / entry["trace_file"]) for entry in (first, second)]
    assert all(report.ok for report in kept)
    assert [report.counts["log"] for report in kept] == [900, 1800]
    assert all(report.counts["sample"] > 0 for report in kept)
    refused_seqs = [first["sequence"], second["sequence"]]
    # The spool moved past them; everything else was stored, "later" included, each once.
    assert spool.pending_batches == 0 and spool.acked_through == spool.batches
    assert receipts(operator) == [
        (run.agent_id, s) for s in range(1, spool.batches + 1) if s not in refused_seqs
    ]
    assert stored_samples(operator) == sent.counts["sample"] - sum(
        report.counts["sample"] for report in kept
    )
    # No loop: ingest saw the first refused batch once (the second never got past gRPC); each
    # refusal ends the stream, so the batches in flight behind it are sent once more (ingest
    # answers DUPLICATE where it had them).
    counts = counts_since(run.before)
    assert counts["refused"] == 1 and counts["store_errors"] == 0
    assert counts["stored"] == spool.batches - 2
    assert counts["duplicate"] <= 2 * inspect.signature(BatchSender).parameters["window"].default
    with tenant_context(operator):
        events = sorted(refused.values_list("value", "text"))
    assert [v for v, _ in events] == [float(s) for s in refused_seqs]
    assert "over the limit" in events[0][1]


@contextmanager
def owner_ddl(setup: list[str], teardown: list[str]) -> Iterator[None]:
    """DDL as the schema owner on this test database (the app role may not alter tables)."""
    params = connections["owner"].get_connection_params()
    params["dbname"] = connection.settings_dict["NAME"]
    with psycopg.connect(**params, autocommit=True) as conn:
        try:
            for sql in setup:
                conn.execute(sql)
            yield
        finally:
            for sql in teardown:
                conn.execute(sql)


def test_a_batch_postgresql_refuses_is_dead_lettered_not_resent_in_a_loop(
    ingest: Ingest, tmp_path: Path
) -> None:
    """A batch that decodes but that the database refuses (here: a CHECK constraint on the log
    table, standing in for any value PostgreSQL will not store): refused once with
    INVALID_ARGUMENT, kept in the dead letter; the batches around it are stored."""
    operator, token = agent_token("dirty-pg")
    table = LogLine._meta.db_table
    check = "CHECK (line <> 'poison pill') NOT VALID"
    with (
        owner_ddl(
            [f"ALTER TABLE {table} ADD CONSTRAINT proof_test_poison {check}"],
            [f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS proof_test_poison"],
        ),
        agent_run(ingest, token, tmp_path) as run,
    ):
        run.write(b"poison pill\n")
        wait_for(lambda: len(dead_letter(run.spool_dir)) == 1, what="the refusal")
        run.write(b"fine\n")
        wait_for(lambda: stored_lines(operator) == ["fine"], what="the agent went on")
        sent, spool = run.finish(status=1)
    (entry,) = dead_letter(run.spool_dir)
    assert "the database refused its data" in entry["reason"]
    kept = validate_trace(run.spool_dir / "dead-letter" / entry["trace_file"])
    assert kept.ok and kept.counts["log"] == 1
    assert spool.pending_batches == 0 and spool.acked_through == spool.batches
    assert receipts(operator) == [
        (run.agent_id, s) for s in range(1, spool.batches + 1) if s != entry["sequence"]
    ]
    assert stored_samples(operator) == sent.counts["sample"] - kept.counts["sample"]
    # Tried once (one store error); the window after it was resent once when the stream ended.
    counts = counts_since(run.before)
    assert counts["store_errors"] == 1 and counts["refused"] == 1
    assert counts["stored"] == spool.batches - 1
    assert counts["duplicate"] <= inspect.signature(BatchSender).parameters["window"].default


def test_a_batch_that_keeps_failing_to_store_is_resent_with_a_growing_backoff(
    ingest: Ingest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A transient store failure of one batch (a lock timeout, the first 4 times: not a
    deadlock or serialization conflict, which ingest's writer retries by itself),
    while the batches after it are stored by the other writer: each reconnect waits longer —
    at least the lower half of the agent's base delay * 2^k before the k-th resend, as ingest
    sees the failures come in. Before, out-of-order acks reset the backoff and the batch was
    resent about every 0.3 s (39 sends in 30 s)."""
    operator, token = agent_token("dirty-flaky")
    table = LogLine._meta.db_table
    caplog.set_level(logging.ERROR, logger="ingest.server")
    with (
        owner_ddl(
            [
                "CREATE SEQUENCE IF NOT EXISTS proof_test_flaky_tries",
                "CREATE OR REPLACE FUNCTION proof_test_flaky() RETURNS trigger "
                "LANGUAGE plpgsql SECURITY DEFINER AS $$ BEGIN "
                "IF NEW.line = 'flaky' AND nextval('proof_test_flaky_tries') <= 4 THEN "
                "RAISE EXCEPTION 'test: lock not available' USING ERRCODE = '55P03'; END IF; "
                "RETURN NEW; END $$",
                f"CREATE TRIGGER proof_test_flaky BEFORE INSERT ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION proof_test_flaky()",
            ],
            [
                f"DROP TRIGGER IF EXISTS proof_test_flaky ON {table}",
                "DROP FUNCTION IF EXISTS proof_test_flaky()",
                "DROP SEQUENCE IF EXISTS proof_test_flaky_tries",
            ],
        ),
        agent_run(ingest, token, tmp_path) as run,
    ):
        run.write(b"flaky\n")
        wait_for(lambda: stored_lines(operator) == ["flaky"], timeout=60, what="stored at last")
        sent, spool = run.finish()
    failures = [
        (int(m[1]), r.created)
        for r in caplog.records
        if (m := re.match(r"storing batch (\d+) of .* failed", r.getMessage()))
    ]
    assert len(failures) == 4 and len({seq for seq, _ in failures}) == 1
    seq = failures[0][0]
    with tenant_context(operator):
        receipt = BatchReceipt.objects.for_tenant(operator).get(sequence=seq)
    times = [t for _, t in failures] + [receipt.received_at.timestamp()]
    base = inspect.signature(BatchSender).parameters["retry_delay"].default
    for k, (a, b) in enumerate(itertools.pairwise(times)):
        assert b - a >= base * 2**k / 2, (k, times)  # jittered over the upper half of base*2^k
    assert run.agent.stderr.count("reconnecting") == 4
    counts = counts_since(run.before)
    assert counts["store_errors"] == 4 and counts["refused"] == 0
    assert counts["stored"] == spool.batches
    assert receipts(operator) == [(run.agent_id, s) for s in range(1, spool.batches + 1)]
    assert stored_samples(operator) == sent.counts["sample"]
