"""NVIDIA XIDs from the kernel log → `xid` events (docs/design.md §5: `value` = XID code,
`text` = the kernel line).

Reads `/dev/kmsg` (one record per read, non-blocking; records overwritten before we read them
are skipped, EPIPE) or, with `kmsg_path` pointing at a file, any kernel-log text (dmesg output,
/var/log/kern.log, a journal export) followed like a tail. By default only records written after
the agent started are reported; `replay=True` reports what the ring buffer/file already holds
(each event then carries the kernel's own time in `kernel_ts`, while `ts` stays the collection
time so the trace remains in order).

Events carry `gpu` (UUID) when the XID's PCI bus id is known: from the injected `pci_to_gpu`
map or function (the NVML collector knows every GPU's bus id), or learned from the driver's own
`NVRM: GPU at PCI:…: GPU-…` lines; `labels.pci_bus_id` always; `pid` when the driver names the
process (the identity join then adds its job and rank).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.collectors._common import Record, WarnOnce, event
from contract import signals
from contract.limits import MAX_EVENT_TEXT_CHARS, clean_text, decode_output
from contract.parsers.kernel import BOOT, Xid, gpu_announcement, normalize_pci, parse_xid

log = logging.getLogger(__name__)

PciMap = Mapping[str, str] | Callable[[str], str | None]


class KmsgCollector:
    name = "kmsg"

    def __init__(
        self,
        kmsg_path: str | Path = "/dev/kmsg",
        *,
        pci_to_gpu: PciMap | None = None,
        proc_root: str | Path = "/proc",
        replay: bool = False,
        max_bytes_per_collect: int = 1 << 20,
    ) -> None:
        self.path = str(kmsg_path)
        self.replay = replay
        self.max_bytes = max_bytes_per_collect
        self._proc_root = Path(proc_root)
        self._lookup: Callable[[str], str | None]
        if pci_to_gpu is None:
            self._lookup = lambda _bus: None
        elif callable(pci_to_gpu):
            self._lookup = pci_to_gpu
        else:
            normalized = {normalize_pci(k): v for k, v in pci_to_gpu.items()}
            self._lookup = normalized.get
        self._learned: dict[str, str] = {}
        self.lines_read = 0  # kernel-log records seen (for doctor and tests)
        self._fd: int | None = None
        self._buf = b""
        self._boot_time: float | None = None
        self._warn = WarnOnce(log)

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            self._warn.fail("open", "cannot read kernel log %s: %s", self.path, exc)
            return False
        self._warn.ok("open")
        if not self.replay:
            with contextlib.suppress(OSError):
                os.lseek(fd, 0, os.SEEK_END)  # /dev/kmsg: skip to after the newest record
        self._fd = fd
        return True

    def boot_time(self) -> float | None:
        if self._boot_time is None:
            try:
                for line in (self._proc_root / "stat").read_text().splitlines():
                    if line.startswith("btime "):
                        self._boot_time = float(line.split()[1])
                        break
            except OSError:
                return None
        return self._boot_time

    def _read_available(self) -> bytes:
        if self._fd is None:
            raise RuntimeError("kmsg is not open")
        chunks: list[bytes] = []
        total = 0
        while total < self.max_bytes:
            try:
                data = os.read(self._fd, 8192)
            except BlockingIOError:
                break  # nothing more for now
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them; go on
                raise
            if not data:
                break  # end of a regular file
            chunks.append(data)
            total += len(data)
        return b"".join(chunks)

    def collect(self, now: float) -> list[Record]:
        if self._fd is None and not self._open():
            return []
        try:
            data = self._read_available()
        except OSError as exc:
            self._warn.fail("read", "error reading kernel log %s: %s", self.path, exc)
            self.close()
            return []
        self._warn.ok("read")
        if not data:
            return []
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[Record] = []
        for raw in lines:
            if not raw or raw[:1] == b" ":
                continue  # kmsg continuation lines (" SUBSYSTEM=pci", " DEVICE=+pci:…")
            self.lines_read += 1
            line = clean_text(decode_output(raw), MAX_EVENT_TEXT_CHARS)
            rec = self.record_for(line, now)
            if rec is not None:
                out.append(rec)
        return out

    def record_for(self, line: str, now: float) -> Record | None:
        """The `xid` event for one kernel-log line, or None (and learn GPU announcements)."""
        announced = gpu_announcement(line)
        if announced is not None:
            self._learned[announced[0]] = announced[1]
            return None
        xid = parse_xid(line)
        if xid is None:
            return None
        return self._event(xid, line, now)

    def gpu_for(self, pci_bus_id: str) -> str | None:
        bus = normalize_pci(pci_bus_id)
        return self._lookup(bus) or self._learned.get(bus)

    def _event(self, xid: Xid, line: str, now: float) -> Record:
        rec = event(
            now,
            signals.EVENT_XID,
            value=xid.code,
            text=line,
            gpu=self.gpu_for(xid.pci_bus_id),
            pid=xid.pid,
        )
        labels = {"pci_bus_id": xid.pci_bus_id}
        if xid.process:
            labels["process"] = xid.process
        rec["labels"] = labels
        if xid.time is not None:
            if xid.time.kind == BOOT:
                boot = self.boot_time()
                if boot is not None:
                    rec["kernel_ts"] = boot + xid.time.seconds
            else:
                rec["kernel_ts"] = xid.time.seconds
        return rec

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        self._buf = b""
