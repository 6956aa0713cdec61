"""Job output from eBPF: what GPU processes write to stdout and stderr, as `log` records.

The third way the agent gets a job's output (issue 5c), for jobs that neither run under
`proof-agent exec` nor write a log file the agent knows: a tracepoint on write(2) (writes.c)
copies up to `capture_bytes` of every write to fd 1 or 2 by a tracked process into a ring
buffer; `collect(now)` drains it, reassembles lines per process and stream, and returns
trace-v1 `log` records (`line`, `stream`, `pid`, `node`, `ts` of the write).

Which processes: `pid_source()` each interval — by default the processes the uprobe collector
found mapping libcuda (`EbpfCollector.cuda_pids`). Lines end at "\\n" or "\\r" (progress bars
rewrite one line with "\\r"; each rewrite is a line). A write longer than `capture_bytes` is
cut: its last, cut line carries `"truncated": true`. Writes lost to a full ring buffer are
counted and reported as one `collector_error` event per interval that lost any.

Like the probes, the program is compiled in a child process (agent.ebpf.loader); this process
attaches it to the tracepoint and reads the ring buffer through mmap (agent.ebpf.bpfsys).
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.collectors._common import Record, WarnOnce
from agent.ebpf import bpfsys, discovery
from agent.ebpf.loader import WRITE_PROGRAM, LoadedProgram, LoadsOnce, load_in_child
from contract import signals
from contract.limits import clean_line, decode_output

log = logging.getLogger(__name__)

STREAMS = {1: "stdout", 2: "stderr"}
DEFAULT_CAPTURE_BYTES = 4096
DEFAULT_RING_PAGES = 256  # x 4 KiB = 1 MiB of writes buffered between two intervals
MAX_LINE_BYTES = 64 * 1024  # a "line" longer than this without a newline is cut here


# struct write_event in writes.c: ts, pid, fd, len, captured, then the data
_EVENT_HEADER = struct.Struct("<QIIII")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass
class WriteCaptureProgram:
    loaded: LoadedProgram
    ring: bpfsys.RingBuffer
    attachment: int  # the tracepoint's perf event fd

    def close(self) -> None:
        os.close(self.attachment)
        self.ring.close()
        self.loaded.close()


def load_write_capture(
    capture_bytes: int = DEFAULT_CAPTURE_BYTES, ring_pages: int = DEFAULT_RING_PAGES
) -> WriteCaptureProgram:
    """Compile and load writes.c (in a child process, like the probes) and attach it."""
    if capture_bytes <= 0 or capture_bytes & (capture_bytes - 1):
        raise ValueError(f"capture_bytes must be a power of two, not {capture_bytes}")
    if ring_pages <= 0 or ring_pages & (ring_pages - 1):
        raise ValueError(f"ring_pages must be a power of two, not {ring_pages}")
    loaded = load_in_child(
        "writes", [f"-DCAPTURE_BYTES={capture_bytes}", f"-DRING_PAGES={ring_pages}"]
    )
    try:
        ring = bpfsys.RingBuffer(loaded.maps["events"], ring_pages * mmap.PAGESIZE)
        attachment = bpfsys.attach_tracepoint(
            loaded.programs[WRITE_PROGRAM], "syscalls", "sys_enter_write"
        )
    except Exception:
        loaded.close()
        raise
    return WriteCaptureProgram(loaded, ring, attachment)


class OutputCapture(LoadsOnce[WriteCaptureProgram]):
    """stdout/stderr lines of tracked processes, captured in the kernel."""

    name = "ebpf_output"
    what = "ebpf output capture"

    def __init__(
        self,
        *,
        pid_source: Callable[[], Iterable[int]],
        node: str | None = None,
        proc_root: str = "/proc",
        capture_bytes: int = DEFAULT_CAPTURE_BYTES,
        ring_pages: int = DEFAULT_RING_PAGES,
        wall_clock: Callable[[], float] = time.time,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        bpf_loader: Callable[[], WriteCaptureProgram] | None = None,
    ) -> None:
        self.pid_source = pid_source
        self.node = node or socket.gethostname()
        self.proc_root = proc_root
        self.capture_bytes = capture_bytes
        self.wall_clock = wall_clock
        self.monotonic_ns = monotonic_ns
        self.bpf_loader = bpf_loader or (lambda: load_write_capture(capture_bytes, ring_pages))
        super().__init__()
        self._tracked: set[int] = set()
        # (pid, fd) -> (ts of the first write of the pending text, pending bytes)
        self._partial: dict[tuple[int, int], tuple[float, bytes]] = {}
        self._records: list[Record] = []
        self._dropped_reported = 0
        self._to_wall_s = 0.0  # wall seconds = ktime seconds + this, refreshed per interval
        self._warn = WarnOnce(log)

    def _load(self) -> WriteCaptureProgram:
        return self.bpf_loader()

    def collect(self, now: float) -> list[Record]:
        if not self.start():
            return []
        try:
            self._to_wall_s = self.wall_clock() - self.monotonic_ns() / 1e9
            if self._bpf is None:
                raise RuntimeError("the BPF program is not loaded")
            for event in self._bpf.ring.consume():
                self._take(event)
            self._sync_tracked(now)
            records, self._records = self._records, []
            dropped = self._dropped()
            if dropped > self._dropped_reported:
                records.append(
                    {
                        "type": "event",
                        "ts": now,
                        "name": signals.EVENT_COLLECTOR_ERROR,
                        signals.NODE: self.node,
                        "text": f"ebpf output capture: {dropped - self._dropped_reported} "
                        "writes lost (ring buffer full)",
                    }
                )
                self._dropped_reported = dropped
            self._warn.ok("collect")
            return records
        except Exception as error:
            self._warn.fail("collect", "ebpf output capture failed: %s", error)
            return []

    def _sync_tracked(self, now: float) -> None:
        # Never the agent itself: its own logging would feed back into what it captures.
        wanted = {int(pid) for pid in self.pid_source()} - {os.getpid()}
        if self._bpf is None:
            raise RuntimeError("the BPF program is not loaded")
        table = self._bpf.loaded.maps["tracked"]
        for pid in wanted - self._tracked:
            bpfsys.update(table, _U32.pack(pid), b"\x01")
        for pid in self._tracked - wanted:
            bpfsys.delete(table, _U32.pack(pid))
        self._tracked = wanted
        # What a process left without a newline is a line once it stops being tracked or exits.
        for pid, fd in list(self._partial):
            if pid not in wanted or not discovery.process_alive(self.proc_root, pid):
                ts, pending = self._partial.pop((pid, fd))
                self._emit(pid, fd, min(ts, now), pending, truncated=False)

    def _dropped(self) -> int:
        if self._bpf is None:
            raise RuntimeError("the BPF program is not loaded")
        raw = bpfsys.lookup(self._bpf.loaded.maps["dropped"], _U32.pack(0), _U64.size)
        return _U64.unpack(raw)[0] if raw else 0

    def _take(self, event: bytes) -> None:
        ts_ns, pid, fd, length, captured = _EVENT_HEADER.unpack_from(event)
        ts = ts_ns / 1e9 + self._to_wall_s
        captured = min(captured, self.capture_bytes)
        chunk = event[_EVENT_HEADER.size : _EVENT_HEADER.size + captured]
        cut = length > captured
        start_ts, pending = self._partial.pop((pid, fd), (ts, b""))
        text = pending + chunk
        pieces = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for piece in pieces[:-1]:
            self._emit(pid, fd, start_ts, piece, truncated=False)
            start_ts = ts
        rest = pieces[-1]
        if cut:
            # The rest of this write was not copied: the line it was on ends here, cut.
            if rest:
                self._emit(pid, fd, start_ts, rest, truncated=True)
        elif len(rest) >= MAX_LINE_BYTES:
            self._emit(pid, fd, start_ts, rest, truncated=True)
        elif rest:
            self._partial[(pid, fd)] = (start_ts, rest)

    def _emit(self, pid: int, fd: int, ts: float, line: bytes, *, truncated: bool) -> None:
        if not line and not truncated:
            return
        record: Record = {
            "type": "log",
            "ts": ts,
            "line": clean_line(decode_output(line)),
            "stream": STREAMS.get(fd, str(fd)),
            signals.NODE: self.node,
            signals.PID: pid,
        }
        if truncated:
            record["truncated"] = True
        self._records.append(record)
