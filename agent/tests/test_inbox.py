"""The exec inbox: records written by a real `proof-agent exec` reach the agent's collector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent.collectors.inbox import InboxCollector

ROOT = Path(__file__).resolve().parents[2]


def test_exec_inbox_round_trip(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "88", "RANK": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from agent.cli import main; sys.exit(main())",
            "exec",
            "--inbox",
            str(inbox),
            "--",
            sys.executable,
            "-c",
            "print('a'); print('b'); raise SystemExit(2)",
        ],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    col = InboxCollector(inbox)
    records = col.collect(100.0)
    assert [r["type"] for r in records] == ["process", "log", "log", "exit"]
    assert [r["line"] for r in records if r["type"] == "log"] == ["a", "b"]
    assert all(r["job"] == "88" and r["rank"] == 1 for r in records)
    assert records[-1]["exit_code"] == 2
    assert list(inbox.iterdir()) == []  # finished file removed
    assert col.collect(101.0) == []


def test_partial_lines_wait_and_bad_lines_are_skipped(tmp_path: Path) -> None:
    f = tmp_path / "exec-n-1-1.jsonl"
    meta = json.dumps({"type": "meta", "format": "proof-trace", "version": 1})
    line = json.dumps({"type": "log", "ts": 1.0, "line": "hello", "node": "n", "pid": 5})
    f.write_text(meta + "\n" + "not json\n" + '{"type": "log", "ts": 1.0}\n' + line[:10])
    col = InboxCollector(tmp_path)
    assert col.collect(1.0) == []
    assert col.invalid_lines == 2
    with f.open("a") as fh:
        fh.write(line[10:] + "\n")
    assert [r["line"] for r in col.collect(2.0)] == ["hello"]
    assert f.exists()  # no exit record yet: kept


def test_stale_file_without_exit_is_removed(tmp_path: Path) -> None:
    f = tmp_path / "exec-n-1-1.jsonl"
    f.write_text(json.dumps({"type": "log", "ts": 1.0, "line": "x"}) + "\n")
    col = InboxCollector(tmp_path, stale_after_s=60, wall_clock=lambda: f.stat().st_mtime + 61)
    assert len(col.collect(1.0)) == 1
    assert not f.exists()
