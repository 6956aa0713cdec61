"""A run without a scheduler, recorded by the real `proof-agent exec` around a launcher (a shell
job script) that starts two ranks, replayed through the real client and ingest server into the
real database: ingest stores it as one job (exec's id, its state, exit code, kind and world
size) with both ranks — the live path agrees with `proof analyze`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.models import Job, JobRank, Process
from tenants.context import tenant_context
from tests.agentproc import agent_command
from tests.helpers import Ingest, agent_token

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[1]

RANK = """
import os, time
time.sleep(1.5)
if os.environ["RANK"] == "0":
    for i in (1, 2, 3):
        print(f"iter {i}: loss {4.0 - i:.4f}, time 100.00ms, mfu 10.00%", flush=True)
"""
# `sh -c LAUNCHER PYTHON RANK`: two ranks of a world of 2, as a job script starts them.
LAUNCHER = 'for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 "$0" -c "$1" & done; wait'


def test_exec_job_without_a_scheduler_reaches_ingest_as_one_job(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_"))
        and not k.startswith("PROOF_JOB")
    }
    env["PYTHONPATH"] = str(ROOT)
    trace = tmp_path / "run.jsonl"
    proc = subprocess.run(
        [
            *agent_command(),
            "exec",
            "--out",
            str(trace),
            "--",
            "sh",
            "-c",
            LAUNCHER,
            sys.executable,
            RANK,
        ],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(trace.read_text().splitlines()[0])["job"]
    assert job_id.startswith("exec-")

    op, token = agent_token("exec-live")
    ingest = Ingest(writers=1)
    try:
        report = ingest.replay(trace, token, agent_id="exec-live", batch_seconds=15)
    finally:
        ingest.stop()
    assert report.rejected == []

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
