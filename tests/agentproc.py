"""The node agent as the end-to-end tests drive it: a real `proof-agent` process, configured
by a config file, flags and environment as an operator does (docs/agent.md), never imported.

What the tests read back is what an operator can see: the exit status, stdout/stderr, and the
agent's files — the spool (agent/spool.py documents its on-disk layout: segments of framed
batches and `state.json`), the dead letter (`<seq>.json` + `.batch` + `.jsonl`) and traces.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The frame header of a spool segment (agent/spool.py): magic, crc32, seq, payload length.
_FRAME = struct.Struct("<4sIQI")
_MAGIC = b"PSB1"


def agent_command() -> list[str]:
    """`proof-agent` of this interpreter's environment (the console script pip installs), else
    the same entry point through `python -m agent.cli`."""
    script = Path(sys.executable).with_name("proof-agent")
    if script.exists():
        return [str(script)]
    found = shutil.which("proof-agent")
    return [found] if found else [sys.executable, "-m", "agent.cli"]


def agent_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an agent process: no Django settings, nothing of the test's own
    `PROOF_AGENT_*` (each test says what it configures), unbuffered output."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PROOF_AGENT_") and k != "DJANGO_SETTINGS_MODULE"
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_agent(
    args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`proof-agent ARGS…` to completion; stdout/stderr captured as text."""
    return run_python(args, env=env, timeout=timeout, command=agent_command())


def run_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    command: Sequence[str] = (sys.executable,),
) -> subprocess.CompletedProcess[str]:
    """`python ARGS…` (this interpreter) to completion in the agent's environment (no Django
    settings), from the repository root; stdout/stderr captured as text."""
    return subprocess.run(
        [*command, *args],
        cwd=REPO,
        env=agent_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class AgentProcess:
    """`proof-agent ARGS…` in the background, its output in files (no pipe to fill up)."""

    def __init__(
        self, args: Sequence[str], logs: Path, *, env: Mapping[str, str] | None = None
    ) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path = logs / "agent.stdout"
        self.err_path = logs / "agent.stderr"
        self._out = open(self.out_path, "w")  # noqa: SIM115 - closed in wait()
        self._err = open(self.err_path, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [*agent_command(), *args],
            cwd=REPO,
            env=agent_env(env),
            stdout=self._out,
            stderr=self._err,
            text=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._out.close()
            self._err.close()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The agent stopped (SIGSTOP, every thread) while the body runs: what the body writes
        to a file the agent follows is all there at its next read, one interval's output."""
        self.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(self._stopped, timeout=10, what="the agent stopped")
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def _stopped(self) -> bool:
        for stat in Path(f"/proc/{self.proc.pid}/task").glob("*/stat"):
            try:
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
                continue
            if state not in ("T", "t"):
                return False
        return True

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.wait(timeout=30)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()


def node_config(tmp: Path, address: str, token: str, **over: dict[str, Any]) -> Path:
    """tmp/agent.toml for the node backend on this machine, with the sources that need
    hardware off, following tmp/logs/*.log, spooling in tmp/spool; its [server] is `address`
    (plaintext, the token in tmp/token). `over`: {section: {key: value}} on top."""
    (tmp / "token").write_text(token + "\n")
    (tmp / "kmsg").write_text("")
    (tmp / "sys").mkdir(exist_ok=True)
    (tmp / "logs").mkdir(exist_ok=True)
    sections: dict[str, dict[str, Any]] = {
        "agent": {"node": "durable-node", "interval_s": 0.2},
        "server": {"address": address, "tls": False, "token_file": str(tmp / "token")},
        "spool": {"dir": str(tmp / "spool")},
        "paths": {"sys_root": str(tmp / "sys"), "kmsg": str(tmp / "kmsg")},
        "nvml": {"enabled": False},
        "dcgm": {"mode": "off"},
        "ebpf": {"enabled": False},
        "inference": {"discover": False},
        "slurm": {"enabled": False},
        "logs": {"globs": [str(tmp / "logs" / "*.log")], "slurm_output": False},
    }
    for name, body in over.items():
        sections.setdefault(name, {}).update(body)
    path = tmp / "agent.toml"
    path.write_text(toml(sections))
    return path


def toml(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """An agent config file from {section: {key: value}} (strings, numbers, booleans, lists)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(str(v))  # a TOML basic string

    lines: list[str] = []
    for name, body in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {value(v)}" for key, v in body.items()]
    return "\n".join(lines) + "\n"


@dataclass
class SpoolState:
    """The agent's spool as it is on disk (`<spool dir>/batches`)."""

    pending: list[int] = field(default_factory=list)  # sequences on disk, not acked
    next_seq: int = 1
    # state.json's counters
    acked_through: int = 0
    dropped_through: int = 0
    dropped_batches: int = 0
    dropped_bytes: int = 0

    @property
    def batches(self) -> int:
        """Batches the agent ever spooled (sequence numbers never repeat)."""
        return self.next_seq - 1

    @property
    def pending_batches(self) -> int:
        return len(self.pending)


def read_spool(spool_dir: Path) -> SpoolState:
    """Read the spool's `state.json` and its segments' frames as agent/spool.py lays them out
    (a frame cut short by a write in progress ends the scan of its segment)."""
    directory = spool_dir / "batches"
    state = SpoolState()
    path = directory / "state.json"
    if path.exists():
        raw = json.loads(path.read_text())
        for key in ("acked_through", "dropped_through", "dropped_batches", "dropped_bytes"):
            setattr(state, key, int(raw.get(key, 0)))
        state.next_seq = int(raw.get("next_seq", 1))
    done = max(state.acked_through, state.dropped_through)
    state.next_seq = max(state.next_seq, done + 1)
    for segment in sorted(directory.glob("*.seg")):
        try:
            data = segment.read_bytes()
        except FileNotFoundError:  # acked (or dropped) and deleted by the running agent
            continue
        offset = 0
        while len(data) - offset >= _FRAME.size:
            magic, _crc, seq, length = _FRAME.unpack_from(data, offset)
            start = offset + _FRAME.size
            if magic != _MAGIC or start + length > len(data):
                break
            if seq > done:
                state.pending.append(seq)
            state.next_seq = max(state.next_seq, seq + 1)
            offset = start + length
    return state


def dead_letter(spool_dir: Path) -> list[dict[str, Any]]:
    """The dead letter's entries (`<spool dir>/dead-letter/<seq>.json`), oldest first."""
    directory = spool_dir / "dead-letter"
    return [
        json.loads(p.read_text())
        for p in sorted(directory.glob("*.json"))
        if p.name != "state.json"
    ]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out{': ' + what if what else ''}"
        time.sleep(0.05)
