"""Slurm output parsers on real captured `scontrol show job` and `sacct --parsable2` output."""

from __future__ import annotations

from pathlib import Path

from agent.collectors.slurm import (
    gpus_in_tres,
    parse_exit_code,
    parse_sacct_parsable,
    parse_scontrol_fields,
    sacct_job_records,
    scontrol_job_record,
)
from contract.trace.records import check_record

DATA = Path(__file__).parent / "data" / "slurm"


def test_scontrol_multiline_real_output() -> None:
    jobs = parse_scontrol_fields((DATA / "scontrol_show_job_8xH100_gaia_redacted.txt").read_text())
    assert len(jobs) == 1
    f = jobs[0]
    assert f["JobState"] == "RUNNING"
    assert f["AllocNode:Sid"] == "0.0.0.0:1421319"  # key with ':'
    assert f["Socks/Node"] == "*"  # key with '/'
    assert f["ReqTRES"] == "cpu=28,mem=245056M,node=1,billing=80,gres/gpu=8"  # '=' in value
    assert f["Scheduler"] == "Main[6/259]"
    # the capture is redacted (no JobId line): no record unless the caller knows the id
    assert scontrol_job_record(f, 1.0) is None
    rec = scontrol_job_record(f, 1.0, job_id="555")
    assert rec is not None and check_record(rec) is None
    assert rec["state"] == "running" and "exit_code" not in rec  # running: no exit code yet
    assert rec["config"]["node_list"] == "comp-h100-1"


def test_scontrol_one_line_form_several_jobs_and_spaces_in_values() -> None:
    text = (
        "JobId=17 JobName=pretrain llama UserId=bob(1001) JobState=FAILED ExitCode=1:0 "
        "NumNodes=4 NumTasks=32 StdOut=/home/bob/logs/out 17.txt\n"
        "JobId=18 JobName=eval JobState=CANCELLED ExitCode=0:9 NumNodes=1\n"
    )
    jobs = parse_scontrol_fields(text)
    assert [j["JobId"] for j in jobs] == ["17", "18"]
    assert jobs[0]["JobName"] == "pretrain llama"
    assert jobs[0]["StdOut"] == "/home/bob/logs/out 17.txt"
    r17 = scontrol_job_record(jobs[0], 2.0)
    r18 = scontrol_job_record(jobs[1], 2.0)
    assert r17 is not None and r18 is not None
    assert (r17["state"], r17["exit_code"], r17["nodes"], r17["world_size"]) == (
        "failed",
        1,
        4,
        32,
    )
    assert r17["config"]["stdout"] == "/home/bob/logs/out 17.txt"
    assert (r18["state"], r18["exit_code"]) == ("cancelled", 128 + 9)


def test_sacct_steps_folded_into_allocation() -> None:
    rows = parse_sacct_parsable((DATA / "sacct_parsable_gpu_job_with_steps_mi300x.txt").read_text())
    assert len(rows) == 4
    recs = sacct_job_records(rows, 3.0)
    assert len(recs) == 1
    r = recs[0]
    assert check_record(r) is None
    assert (r["job"], r["name"], r["state"], r["exit_code"]) == (
        "11",
        "rccl-mi300x-slurm",
        "completed",
        0,
    )
    assert r["config"]["user"] == "alice" and r["config"]["gpus"] == 16


def test_sacct_other_columns() -> None:
    recs = sacct_job_records(
        parse_sacct_parsable((DATA / "sacct_parsable_gpu_jobs_mn5.txt").read_text()), 3.0
    )
    assert [(r["job"], r["state"], r["nodes"]) for r in recs] == [
        ("45969297", "completed", 2),
        ("46050285", "completed", 2),
        ("45985946", "failed", 2),
    ]
    assert recs[0]["config"]["elapsed_s"] == "8624"


def test_sacct_malformed_row_is_skipped_not_fatal() -> None:
    rows = parse_sacct_parsable(
        "JobID|State|ExitCode\n1|COMPLETED|0:0\n2|FAILED\n3|CANCELLED by 42|0:15\n"
    )
    assert [r["JobID"] for r in rows] == ["1", "3"]
    recs = sacct_job_records(rows, 1.0)
    assert recs[1]["state"] == "cancelled" and recs[1]["exit_code"] == 128 + 15


def test_small_helpers() -> None:
    assert parse_exit_code("0:0") == (0, 0)
    assert parse_exit_code("garbage") == (None, None)
    assert gpus_in_tres("cpu=224,gres/gpu=8,gres/gpu:h100=8") == 8
    assert gpus_in_tres("cpu=4") is None
