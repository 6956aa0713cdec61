"""NVIDIA XID lines in kernel-log text, in whichever format the log was read.

Formats understood (the message part is what follows the prefix):
  /dev/kmsg record   `6,3964,206764307,-;NVRM: Xid (PCI:0000:9b:00): 119, …`   (usec since boot)
  dmesg              `[1590188.789226] NVRM: …`                                (s since boot)
  dmesg --ctime / -T `[Sun Feb 23 16:24:18 2025] NVRM: …`
  journal / syslog   `Sep 10 10:47:46 host kernel: NVRM: …`, any locale's month (`6月 28 …`)
  ISO syslog         `2025-02-23T16:24:18.123456+00:00 host kernel: NVRM: …`
  bare               `NVRM: Xid (PCI:…): 63, …`

`parse_xid(line)` returns an `Xid` (code, PCI bus id, pid and process name when the driver knew
them, the detail text, and the kernel's timestamp as a `KernelTime`), or None. `gpu_announcement`
reads the driver's `NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-…` lines, which give the PCI →
UUID map on nodes where nobody passed one in.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

KMSG_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_MONO_RE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_CTIME_RE = re.compile(r"^\[(\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})\]\s?(.*)$")
# "<month> <day> HH:MM:SS host ident: msg" — month as English abbreviation or "6月"-style.
_SYSLOG_RE = re.compile(r"^(\S+)\s+(\d{1,2})\s+(\d\d:\d\d:\d\d)\s+\S+\s+[^:]*:\s?(.*)$")
_ISO_RE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+\S+\s+[^:]*:\s?(.*)$"
)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_CJK_MONTH_RE = re.compile(r"^(\d{1,2})月$")

XID_RE = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): (\d+),?\s?(.*)"
)
_PID_RE = re.compile(r"^pid=(?:'?<unknown>'?|(\d+)),\s*(?:name=([^,]*),\s*)?(.*)$")
_GPU_AT_RE = re.compile(
    r"NVRM: GPU at PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?): (GPU-[0-9a-fA-F-]+)"
)

BOOT = "boot"  # seconds since boot (kmsg, dmesg)
EPOCH = "epoch"  # seconds since the Unix epoch (ctime, syslog, ISO)


class KernelTime(NamedTuple):
    kind: str  # BOOT or EPOCH
    seconds: float


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    pci_bus_id: str  # normalized, see normalize_pci
    detail: str
    message: str  # the kernel message without the log prefix
    pid: int | None = None
    process: str | None = None
    time: KernelTime | None = None


def normalize_pci(bus_id: str) -> str:
    """`00000000:9B:00.0` (NVML), `0000:9b:00` (XID lines) → `0000:9b:00`."""
    bus_id = bus_id.strip().lower()
    if "." in bus_id:
        bus_id = bus_id.rsplit(".", 1)[0]
    parts = bus_id.split(":")
    if len(parts) == 3:
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1]}:{parts[2]}"
    return bus_id


def split_prefix(line: str, *, year: int | None = None) -> tuple[str, KernelTime | None]:
    """The kernel message inside a log line, and the line's timestamp when it has one.
    `year` completes syslog timestamps, which carry none (default: the current year)."""
    c = line[:1]
    if c.isdigit():
        m = KMSG_RE.match(line)
        if m:
            return m.group(4), KernelTime(BOOT, int(m.group(3)) / 1e6)
        m = _ISO_RE.match(line)
        if m:
            return m.group(2), _iso_time(m.group(1))
    if c == "[":
        m = _MONO_RE.match(line)
        if m:
            return m.group(2), KernelTime(BOOT, float(m.group(1)))
        m = _CTIME_RE.match(line)
        if m:
            try:
                t = time.mktime(time.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"))
                return m.group(2), KernelTime(EPOCH, t)
            except ValueError:
                return m.group(2), None
    m = _SYSLOG_RE.match(line)
    if m:
        month = _month(m.group(1))
        if month is not None:
            return m.group(4), _syslog_time(month, int(m.group(2)), m.group(3), year)
    return line, None


def _month(text: str) -> int | None:
    month = _MONTHS.get(text[:3].lower())
    if month is not None:
        return month
    m = _CJK_MONTH_RE.match(text)
    if m and 1 <= int(m.group(1)) <= 12:
        return int(m.group(1))
    return None


def _syslog_time(month: int, day: int, hms: str, year: int | None) -> KernelTime | None:
    y = year if year is not None else time.localtime().tm_year
    try:
        h, mi, s = (int(x) for x in hms.split(":"))
        return KernelTime(EPOCH, time.mktime((y, month, day, h, mi, s, 0, 0, -1)))
    except (ValueError, OverflowError):
        return None


def _iso_time(text: str) -> KernelTime | None:
    try:
        return KernelTime(EPOCH, datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def parse_xid(line: str, *, year: int | None = None) -> Xid | None:
    """The XID a kernel-log line reports, or None (cheap for the common non-NVRM line)."""
    if "Xid" not in line:
        return None
    m = XID_RE.search(line)
    if m is None:
        return None
    message, ktime = split_prefix(line, year=year)
    rest = m.group(3).strip()
    pid: int | None = None
    process: str | None = None
    pm = _PID_RE.match(rest)
    if pm:
        pid = int(pm.group(1)) if pm.group(1) else None
        name = (pm.group(2) or "").strip()
        process = name if name and name != "<unknown>" else None
        rest = pm.group(3)
    return Xid(
        code=int(m.group(2)),
        pci_bus_id=normalize_pci(m.group(1)),
        detail=rest,
        message=message,
        pid=pid,
        process=process,
        time=ktime,
    )


def gpu_announcement(line: str) -> tuple[str, str] | None:
    """(normalized PCI bus id, GPU UUID) from `NVRM: GPU at PCI:…: GPU-…` lines."""
    if "GPU at PCI" not in line:
        return None
    m = _GPU_AT_RE.search(line)
    if m is None:
        return None
    return normalize_pci(m.group(1)), m.group(2)
