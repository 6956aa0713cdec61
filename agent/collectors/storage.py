"""Storage per mount: NFS from `<proc>/self/mountstats`, local block devices from
`<proc>/diskstats` mapped to their mounts through `<proc>/self/mountinfo`.

Per mount (`labels.mount`, `labels.fstype`, plus `labels.device`):
- `storage.read_bytes`, `storage.write_bytes`: cumulative, as the kernel reports them.
  NFS: the `bytes:` line's normal + O_DIRECT application bytes (what the job read/wrote, not
  counting readahead pages). Local disks: sectors × 512 (diskstats counts 512-byte sectors
  whatever the device's block size).
- `storage.write_ms`: mean write latency over the interval, from the deltas since the previous
  collect: NFS Δ(WRITE execute ms) / Δ(WRITE ops) — "execute" is request issued to reply
  processed, queueing included, what the application waits for; local disks Δ(ms spent
  writing) / Δ(writes completed). No writes in the interval → no sample (latency undefined).
  A counter that went backwards (remount, wrap) skips that interval.
- NFS only, cumulative per operation (`labels.op` READ / WRITE / COMMIT …, configurable):
  `storage.nfs_ops`, `storage.nfs_rtt_ms`, `storage.nfs_exec_ms`.

A device mounted at several places (bind mounts) is reported once, at its shortest mount path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from agent.collectors._common import Record, WarnOnce
from contract import signals

log = logging.getLogger(__name__)

STORAGE_NFS_OPS = "storage.nfs_ops"
STORAGE_NFS_RTT_MS = "storage.nfs_rtt_ms"
STORAGE_NFS_EXEC_MS = "storage.nfs_exec_ms"
NFS_FSTYPES = frozenset({"nfs", "nfs4"})
SECTOR_BYTES = 512
DEFAULT_NFS_OPS = ("READ", "WRITE", "COMMIT")


@dataclass
class NfsMount:
    device: str
    mount: str
    fstype: str
    read_bytes: int = 0
    write_bytes: int = 0
    # op -> (ops, transmissions, major timeouts, bytes sent, bytes received, queue ms, rtt ms,
    #        execute ms[, errors])
    ops: dict[str, list[int]] = field(default_factory=dict)


def parse_mountstats(text: str) -> list[NfsMount]:
    """The NFS mounts of a /proc/<pid>/mountstats text, in file order."""
    mounts: list[NfsMount] = []
    current: NfsMount | None = None
    in_ops = False
    for line in text.split("\n"):
        if line.startswith("device "):
            current = None
            in_ops = False
            parts = line.split()
            # device SRC mounted on MOUNT with fstype TYPE [statvers=…]
            try:
                fstype = parts[parts.index("fstype") + 1]
                mount = parts[parts.index("on") + 1]
            except (ValueError, IndexError):
                continue
            if fstype in NFS_FSTYPES:
                current = NfsMount(parts[1], mount, fstype)
                mounts.append(current)
            continue
        if current is None:
            continue
        s = line.strip()
        if s.startswith("bytes:"):
            nums = [int(x) for x in s[6:].split()]
            if len(nums) >= 4:
                current.read_bytes = nums[0] + nums[2]
                current.write_bytes = nums[1] + nums[3]
        elif s == "per-op statistics":
            in_ops = True
        elif in_ops and ":" in s:
            op, _, rest = s.partition(":")
            try:
                current.ops[op.strip()] = [int(x) for x in rest.split()]
            except ValueError:
                continue
    return mounts


def parse_mountinfo(text: str) -> dict[tuple[int, int], tuple[str, str]]:
    """(major, minor) → (mount point, fstype), keeping the shortest mount point per device."""
    out: dict[tuple[int, int], tuple[str, str]] = {}
    for line in text.split("\n"):
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or not rfields:
            continue
        major, _, minor = fields[2].partition(":")
        try:
            dev = (int(major), int(minor))
        except ValueError:
            continue
        mount = fields[4].replace("\\040", " ")
        current = out.get(dev)
        if current is None or len(mount) < len(current[0]):
            out[dev] = (mount, rfields[0])
    return out


def parse_diskstats(text: str) -> dict[tuple[int, int], tuple[str, list[int]]]:
    """(major, minor) → (device name, the numeric fields after the name)."""
    out: dict[tuple[int, int], tuple[str, list[int]]] = {}
    for line in text.split("\n"):
        parts = line.split()
        if len(parts) < 14:
            continue
        try:
            out[(int(parts[0]), int(parts[1]))] = (parts[2], [int(x) for x in parts[3:]])
        except ValueError:
            continue
    return out


class StorageCollector:
    name = "storage"

    def __init__(
        self,
        proc_root: str | Path = "/proc",
        *,
        nfs: bool = True,
        local: bool = True,
        nfs_ops: tuple[str, ...] = DEFAULT_NFS_OPS,
        mountstats_path: str | Path | None = None,
        diskstats_path: str | Path | None = None,
        mountinfo_path: str | Path | None = None,
    ) -> None:
        self.proc = Path(proc_root)
        # Each file defaults to its place under proc_root; the config can point them elsewhere.
        self._paths = {
            "mountstats": Path(mountstats_path or self.proc / "self/mountstats"),
            "diskstats": Path(diskstats_path or self.proc / "diskstats"),
            "mountinfo": Path(mountinfo_path or self.proc / "self/mountinfo"),
        }
        self.nfs = nfs
        self.local = local
        self.nfs_ops = nfs_ops
        self._warn = WarnOnce(log)
        # (mount, fstype) -> (write ops, write ms) at the previous collect
        self._prev_writes: dict[tuple[str, str], tuple[int, int]] = {}

    def _read(self, which: str) -> str | None:
        path = self._paths[which]
        try:
            return path.read_text()
        except OSError as exc:
            self._warn.fail(which, "cannot read %s: %s", path, exc)
            return None

    def collect(self, now: float) -> list[Record]:
        out: list[Record] = []
        if self.nfs:
            text = self._read("mountstats")
            if text is not None:
                self._nfs(parse_mountstats(text), now, out)
        if self.local:
            stats = self._read("diskstats")
            info = self._read("mountinfo")
            if stats is not None and info is not None:
                self._local(parse_diskstats(stats), parse_mountinfo(info), now, out)
        return out

    def _write_latency(
        self,
        key: tuple[str, str],
        ops: int,
        ms: int,
        labels: dict[str, str],
        now: float,
        out: list[Record],
    ) -> None:
        prev = self._prev_writes.get(key)
        self._prev_writes[key] = (ops, ms)
        if prev is None:
            return
        d_ops, d_ms = ops - prev[0], ms - prev[1]
        if d_ops > 0 and d_ms >= 0:
            out.append(_sample(now, signals.STORAGE_WRITE_MS, d_ms / d_ops, labels))

    def _nfs(self, mounts: list[NfsMount], now: float, out: list[Record]) -> None:
        seen: dict[tuple[str, str], NfsMount] = {}
        for m in mounts:
            seen[(m.mount, m.fstype)] = m  # the last one listed is the one on top
        for (mount, fstype), m in seen.items():
            labels = {"mount": mount, "fstype": fstype, "device": m.device}
            out.append(_sample(now, signals.STORAGE_READ_BYTES, m.read_bytes, labels))
            out.append(_sample(now, signals.STORAGE_WRITE_BYTES, m.write_bytes, labels))
            for op in self.nfs_ops:
                v = m.ops.get(op)
                if v is None or len(v) < 8:
                    continue
                op_labels = {**labels, "op": op}
                out.append(_sample(now, STORAGE_NFS_OPS, v[0], op_labels))
                out.append(_sample(now, STORAGE_NFS_RTT_MS, v[6], op_labels))
                out.append(_sample(now, STORAGE_NFS_EXEC_MS, v[7], op_labels))
            write = m.ops.get("WRITE")
            if write is not None and len(write) >= 8:
                self._write_latency((mount, fstype), write[0], write[7], labels, now, out)

    def _local(
        self,
        stats: dict[tuple[int, int], tuple[str, list[int]]],
        mounts: dict[tuple[int, int], tuple[str, str]],
        now: float,
        out: list[Record],
    ) -> None:
        for dev, (mount, fstype) in mounts.items():
            entry = stats.get(dev)
            if entry is None:
                continue  # not a block device (tmpfs, overlay, nfs, …)
            name, f = entry
            labels = {"mount": mount, "fstype": fstype, "device": name}
            out.append(_sample(now, signals.STORAGE_READ_BYTES, f[2] * SECTOR_BYTES, labels))
            out.append(_sample(now, signals.STORAGE_WRITE_BYTES, f[6] * SECTOR_BYTES, labels))
            self._write_latency((mount, fstype), f[4], f[7], labels, now, out)


def _sample(now: float, name: str, value: float, labels: dict[str, str]) -> Record:
    return {"type": "sample", "ts": now, "name": name, "value": value, "labels": labels}
