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
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

from agent import signals
from agent.collectors._common import Record, WarnOnce
from agent.ebpf import discovery
from agent.ebpf._bcc import import_bcc, load_failure_hints

log = logging.getLogger(__name__)

STREAMS = {1: "stdout", 2: "stderr"}
DEFAULT_CAPTURE_BYTES = 4096
DEFAULT_RING_PAGES = 256  # x 4 KiB = 1 MiB of writes buffered between two intervals
MAX_LINE_BYTES = 64 * 1024  # a "line" longer than this without a newline is cut here


def writes_source() -> str:
    return resources.files("agent.ebpf").joinpath("writes.c").read_text(encoding="utf-8")


def load_write_capture(
    capture_bytes: int = DEFAULT_CAPTURE_BYTES, ring_pages: int = DEFAULT_RING_PAGES
) -> Any:
    if capture_bytes <= 0 or capture_bytes & (capture_bytes - 1):
        raise ValueError(f"capture_bytes must be a power of two, not {capture_bytes}")
    if ring_pages <= 0 or ring_pages & (ring_pages - 1):
        raise ValueError(f"ring_pages must be a power of two, not {ring_pages}")
    bcc = import_bcc()
    return bcc.BPF(
        text=writes_source().encode(),
        cflags=[f"-DCAPTURE_BYTES={capture_bytes}", f"-DRING_PAGES={ring_pages}"],
    )


class OutputCapture:
    """stdout/stderr lines of tracked processes, captured in the kernel."""

    name = "ebpf_output"

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
        bpf_loader: Callable[[], Any] | None = None,
    ) -> None:
        self.pid_source = pid_source
        self.node = node or socket.gethostname()
        self.proc_root = proc_root
        self.capture_bytes = capture_bytes
        self.wall_clock = wall_clock
        self.monotonic_ns = monotonic_ns
        self.bpf_loader = bpf_loader or (lambda: load_write_capture(capture_bytes, ring_pages))
        self.available: bool | None = None
        self.unavailable_reason: str | None = None
        self._bpf: Any = None
        self._tracked: set[int] = set()
        # (pid, fd) -> (ts of the first write of the pending text, pending bytes)
        self._partial: dict[tuple[int, int], tuple[float, bytes]] = {}
        self._records: list[Record] = []
        self._dropped_reported = 0
        self._to_wall_s = 0.0  # wall seconds = ktime seconds + this, refreshed per interval
        self._warn = WarnOnce(log)

    def start(self) -> bool:
        if self.available is not None:
            return self.available
        try:
            self._bpf = self.bpf_loader()
            self._bpf[b"events"].open_ring_buffer(self._on_event)
        except Exception as error:  # bcc raises plain Exception for compile/load refusals
            self.available = False
            hints = load_failure_hints()
            self.unavailable_reason = f"BPF programs cannot be loaded: {error}" + (
                f" ({hints})" if hints else ""
            )
            log.warning("ebpf output capture disabled: %s", self.unavailable_reason)
            self._bpf = None
            return False
        self.available = True
        return True

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self.available = None

    def __enter__(self) -> OutputCapture:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def collect(self, now: float) -> list[Record]:
        if not self.start():
            return []
        try:
            self._to_wall_s = self.wall_clock() - self.monotonic_ns() / 1e9
            self._bpf.ring_buffer_consume()
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
        table = self._bpf[b"tracked"]
        for pid in wanted - self._tracked:
            table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        for pid in self._tracked - wanted:
            with contextlib.suppress(KeyError):
                del table[ctypes.c_uint32(pid)]
        self._tracked = wanted
        # What a process left without a newline is a line once it stops being tracked or exits.
        for pid, fd in list(self._partial):
            if pid not in wanted or not discovery.process_alive(self.proc_root, pid):
                ts, pending = self._partial.pop((pid, fd))
                self._emit(pid, fd, min(ts, now), pending, truncated=False)

    def _dropped(self) -> int:
        values = self._bpf[b"dropped"]
        return int(values[ctypes.c_int(0)].value)

    def _on_event(self, _ctx: Any, data: Any, _size: int) -> None:
        # Called by bcc from C: an exception here would be printed and lost, so log it once.
        try:
            self._take(data)
        except Exception as error:
            self._warn.fail("event", "ebpf output capture: bad event: %s", error)

    def _take(self, data: Any) -> None:
        event = self._bpf[b"events"].event(data)
        pid, fd = int(event.pid), int(event.fd)
        ts = event.ts / 1e9 + self._to_wall_s
        captured = min(int(event.captured), self.capture_bytes)
        # Not event.data: ctypes turns a char array into bytes cut at the first NUL.
        address = data if isinstance(data, int) else ctypes.cast(data, ctypes.c_void_p).value
        chunk = ctypes.string_at(address + type(event).data.offset, captured)
        cut = int(event.len) > captured
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
            "line": line.decode("utf-8", "replace"),
            "stream": STREAMS.get(fd, str(fd)),
            signals.NODE: self.node,
            signals.PID: pid,
        }
        if truncated:
            record["truncated"] = True
        self._records.append(record)
