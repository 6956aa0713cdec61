"""A run without a scheduler, recorded by the real `proof-agent exec` around a launcher that
starts two ranks, replayed through the real client and ingest server into the real database:
ingest stores it as one job (exec's id, its state, exit code, kind and world size) with both
ranks — the live path agrees with `proof analyze`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.wire.client import BatchSender, open_channel
from contract.wire.replay import replay
from ingest import services
from ingest.models import Job, JobRank, Process
from ingest.server import IngestServer
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[1]

LAUNCHER = r"""
import os, subprocess, sys
rank_code = (
    "import os, time\n"
    "time.sleep(1.5)\n"
    "if os.environ['RANK'] == '0':\n"
    "    for i in (1, 2, 3):\n"
    "        print(f'iter {i}: loss {4.0 - i:.4f}, time 100.00ms, mfu 10.00%', flush=True)\n"
)
kids = [
    subprocess.Popen(
        [sys.executable, "-c", rank_code],
        env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"},
    )
    for r in (0, 1)
]
sys.exit(max(k.wait() for k in kids))
"""


def test_exec_job_without_a_scheduler_reaches_ingest_as_one_job(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_"))
        and not k.startswith("PROOF_JOB")
    }
    env["PYTHONPATH"] = str(ROOT)
    trace = tmp_path / "run.jsonl"
    agent = [sys.executable, "-c", "import sys; from agent.cli import main; sys.exit(main())"]
    proc = subprocess.run(
        [*agent, "exec", "--out", str(trace), "--", sys.executable, "-c", LAUNCHER],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(trace.read_text().splitlines()[0])["job"]
    assert job_id.startswith("exec-")

    services.clear_caches()
    tenant = make_tenant("exec-live")
    _, token = tenant_services.do_create_agent_token(tenant.operator.pk, name="exec")
    server = IngestServer("127.0.0.1", 0, writers=1)
    port = server.start()
    try:
        sender = BatchSender(open_channel(f"127.0.0.1:{port}"), token)
        report = replay(str(trace), sender, agent_id="exec-live", batch_seconds=15)
        sender.close()
    finally:
        server.stop(grace=1)
    assert report.rejected == []

    op = tenant.operator.pk
    with tenant_context(op):
        (job,) = Job.objects.for_tenant(op).all()
        assert job.job_id == job_id
        assert (job.scheduler, job.state, job.exit_code) == ("proof-exec", "completed", 0)
        assert (job.kind, job.world_size) == ("training", 2)
        assert job.ended_at is not None
        ranks = JobRank.objects.for_tenant(op).filter(job=job).order_by("rank")
        assert [(r.rank, r.local_rank) for r in ranks] == [(0, 0), (1, 1)]
        # the launcher and its two ranks, all of this job
        assert Process.objects.for_tenant(op).filter(job=job).count() == 3
