"""Host CPU utilisation and memory used, node scope, from `<proc>/stat` and `<proc>/meminfo`.

`host.cpu_util` (0–1): the busy share of all CPUs' time since the previous collect,
1 − Δ(idle + iowait) / Δ(total), where total is user+nice+system+idle+iowait+irq+softirq+steal
(guest time is already inside user/nice, so it is not added twice). The first collect only
takes the baseline. `host.mem_used_bytes`: MemTotal − MemAvailable (the kernel's own estimate
of what could be handed out without swapping); on kernels without MemAvailable,
MemTotal − MemFree − Buffers − Cached.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent.collectors._common import Record, WarnOnce
from contract import signals

log = logging.getLogger(__name__)


def cpu_times(stat_text: str) -> tuple[int, int] | None:
    """(busy + idle total, idle incl. iowait) jiffies from the aggregate `cpu` line."""
    for line in stat_text.split("\n"):
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:9]]
            f += [0] * (8 - len(f))
            return sum(f), f[3] + f[4]
    return None


def mem_used_bytes(meminfo_text: str) -> int | None:
    kb: dict[str, int] = {}
    for line in meminfo_text.split("\n"):
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key] = int(parts[0])
    total = kb.get("MemTotal")
    if total is None:
        return None
    available = kb.get("MemAvailable")
    if available is None:
        available = kb.get("MemFree", 0) + kb.get("Buffers", 0) + kb.get("Cached", 0)
    return (total - available) * 1024


class HostCollector:
    name = "host"

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.proc = Path(proc_root)
        self._prev: tuple[int, int] | None = None
        self._warn = WarnOnce(log)

    def _read(self, rel: str) -> str | None:
        try:
            return (self.proc / rel).read_text()
        except OSError as exc:
            self._warn.fail(rel, "cannot read %s: %s", self.proc / rel, exc)
            return None

    def collect(self, now: float) -> list[Record]:
        out: list[Record] = []
        stat = self._read("stat")
        times = cpu_times(stat) if stat is not None else None
        if times is not None:
            prev, self._prev = self._prev, times
            if prev is not None:
                d_total, d_idle = times[0] - prev[0], times[1] - prev[1]
                if d_total > 0 and 0 <= d_idle <= d_total:
                    out.append(
                        {
                            "type": "sample",
                            "ts": now,
                            "name": signals.HOST_CPU_UTIL,
                            "value": 1.0 - d_idle / d_total,
                        }
                    )
        meminfo = self._read("meminfo")
        used = mem_used_bytes(meminfo) if meminfo is not None else None
        if used is not None:
            out.append(
                {"type": "sample", "ts": now, "name": signals.HOST_MEM_USED_BYTES, "value": used}
            )
        return out
