"""`proof-agent exec -- CMD …`: run a job command, tee its output, record it as a trace.

    srun proof-agent exec -- python train.py --config c.yaml
    torchrun --nproc-per-node 8 --no-python proof-agent exec -- python train.py

The command's stdout and stderr reach the terminal (or srun's output files) byte for byte, as
they are written — progress bars without newlines included. Each line is also recorded as a
`log` record (`stream` stdout/stderr) keyed with the identity of the job this process belongs
to, read from its own environment (it inherits what `srun`/`torchrun`/`mpirun` set:
SLURM_JOB_ID, RANK, LOCAL_RANK, …), with the training step and parsed fields when the line is
a training-progress line. A `process` record is written when the command starts and an `exit`
record with its exit code when it ends.

Where the records go:
- `--out FILE` — a trace file (`.jsonl` or `.jsonl.gz`);
- `--inbox DIR` — the local agent's inbox (default /var/lib/proof-agent/inbox when that
  directory exists and is writable): a trace file there is tailed by the running agent
  (`agent.collectors.inbox`) and shipped with everything else, then deleted;
- neither available — only tee (a warning says so).

Exit status: the command's own. A command killed by a signal makes `exec` kill itself with
the same signal (so `srun`/`torchrun` see what they would have seen); the `exit` record then
has exit_code 128+signal and `labels.signal`. SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 and SIGQUIT
sent to `exec` are forwarded to the command; SIGINT too, except when stdin is a terminal
(Ctrl-C already reaches the command through the terminal's process group).

Python commands get PYTHONUNBUFFERED=1 (unless set, or --keep-buffering) so their lines are
not held back in a pipe buffer.

Every run is a job. The job id comes from the environment as the node agent's identity
collector derives it (agent/collectors/identity.py; docs/agent.md "Job ids"): Slurm's, a
torchrun run's, a pod's — or, with none of those, exec's own, `exec-<node>-<pid>-<start>-<boot>`
(this process's pid and start time in clock ticks, the kernel boot id), with `job` records for
its start and its end (state and exit code). The command gets `PROOF_JOB_ID` and
`PROOF_JOB_SCHEDULER` in its environment, so everything under it — torchrun's workers included —
is the same job to the node agent. A command that is a single process is rank 0 of 1; a launcher
(torchrun, mpirun, deepspeed, …, or anything that turns out to start processes with ranks of
their own) has its ranks found under it in /proc and recorded as `process` records (pid, rank,
local rank, world size) and `exit`/`process_gone` when they end.

`--out` may name `{rank}`, `{local_rank}`, `{node}`, `{pid}` and `{job}`; a rank of a world
larger than one that names no `{rank}` writes `NAME.rank<N>.jsonl` instead of NAME.jsonl, so
the ranks of `torchrun --no-python proof-agent exec --out run.jsonl -- …` do not write over each
other (`proof analyze run.rank*.jsonl` reads them together).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from agent.collectors.identity import (
    ENV_JOB_ID,
    ENV_JOB_SCHEDULER,
    RANK_VARS,
    SCHEDULER_EXEC,
    IdentityCollector,
    ProcessIdentity,
    _first_int,
    identity_from_own_environment,
    parse_environ,
    read_stat,
)
from agent.runtime.sinks import TraceSink
from contract import signals as names
from contract.identity import inference_server
from contract.limits import clean_line, decode_output
from contract.parsers.training import LogParser, strip_prefix

log = logging.getLogger(__name__)

DEFAULT_INBOX = "/var/lib/proof-agent/inbox"
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
    signal.SIGINT,
)
MAX_LINE = 64 * 1024  # a "line" without a newline past this is recorded in pieces
READ_SIZE = 64 * 1024
Record = dict[str, Any]
_NOTHING = object()
# Commands that start the job's ranks rather than being one (their output is the ranks', unranked).
LAUNCHERS = frozenset(
    ("torchrun", "mpirun", "mpiexec", "deepspeed", "accelerate", "horovodrun", "srun", "prterun")
)
LAUNCHER_MODULES = frozenset(
    ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.runner")
)
RANK_SCAN_FAST_S = 1.0  # how often to look for ranks under a launcher, for the first minute
RANK_SCAN_SLOW_S = 5.0  # and after it (elastic restarts start new ranks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="write the records to this trace file")
    parser.add_argument(
        "--inbox",
        default=None,
        help=f"the local agent's inbox directory (default {DEFAULT_INBOX} when it exists)",
    )
    parser.add_argument("--node", default=None, help="node name (default: hostname)")
    parser.add_argument(
        "--keep-buffering",
        action="store_true",
        help="do not set PYTHONUNBUFFERED=1 for the command",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS…]")


def is_launcher(command: list[str]) -> bool:
    """Whether `command` starts ranks (torchrun, mpirun, `python -m torch.distributed.run`, …)."""
    if not command:
        return False
    name = os.path.basename(command[0])
    if name in LAUNCHERS:
        return True
    if name.startswith("python") and "-m" in command[:-1]:
        return command[command.index("-m") + 1] in LAUNCHER_MODULES
    return False


def out_path(template: str, ident: ProcessIdentity, node: str) -> str:
    """`--out` with its placeholders filled; a rank of a world larger than one gets its own
    file even when the template does not say so."""
    values = {
        "rank": "" if ident.rank is None else str(ident.rank),
        "local_rank": "" if ident.local_rank is None else str(ident.local_rank),
        "node": node,
        "pid": str(os.getpid()),
        "job": (ident.job or "").replace(os.sep, "_"),
    }
    path = template
    for key, value in values.items():
        path = path.replace("{" + key + "}", value)
    if "{rank}" not in template and ident.rank is not None and (ident.world_size or 1) > 1:
        head, tail = os.path.split(path)
        stem, dot, ext = tail.partition(".")
        path = os.path.join(head, f"{stem}.rank{ident.rank}{dot}{ext}")
    return path


def _open_sink(args: argparse.Namespace, node: str, meta: dict[str, Any], out: str | None) -> Any:
    if out:
        return TraceSink(out, meta)
    inbox = args.inbox
    if inbox is None and os.path.isdir(DEFAULT_INBOX) and os.access(DEFAULT_INBOX, os.W_OK):
        inbox = DEFAULT_INBOX
    if inbox is None:
        print(
            f"proof-agent exec: no --out and no agent inbox at {DEFAULT_INBOX}: "
            "output is passed through but not recorded",
            file=sys.stderr,
        )
        return None
    Path(inbox).mkdir(parents=True, exist_ok=True)
    name = f"exec-{node}-{os.getpid()}-{int(time.time())}.jsonl"
    return TraceSink(Path(inbox) / name, meta)


def _pump(
    fd: int, sink_fh: IO[bytes], stream: str, q: queue.Queue[tuple[float, str, bytes] | None]
) -> None:
    """Copy bytes from the command to our own stream as they come; queue complete lines."""
    pending = b""
    try:
        while True:
            try:
                chunk = os.read(fd, READ_SIZE)
            except InterruptedError:
                continue
            if not chunk:
                break
            try:
                sink_fh.write(chunk)
                sink_fh.flush()
            except (BrokenPipeError, ValueError):
                pass  # our terminal went away: keep recording, the command keeps running
            pending += chunk
            now = time.time()
            while True:
                nl = pending.find(b"\n")
                if nl < 0:
                    break
                q.put((now, stream, pending[:nl]))
                pending = pending[nl + 1 :]
            while len(pending) > MAX_LINE:
                q.put((now, stream, pending[:MAX_LINE]))
                pending = pending[MAX_LINE:]
        if pending:
            q.put((time.time(), stream, pending))
    finally:
        os.close(fd)
        q.put(None)


class _Recorder:
    """Turns lines into log records keyed with the job's identity, with training fields."""

    def __init__(self, base: Record) -> None:
        self.base = base
        self.parsers: dict[str, LogParser] = {}
        self.first_progress_ts: float | None = None  # a training-progress line: kind training
        self.kind_written = False

    def _prefix_rank(self, line: str) -> int | None:
        return strip_prefix(line)[1] if line.startswith("[") else None

    def log_record(self, ts: float, stream: str, raw: bytes) -> Record:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        line = clean_line(decode_output(raw))  # NUL, bad UTF-8, long lines: contract/limits.py
        rec: Record = {"type": "log", "ts": ts, "line": line, "stream": stream, **self.base}
        parser = self.parsers.get(stream)
        if parser is None:
            parser = self.parsers[stream] = LogParser()
        parsed = parser.feed(line)
        if parsed is not None:
            rec["parsed"] = parsed.to_dict()
            if parsed.step is not None:
                rec[names.STEP] = parsed.step
                if self.first_progress_ts is None and parsed.loss is not None:
                    self.first_progress_ts = ts
        if names.STEP not in rec and parser.last_step is not None:
            rec[names.STEP] = parser.last_step
        if names.RANK not in rec:
            # A launcher's output: the rank is the one its prefix names (`[rank1]:`).
            rank = parsed.rank if parsed is not None else self._prefix_rank(line)
            if rank is not None:
                rec[names.RANK] = rank
        return rec


class RankWatch:
    """The ranks a launcher starts under exec's command: the topmost descendants whose
    environment has a rank exec's own does not (a rank's own children — data loader workers —
    are not ranks), followed with the identity collector on the real /proc."""

    def __init__(
        self, node: str, root_pid: int, own_rank: int | None, proc_root: str = "/proc"
    ) -> None:
        self.root_pid = root_pid
        self.own_rank = own_rank
        self.proc_root = proc_root
        self.collector = IdentityCollector(
            node=node, proc_root=proc_root, gpu_pids=dict, extra_pids=self.ranks
        )
        # (pid, start) of the ranks found. Only ranks are remembered: a process caught between
        # fork and exec still has its parent's environment, and is asked again next time.
        self._ranks: set[tuple[int, int]] = set()
        self.world_size: int | None = None

    def _children(self, pid: int) -> list[int]:
        out: list[int] = []
        try:
            tasks = os.listdir(f"{self.proc_root}/{pid}/task")
        except OSError:
            return out
        for tid in tasks:
            try:
                with open(f"{self.proc_root}/{pid}/task/{tid}/children", "rb") as fh:
                    out.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
        return out

    def _is_rank(self, pid: int) -> bool:
        stat = read_stat(self.proc_root, pid)
        if stat is None:
            return False
        key = (pid, stat.start)
        if key in self._ranks:
            return True
        try:
            with open(f"{self.proc_root}/{pid}/environ", "rb") as fh:
                env = parse_environ(fh.read())
        except OSError:
            return False
        rank = _first_int(env, RANK_VARS)
        if rank is None or rank == self.own_rank:
            return False
        if len(self._ranks) > 10_000:  # a launcher restarting ranks without end
            self._ranks.clear()
        self._ranks.add(key)
        return True

    def ranks(self) -> list[int]:
        found: list[int] = []
        todo = self._children(self.root_pid)
        seen: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if self._is_rank(pid):
                found.append(pid)
            else:
                todo.extend(self._children(pid))
        return found

    def collect(self, now: float) -> list[Record]:
        records = self.collector.collect(now)
        for ident in self.collector.identities().values():
            if ident.world_size is not None:
                self.world_size = max(self.world_size or 0, ident.world_size)
        return [r for r in records if r.get("type") != "job"]  # exec writes the job's own


def _job_state(exit_code: int, sig: int | None) -> str:
    if sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
        return "cancelled"
    return "completed" if exit_code == 0 else "failed"


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "proof-agent exec: no command given (usage: proof-agent exec -- CMD …)", file=sys.stderr
        )
        return 2
    node = args.node or socket.gethostname()
    ident = identity_from_own_environment(node=node)
    # exec is the job's root when no scheduler, launcher or outer exec named one.
    owns_job = ident.scheduler == SCHEDULER_EXEC and not os.environ.get(ENV_JOB_ID)
    launcher = is_launcher(command)
    env_rank = _first_int(dict(os.environ), RANK_VARS)
    # A command on its own is rank 0 of 1 (identity's default); a launcher's ranks are its
    # children, and the launcher itself is none of them.
    single = owns_job and env_rank is None and not launcher
    if owns_job and env_rank is None and launcher:
        ident.rank = ident.local_rank = ident.world_size = None
    env = dict(os.environ)
    if not args.keep_buffering:
        env.setdefault("PYTHONUNBUFFERED", "1")
    if ident.job is not None:
        env[ENV_JOB_ID] = ident.job
        if ident.scheduler:
            env[ENV_JOB_SCHEDULER] = ident.scheduler
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)  # noqa: S603 - running the user's own command is what `proof-agent exec` is for
    except OSError as exc:
        print(f"proof-agent exec: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    if child.stdout is None or child.stderr is None:  # cannot be: both are PIPE
        raise RuntimeError("the child's output pipes were not opened")

    forward_sigint = not (sys.stdin is not None and sys.stdin.isatty())
    previous: dict[int, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for forwarded in FORWARDED_SIGNALS:
        if forwarded == signal.SIGINT and not forward_sigint:
            # the terminal delivers Ctrl-C to the command itself
            previous[forwarded] = signal.signal(forwarded, signal.SIG_IGN)
            continue
        previous[forwarded] = signal.signal(forwarded, forward)

    ident.pid = child.pid
    keys: Record = {"node": node, **ident.keys()}
    meta = {"recorded_by": "proof-agent exec", "node": node, "command": command}
    if ident.job is not None:
        meta["job"] = ident.job
    q: queue.Queue[tuple[float, str, bytes] | None] = queue.Queue()
    readers = [
        threading.Thread(
            target=_pump,
            args=(os.dup(child.stdout.fileno()), sys.stdout.buffer, "stdout", q),
            daemon=True,
        ),
        threading.Thread(
            target=_pump,
            args=(os.dup(child.stderr.fileno()), sys.stderr.buffer, "stderr", q),
            daemon=True,
        ),
    ]
    child.stdout.close()
    child.stderr.close()
    for t in readers:
        t.start()

    sink = None
    try:
        out = out_path(args.out, ident, node) if args.out else None
        if out is not None and "{" not in args.out and out != args.out:
            print(f"proof-agent exec: rank {ident.rank}: recording to {out}", file=sys.stderr)
        sink = _open_sink(args, node, meta, out)
    except Exception as exc:  # recording must never stop the job
        print(f"proof-agent exec: not recording: {exc}", file=sys.stderr)
    started = time.time()
    first: list[Record] = []
    # What exec knows of a job it owns, on each of its job records: ingest applies the last
    # record of a job in a batch, so none may count on an earlier one in the same batch.
    facts: Record = {}
    if owns_job and ident.job is not None:
        facts = {
            "job": ident.job,
            "scheduler": SCHEDULER_EXEC,
            "name": os.path.basename(command[0]),
            "nodes": [node],
        }
        if ident.world_size is not None:
            facts["world_size"] = ident.world_size
        if inference_server(command):
            facts["kind"] = "inference"
        first.append({"type": "job", "ts": started, **facts, "state": "running"})
    process: Record = {"type": "process", "ts": started, **keys, "cmd": command}
    if ident.world_size is not None:
        process["world_size"] = ident.world_size
    labels = dict(ident.labels)
    if ident.scheduler:
        labels["scheduler"] = ident.scheduler
    if labels:
        process["labels"] = labels
    recorder = _Recorder(keys)
    _submit(sink, [*first, process])
    watch: RankWatch | None = None
    with contextlib.suppress(OSError):
        if os.path.isdir(f"/proc/{child.pid}/task"):
            watch = RankWatch(node, child.pid, env_rank)
    next_scan = time.monotonic() + 0.2

    open_streams = len(readers)
    returncode: int | None = None
    while open_streams:
        batch: list[Record] = []
        if watch is not None and time.monotonic() >= next_scan:
            batch.extend(watch.collect(time.time()))
            if single and watch.world_size is not None:
                # It started ranks of its own: a launcher after all, whose lines are theirs.
                single = False
                for key in (names.RANK, names.LOCAL_RANK):
                    keys.pop(key, None)
            early = time.time() - started < 60
            next_scan = time.monotonic() + (RANK_SCAN_FAST_S if early else RANK_SCAN_SLOW_S)
        try:
            item: Any = q.get(timeout=0.5)
        except queue.Empty:
            item = _NOTHING
        while item is not _NOTHING:
            if item is None:
                open_streams -= 1
            else:
                batch.append(recorder.log_record(*item))
                if recorder.first_progress_ts is not None and not recorder.kind_written:
                    recorder.kind_written = True
                    if ident.job is not None and "kind" not in facts:
                        kind_rec: Record = {"type": "job", "ts": recorder.first_progress_ts}
                        if facts:
                            facts["kind"] = "training"
                            kind_rec.update(facts, state="running")
                        else:
                            kind_rec.update(job=ident.job, kind="training")
                        batch.append(kind_rec)
            try:
                item = q.get_nowait()
            except queue.Empty:
                item = _NOTHING
        _submit(sink, batch)
        if returncode is None:
            returncode = child.poll()
        if returncode is not None and open_streams:
            # A grandchild may hold the pipes open after the command exits; give it a moment.
            for t in readers:
                t.join(timeout=2.0)
            if any(t.is_alive() for t in readers):
                break
    if returncode is None:
        returncode = child.wait()

    # Popen reports death by signal N as -N; the record uses the shell's 128+N.
    sig = -returncode if returncode < 0 else None
    exit_code = 128 + sig if sig is not None else returncode
    ended = time.time()
    last: list[Record] = watch.collect(ended) if watch is not None else []
    exit_rec: Record = {"type": "exit", "ts": ended, **keys, "exit_code": exit_code}
    if sig is not None:
        exit_rec["labels"] = {"signal": signal.Signals(sig).name}
    last.append(exit_rec)
    if facts:
        end_rec: Record = {"type": "job", "ts": ended, **facts}
        end_rec.update(state=_job_state(exit_code, sig), exit_code=exit_code)
        world = (watch.world_size if watch is not None else None) or ident.world_size
        if world is not None:
            end_rec["world_size"] = world
        last.append(end_rec)
    _submit(sink, last)
    if sink is not None:
        try:
            sink.close()
        except Exception as exc:
            print(f"proof-agent exec: closing the trace failed: {exc}", file=sys.stderr)
    for s, handler in previous.items():
        signal.signal(s, handler)
    sys.stdout.flush()
    sys.stderr.flush()
    if sig is not None:
        # Die the way the command died, so the launcher sees the same signal.
        with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP have no handler
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return exit_code


def _submit(sink: Any, records: list[Record]) -> None:
    if sink is None or not records:
        return
    try:
        sink.submit(records)
        sink.flush()
    except Exception as exc:  # recording must never stop the job
        log.warning("proof-agent exec: recording failed: %s", exc)
