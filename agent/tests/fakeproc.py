"""A proc tree's host-wide files, from the real fixtures, for collector and backend tests."""

from __future__ import annotations

import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data"


def write_host_files(proc: Path) -> None:
    """NFS mountstats, diskstats, a root mount, CPU/boot time and memory under `proc`."""
    (proc / "self").mkdir(parents=True)
    shutil.copy(DATA / "proc/mountstats_nfs.txt", proc / "self/mountstats")
    shutil.copy(DATA / "proc/diskstats.txt", proc / "diskstats")
    (proc / "self/mountinfo").write_text("22 1 8:4 / / rw - ext4 /dev/sda4 rw\n")
    (proc / "stat").write_text("cpu  10 0 10 80 0 0 0 0 0 0\nbtime 1700000000\n")
    (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 400 kB\n")
