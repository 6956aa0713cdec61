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

from agent import signals as names
from agent.collectors.identity import identity_from_own_environment
from agent.limits import clean_line, decode_output

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


def _open_sink(args: argparse.Namespace, node: str, meta: dict[str, Any]) -> Any:
    from agent.runtime.sinks import TraceSink

    if args.out:
        return TraceSink(args.out, meta)
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
        self.parsers: dict[str, Any] = {}
        try:
            from agent.parsers.training import LogParser

            self._parser_cls: Any = LogParser
        except ImportError:  # the training parsers are optional here
            self._parser_cls = None

    def log_record(self, ts: float, stream: str, raw: bytes) -> Record:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        line = clean_line(decode_output(raw))  # NUL, bad UTF-8, long lines: agent/limits.py
        rec: Record = {"type": "log", "ts": ts, "line": line, "stream": stream, **self.base}
        if self._parser_cls is not None:
            parser = self.parsers.get(stream)
            if parser is None:
                parser = self.parsers[stream] = self._parser_cls()
            parsed = parser.feed(line)
            if parsed is not None:
                rec["parsed"] = parsed.to_dict()
                if parsed.step is not None:
                    rec[names.STEP] = parsed.step
            if names.STEP not in rec and parser.last_step is not None:
                rec[names.STEP] = parser.last_step
        return rec


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
    env = dict(os.environ)
    if not args.keep_buffering:
        env.setdefault("PYTHONUNBUFFERED", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        print(f"proof-agent exec: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    assert child.stdout is not None and child.stderr is not None

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

    ident = identity_from_own_environment(child.pid)
    keys: Record = {"node": node, **ident.keys()}
    meta = {"recorded_by": "proof-agent exec", "node": node, "command": command}
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
        sink = _open_sink(args, node, meta)
    except Exception as exc:  # recording must never stop the job
        print(f"proof-agent exec: not recording: {exc}", file=sys.stderr)
    process: Record = {"type": "process", "ts": time.time(), **keys, "cmd": command}
    if ident.world_size is not None:
        process["world_size"] = ident.world_size
    labels = dict(ident.labels)
    if ident.scheduler:
        labels["scheduler"] = ident.scheduler
    if labels:
        process["labels"] = labels
    recorder = _Recorder(keys)
    _submit(sink, [process])

    open_streams = len(readers)
    returncode: int | None = None
    while open_streams:
        batch: list[Record] = []
        try:
            item: Any = q.get(timeout=0.5)
        except queue.Empty:
            item = _NOTHING
        while item is not _NOTHING:
            if item is None:
                open_streams -= 1
            else:
                batch.append(recorder.log_record(*item))
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
    exit_rec: Record = {"type": "exit", "ts": time.time(), **keys, "exit_code": exit_code}
    if sig is not None:
        exit_rec["labels"] = {"signal": signal.Signals(sig).name}
    _submit(sink, [exit_rec])
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
