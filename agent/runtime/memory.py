"""The process's own peak resident memory, as the agent's benches and `record` report it."""

from __future__ import annotations

import resource
from pathlib import Path

PROC_SELF_STATUS = Path("/proc/self/status")


def peak_rss_mib(status_path: Path = PROC_SELF_STATUS) -> float:
    """Peak RSS of this process image in MiB.

    VmHWM is read first: it belongs to the address space made at exec. getrusage's ru_maxrss
    does not: Linux carries the forking parent's high-water mark across fork and exec into the
    child's (a bench started from a 1 GiB test process reported 1,067 MiB). ru_maxrss is the
    fallback where /proc cannot be read (not Linux, or /proc not mounted).
    """
    try:
        text = status_path.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib(status_path: Path = PROC_SELF_STATUS) -> float:
    """Current RSS of this process in MiB (VmRSS); 0.0 where /proc cannot be read."""
    try:
        text = status_path.read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) / 1024  # kB
    return 0.0
