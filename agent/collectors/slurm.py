"""Slurm job metadata: `scontrol show job` and `sacct --parsable2` output → trace `job` records.

The command runner is a constructor argument (`run(argv) -> stdout`), so tests feed real
captured output (`agent/tests/data/slurm/`) and a node without Slurm simply has no
`scontrol` on its PATH: `SlurmJobs.available` is False and nothing is asked.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Runner = Callable[[list[str]], str]

# Slurm job states → the `state` words of docs/design.md §5; the raw state is kept in
# config["slurm_state"].
_STATE = {
    "RUNNING": "running",
    "COMPLETING": "running",
    "CONFIGURING": "running",
    "SUSPENDED": "running",
    "PENDING": "pending",
    "REQUEUED": "pending",
    "COMPLETED": "completed",
    "CANCELLED": "cancelled",
    "PREEMPTED": "cancelled",
    "DEADLINE": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
}
# A key at the start of the line or after whitespace: `Key=`, keys may hold ':' '/' '.'
# (`AllocNode:Sid=`, `Socks/Node=`); values may contain '=' (`ReqTRES=cpu=28,...`) and, rarely,
# spaces, so a value runs to the next such key.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")


def parse_scontrol_fields(text: str) -> list[dict[str, str]]:
    """`scontrol show job` output (one-line `-o` form or the multi-line form, one or several
    jobs) → one dict of raw `Key: value` per job. A new job starts at `JobId=` or after a
    blank line."""
    jobs: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            if current:
                jobs.append(current)
                current = {}
            continue
        matches = list(_KEY.finditer(line))
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
            key, value = m.group(1), line[m.end() : end].strip()
            if key == "JobId" and "JobId" in current:
                jobs.append(current)
                current = {}
            current[key] = value
    if current:
        jobs.append(current)
    return jobs


def parse_exit_code(value: str | None) -> tuple[int | None, int | None]:
    """Slurm `ExitCode=code:signal` → (code, signal); (None, None) when absent/unparsable."""
    if not value:
        return None, None
    m = re.fullmatch(r"(\d+):(\d+)", value.strip())
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2))


def gpus_in_tres(tres: str | None) -> int | None:
    """The GPU count in a TRES string (`…,gres/gpu=8,gres/gpu:h100=8` → 8)."""
    if not tres:
        return None
    for part in tres.split(","):
        key, _, value = part.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return None


def _state(raw: str | None) -> str | None:
    if not raw:
        return None
    word = raw.split()[0].rstrip("+")  # "CANCELLED by 1234", "CANCELLED+"
    return _STATE.get(word, word.lower())


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _exit_code(code: int | None, signal: int | None) -> int | None:
    if code is None:
        return None
    # A job killed by a signal has code 0 and the signal number; report it the shell's way.
    return 128 + signal if signal else code


def scontrol_job_record(
    fields: dict[str, str], now: float, *, job_id: str | None = None
) -> dict[str, Any] | None:
    """A trace `job` record from one `scontrol show job` entry. `job_id` is used when the
    entry itself has no `JobId` (e.g. redacted captures); None when no id is known at all."""
    job = fields.get("JobId") or job_id
    if not job:
        return None
    code, signal = parse_exit_code(fields.get("ExitCode"))
    config: dict[str, Any] = {"slurm_state": fields.get("JobState")}
    for key, name in (
        ("Partition", "partition"),
        ("Account", "account"),
        ("UserId", "user"),
        ("StdOut", "stdout"),
        ("StdErr", "stderr"),
        ("WorkDir", "workdir"),
        ("Command", "command"),
        ("AllocTRES", "alloc_tres"),
        ("StartTime", "start_time"),
        ("EndTime", "end_time"),
        ("NodeList", "node_list"),
    ):
        if fields.get(key) not in (None, "", "(null)"):
            config[name] = fields[key]
    return _job_record(
        str(job),
        now,
        state=_state(fields.get("JobState")),
        config=config,
        alloc_tres=fields.get("AllocTRES"),
        name=fields.get("JobName"),
        nodes=_int(fields.get("NumNodes")),
        world_size=_int(fields.get("NumTasks")),
        exit_code=_exit_code(code, signal),
    )


def _job_record(
    job: str,
    now: float,
    *,
    state: str | None,
    config: dict[str, Any],
    alloc_tres: str | None,
    name: str | None,
    nodes: int | None,
    world_size: int | None,
    exit_code: int | None,
) -> dict[str, Any]:
    """The trace `job` record both Slurm sources build; empty parts are left out."""
    gpus = gpus_in_tres(alloc_tres)
    if gpus is not None:
        config["gpus"] = gpus
    rec: dict[str, Any] = {
        "type": "job",
        "ts": now,
        "job": job,
        "scheduler": "slurm",
        "state": state,
        "config": {k: v for k, v in config.items() if v is not None},
        "name": name or None,
        "nodes": nodes,
        "world_size": world_size,
    }
    # A running job's exit code is a placeholder (0:0), not an outcome.
    if state not in ("running", "pending"):
        rec["exit_code"] = exit_code
    return {k: v for k, v in rec.items() if v is not None}


def parse_sacct_parsable(text: str) -> list[dict[str, str]]:
    """`sacct --parsable2` output (a header line, then `|`-separated rows) → one dict per row.
    A row whose field count differs from the header is skipped with a warning naming it."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    rows: list[dict[str, str]] = []
    for number, line in enumerate(lines[1:], start=2):
        cells = line.split("|")
        if len(cells) != len(header):
            log.warning(
                "sacct line %d has %d fields, header has %d: %r",
                number,
                len(cells),
                len(header),
                line[:200],
            )
            continue
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def sacct_job_records(rows: list[dict[str, str]], now: float) -> list[dict[str, Any]]:
    """`job` records for the job allocations in sacct rows (steps like `11.batch`, `11.0` are
    folded away: the allocation row carries the job's state and exit code)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        job = row.get("JobID", "")
        if not job or "." in job:
            continue
        code, signal = parse_exit_code(row.get("ExitCode"))
        state = _state(row.get("State"))
        config: dict[str, Any] = {"slurm_state": row.get("State")}
        for key, name in (
            ("Account", "account"),
            ("User", "user"),
            ("Partition", "partition"),
            ("AllocTRES", "alloc_tres"),
            ("Elapsed", "elapsed"),
            ("ElapsedRaw", "elapsed_s"),
        ):
            if row.get(key):
                config[name] = row[key]
        out.append(
            _job_record(
                job,
                now,
                state=state,
                config=config,
                alloc_tres=row.get("AllocTRES"),
                name=row.get("JobName"),
                nodes=_int(row.get("NNodes")),
                world_size=None,
                exit_code=_exit_code(code, signal),
            )
        )
    return out


def run_command(argv: list[str], timeout: float = 10.0) -> str:
    """The production runner: stdout of the command; raises on a missing command, a timeout
    or a non-zero exit (with the command's stderr in the message)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603 - argv is ours: scontrol/sacct with fixed flags and a job id as one argument, no shell
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


SACCT_FORMAT = "JobID,JobName,User,Account,Partition,State,ExitCode,Elapsed,NNodes,AllocTRES"


class SlurmJobs:
    """Asks Slurm about the jobs the identity collector sees. Every failure is logged once per
    kind and answered with None; the agent never depends on Slurm answering."""

    def __init__(
        self,
        runner: Runner = run_command,
        *,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.runner = runner
        self.has_scontrol = which("scontrol") is not None
        self.has_sacct = which("sacct") is not None
        self._warned: set[str] = set()

    @property
    def available(self) -> bool:
        return self.has_scontrol or self.has_sacct

    def job_record(self, job_id: str, now: float) -> dict[str, Any] | None:
        """The job's current record: `scontrol` (running and recent jobs), else `sacct`."""
        if self.has_scontrol:
            try:
                text = self.runner(["scontrol", "show", "job", "-o", job_id])
                for fields in parse_scontrol_fields(text):
                    if fields.get("JobId", job_id) == job_id:
                        rec = scontrol_job_record(fields, now, job_id=job_id)
                        if rec is not None:
                            return rec
            except Exception as exc:  # scontrol forgets finished jobs: fall through to sacct
                self._warn("scontrol", f"scontrol show job {job_id}: {exc}")
        if self.has_sacct:
            try:
                text = self.runner(
                    ["sacct", "--parsable2", "--allocations", "-j", job_id, "-o", SACCT_FORMAT]
                )
                for rec in sacct_job_records(parse_sacct_parsable(text), now):
                    if rec["job"] == job_id:
                        return rec
            except Exception as exc:
                self._warn("sacct", f"sacct -j {job_id}: {exc}")
        return None

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s (further %s failures are not logged)", message, kind)
