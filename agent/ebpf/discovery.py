"""Finding the libcuda/libnccl files processes have loaded, through /proc/<pid>/maps.

A uprobe is set on a file (an inode), not on a process: once attached to a library file it
fires in every process that maps that file, including processes started later. So discovery
only has to find each distinct library file once — identified by the (device, inode) pair the
maps line carries — and the path to open it from the agent's mount namespace:
`<proc_root>/<pid>/root/<path>`, which also reaches libraries inside containers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from agent.ebpf.calls import library_kind

# Read this much of a maps file at most (a large PyTorch process has ~10k lines, ~1.5 MB).
MAX_MAPS_BYTES = 16 * 1024 * 1024
_NEEDLES = (b"libcuda.so", b"libnccl.so")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class LibraryFile:
    """One library file as a process maps it."""

    kind: str  # calls.CUDA or calls.NCCL
    device: str  # "major:minor" as in the maps line
    inode: int
    path: str  # the path inside the process's mount namespace

    @property
    def identity(self) -> tuple[str, int]:
        return (self.device, self.inode)


def list_pids(proc_root: str) -> list[int]:
    """Process ids under `proc_root` (threads are not listed there, only thread groups)."""
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def process_alive(proc_root: str, pid: int) -> bool:
    return os.path.exists(os.path.join(proc_root, str(pid)))


def process_age_ns(proc_root: str, pid: int) -> int | None:
    """How long ago `pid` started (from /proc/<pid>/stat's starttime, in clock ticks since
    boot, against CLOCK_BOOTTIME); None if it cannot be read (gone, or not a real /proc)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as fh:
            stat = fh.read(4096)
        # pid (comm) state ... — comm may contain spaces and parentheses: split after the last
        # ')'; starttime is field 22, the 20th after it.
        started_ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    started_ns = started_ticks * 1_000_000_000 // _CLOCK_TICKS
    return max(0, time.clock_gettime_ns(time.CLOCK_BOOTTIME) - started_ns)


def parse_maps(text: bytes) -> Iterator[LibraryFile]:
    """The probed libraries in a maps file's content, one per distinct file."""
    seen: set[tuple[str, int]] = set()
    for raw in text.splitlines():
        if b"libcuda.so" not in raw and b"libnccl.so" not in raw:
            continue
        # address perms offset dev inode pathname (the pathname may contain spaces)
        fields = raw.split(None, 5)
        if len(fields) < 6:
            continue
        path = fields[5].decode("utf-8", "surrogateescape").strip()
        if path.endswith(" (deleted)"):
            continue  # replaced on disk since it was loaded: no path reaches that inode
        try:
            inode = int(fields[4])
        except ValueError:
            continue
        kind = library_kind(path)
        if kind is None or inode == 0:
            continue
        device = fields[3].decode("ascii", "replace")
        if (device, inode) in seen:
            continue
        seen.add((device, inode))
        yield LibraryFile(kind=kind, device=device, inode=inode, path=path)


def libraries_of(proc_root: str, pid: int) -> list[LibraryFile]:
    """The probed libraries process `pid` maps; [] if it has none or is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "maps"), "rb") as maps:
            text = maps.read(MAX_MAPS_BYTES)
    except OSError:
        return []  # exited, or not ours to read
    if not any(needle in text for needle in _NEEDLES):
        return []
    return list(parse_maps(text))


def scan(proc_root: str, pids: Iterable[int]) -> dict[int, list[LibraryFile]]:
    """pid -> the probed libraries it maps, for the pids that map any."""
    found: dict[int, list[LibraryFile]] = {}
    for pid in pids:
        libraries = libraries_of(proc_root, pid)
        if libraries:
            found[pid] = libraries
    return found


def host_path(proc_root: str, pid: int, library: LibraryFile) -> str:
    """A path to the library's file from the agent's own mount namespace."""
    return os.path.join(proc_root, str(pid), "root", library.path.lstrip("/"))
