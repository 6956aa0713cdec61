"""Following the log files a job writes: Slurm `StdOut`/`StdErr` paths and configured globs.

Each line becomes a trace `log` record (`ts`, `line`, `stream`, and the job identity given for
its path: `job`, `rank`, `local_rank`, `pid`), plus, when the training parser understands it:
- `parsed`: `ParsedLine.to_dict()` — `kind` (progress, eval, checkpoint_begin/_end,
  nccl_timeout, traceback_start/_end, completed, exit, …), `framework`, and the numbers the
  line carries (`loss`, `grad_norm`, `lr`, `tokens_per_s`, `samples_per_s`, `iter_ms`, `path`,
  `exit_code`, `error`, …; a NaN/Inf loss as `loss_nonfinite: "nan"`);
- `step` (identity key): the step the line reports, else the last step this file reported;
- `rank`: from a launcher prefix (`[rank3]:`, `3: `) when the path did not say;
- `file`: the path the line was read from.
Lines the parser does not know are kept all the same, without `parsed`.
Each line is cleaned before it is parsed (contract/limits.py): invalid UTF-8 and NUL bytes become
U+FFFD, and a line over the limit keeps its last `\\r` redraw or is truncated with a marker.

Rotation: the collector holds each file open and compares the path's inode with the open one on
every collect. Rename-and-create (logrotate's default): the old file is read to its end first
(its last partial line included), then the new one from its start. copytruncate: the file
shrinks below our offset, so reading restarts at 0. A line without its newline yet is kept
until the rest arrives (or until it exceeds `max_line_bytes`; a tqdm bar redrawn with `\\r` and
never ended keeps only its latest redraw). Files present at the first scan are read from
their end unless `from_start`; files that appear later (a job started, a new rank's log) are
read from their start. A path that matches a glob but is a file already followed under another
name (a rotated-out copy) is ignored.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from dataclasses import dataclass
from typing import IO, Any

from agent.collectors._common import Record, WarnOnce, present
from contract import signals
from contract.limits import clean_line, decode_output
from contract.parsers.training import LogParser

log = logging.getLogger(__name__)

STDOUT = "stdout"
STDERR = "stderr"
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class TailSpec:
    """One path or glob to follow, with the identity its lines belong to."""

    pattern: str
    stream: str = STDOUT
    job: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None

    @property
    def is_glob(self) -> bool:
        return any(c in _GLOB_CHARS for c in self.pattern)

    def identity(self) -> dict[str, Any]:
        return present(
            {
                signals.JOB: self.job,
                signals.RANK: self.rank,
                signals.LOCAL_RANK: self.local_rank,
                signals.PID: self.pid,
            }
        )


class _Tailed:
    __slots__ = (
        "discard_partial",
        "fh",
        "inode",
        "offset",
        "parser",
        "partial",
        "path",
        "spec",
    )

    def __init__(self, path: str, spec: TailSpec) -> None:
        self.path = path
        self.spec = spec
        self.fh: IO[bytes] | None = None
        self.inode: tuple[int, int] | None = None
        self.offset = 0
        self.partial = b""
        self.discard_partial = False  # started mid-line at the end of an existing file
        self.parser = LogParser()


class LogTailCollector:
    name = "logtail"

    def __init__(
        self,
        specs: list[TailSpec],
        *,
        from_start: bool = False,
        parse: bool = True,
        max_bytes_per_file: int = 4 << 20,
        max_line_bytes: int = 64 << 10,
        rescan_s: float = 10.0,
    ) -> None:
        self.specs = list(specs)
        self.from_start = from_start
        self.parse = parse
        self.max_bytes_per_file = max_bytes_per_file
        self.max_line_bytes = max_line_bytes
        self.rescan_s = rescan_s
        self._files: dict[str, _Tailed] = {}
        self._scanned_at: float | None = None
        self._first_scan = True
        self._retired: dict[tuple[int, int], None] = {}  # inodes rotated away (ordered, capped)
        self._warn = WarnOnce(log)

    # --- discovery ---------------------------------------------------------------------------

    def add(self, spec: TailSpec) -> None:
        """Follow another path (e.g. a Slurm job's StdOut once the job is seen); read from its
        start, since it belongs to a job that started after the agent."""
        self.specs.append(spec)
        self._scan(from_start=True)

    def _scan(self, *, from_start: bool) -> None:
        wanted: dict[str, TailSpec] = {}
        for spec in self.specs:
            if spec.is_glob:
                for path in sorted(glob.glob(spec.pattern)):
                    wanted.setdefault(path, spec)
            else:
                wanted.setdefault(spec.pattern, spec)
        known_inodes = {t.inode for t in self._files.values() if t.inode is not None}
        known_inodes.update(self._retired)
        for path, spec in wanted.items():
            if path in self._files:
                continue
            try:
                st = os.stat(path)
            except OSError:
                if not spec.is_glob:
                    self._warn.fail(path, "log file %s not readable yet; will keep trying", path)
                continue
            if (st.st_dev, st.st_ino) in known_inodes:
                continue  # a rotated-out name of a file we already follow
            tailed = _Tailed(path, spec)
            if not self._open(tailed, at_end=not from_start):
                continue
            self._files[path] = tailed

    def _open(self, tailed: _Tailed, *, at_end: bool) -> bool:
        try:
            fh = open(tailed.path, "rb")  # noqa: SIM115 (held open across collects)
        except OSError as exc:
            self._warn.fail(tailed.path, "cannot open log file %s: %s", tailed.path, exc)
            return False
        self._warn.ok(tailed.path)
        st = os.fstat(fh.fileno())
        tailed.fh = fh
        tailed.inode = (st.st_dev, st.st_ino)
        tailed.partial = b""
        tailed.offset = 0
        tailed.discard_partial = False
        if at_end and st.st_size > 0:
            tailed.offset = st.st_size
            fh.seek(st.st_size - 1)
            tailed.discard_partial = fh.read(1) != b"\n"
        return True

    # --- reading -----------------------------------------------------------------------------

    def collect(self, now: float) -> list[Record]:
        if self._scanned_at is None or now - self._scanned_at >= self.rescan_s:
            self._scan(from_start=self.from_start or not self._first_scan)
            self._first_scan = False
            self._scanned_at = now
        out: list[Record] = []
        for path in list(self._files):
            tailed = self._files[path]
            try:
                self._follow(tailed, now, out)
            except OSError as exc:
                self._warn.fail(path, "error reading log file %s: %s", path, exc)
        return out

    def _follow(self, tailed: _Tailed, now: float, out: list[Record]) -> None:
        try:
            st = os.stat(tailed.path)
            current: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            current = None
        if tailed.fh is None and (current is None or not self._open(tailed, at_end=False)):
            return
        if current is not None and current != tailed.inode:
            # Renamed away and recreated: finish the old file, then start the new one.
            self._read(tailed, now, out, final=True)
            self._close(tailed)
            if not self._open(tailed, at_end=False):
                return
        elif current is None:
            # Renamed away, not recreated yet: read what the writer still appends to it.
            self._read(tailed, now, out, final=False)
            return
        if tailed.fh is None:  # cannot be: opened above or returned
            raise RuntimeError(f"{tailed.path} is not open")
        size = os.fstat(tailed.fh.fileno()).st_size
        if size < tailed.offset:  # copytruncate
            if tailed.partial:
                self._emit(tailed, tailed.partial, now, out)
                tailed.partial = b""
            tailed.offset = 0
            tailed.discard_partial = False
        self._read(tailed, now, out, final=False)

    def _read(self, tailed: _Tailed, now: float, out: list[Record], *, final: bool) -> None:
        fh = tailed.fh
        if fh is None:
            return
        fh.seek(tailed.offset)
        data = fh.read(self.max_bytes_per_file)
        if data:
            tailed.offset += len(data)
            buf = tailed.partial + data if tailed.partial else data
            lines = buf.split(b"\n")
            partial = lines.pop()
            if tailed.discard_partial and lines:
                lines.pop(0)  # the tail of a line written before we started
                tailed.discard_partial = False
            for raw in lines:
                self._emit(tailed, raw, now, out)
            if len(partial) > self.max_line_bytes:
                cut = partial.rfind(b"\r")
                if cut >= 0:
                    partial = partial[cut + 1 :]  # an endless \r-redrawn progress bar
                if len(partial) > self.max_line_bytes:
                    self._emit(tailed, partial, now, out)
                    partial = b""
            tailed.partial = partial
        if final and tailed.partial:
            if not tailed.discard_partial:
                self._emit(tailed, tailed.partial, now, out)
            tailed.partial = b""

    def _emit(self, tailed: _Tailed, raw: bytes, now: float, out: list[Record]) -> None:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        line = clean_line(decode_output(raw))
        spec = tailed.spec
        rec: Record = {"type": "log", "ts": now, "line": line, "stream": spec.stream}
        rec.update(spec.identity())
        rec["file"] = tailed.path
        if self.parse:
            parser = tailed.parser
            parsed = parser.feed(line)
            if parsed is not None:
                rec["parsed"] = parsed.to_dict()
                if parsed.step is not None:
                    rec[signals.STEP] = parsed.step
                if parsed.rank is not None and signals.RANK not in rec:
                    rec[signals.RANK] = parsed.rank
            if signals.STEP not in rec and parser.last_step is not None:
                rec[signals.STEP] = parser.last_step
        out.append(rec)

    def _close(self, tailed: _Tailed) -> None:
        if tailed.inode is not None:
            self._retired[tailed.inode] = None
            if len(self._retired) > 1024:
                del self._retired[next(iter(self._retired))]
        if tailed.fh is not None:
            with contextlib.suppress(OSError):
                tailed.fh.close()
        tailed.fh = None
        tailed.inode = None

    def close(self) -> None:
        for tailed in self._files.values():
            self._close(tailed)
        self._files.clear()
