"""The real faults the machine can inject: CPU caps and write caps (cgroups) and a slow mount
(a loop-device ext4 filesystem). Root only; each helper raises `Unavailable` with the precise
reason when this machine cannot do it, and the tests skip with that reason.

cgroup v2 (`/sys/fs/cgroup` is cgroup2: `cpu.max`, `io.max`) and v1 (the hybrid layout of many
hosts and containers: `cpu/…/cpu.cfs_quota_us`, `blkio/…/blkio.throttle.write_bps_device`)
are both supported: the two express the same caps.

**Why the write cap goes on the disk *under* the loop device.** A throttle on the loop device
itself holds the writes before they are issued, so the loop device's own statistics (what
`/proc/diskstats` — and the agent's `storage.write_ms` — report) still read a few ms per
write: the mount would be slow but look fast. A loop device with direct I/O passes each write
on to the backing file's disk, and its worker charges that I/O to the cgroup of the process
that wrote; capping the writer's cgroup on the backing disk therefore makes every write to
the mount wait, and the loop device's latency shows it (measured: ~1000 ms per write at a
1 MiB/s cap, ~2 ms without) — as a slow network or cloud volume looks to its client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class Unavailable(Exception):
    """This machine cannot inject the fault; the message says exactly why."""


def _need_root() -> None:
    if os.geteuid() != 0:
        raise Unavailable(f"needs root (running as uid {os.geteuid()})")


def cgroup_version() -> int:
    """2 when /sys/fs/cgroup is the unified hierarchy, 1 for the v1/hybrid layout."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if (CGROUP_ROOT / "cpu").is_dir() or (CGROUP_ROOT / "blkio").is_dir():
        return 1
    raise Unavailable(f"no cgroup filesystem at {CGROUP_ROOT}")


def _enable_v2_controller(controller: str) -> None:
    available = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
    if controller not in available:
        raise Unavailable(
            f"cgroup v2 controller {controller!r} is not available at {CGROUP_ROOT} "
            f"(cgroup.controllers: {' '.join(available) or 'none'})"
        )
    control = CGROUP_ROOT / "cgroup.subtree_control"
    if controller not in control.read_text().split():
        try:
            control.write_text(f"+{controller}")
        except OSError as exc:
            raise Unavailable(f"cannot enable +{controller} in {control}: {exc}") from exc


@dataclass
class Cgroup:
    """One cgroup directory; a process joins it by writing its pid to `procs`."""

    path: Path

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def read(self, name: str) -> str:
        return (self.path / name).read_text()

    def remove(self) -> None:
        # The processes it held have exited by now; the kernel may take a moment to notice.
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def _make(controller_dir: Path, name: str) -> Cgroup:
    path = controller_dir / f"proof-workloads-{name}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        raise Unavailable(f"cannot create cgroup {path}: {exc}") from exc
    return Cgroup(path)


def _v1_group(hierarchy: str, probe: str, missing: str, name: str) -> Cgroup:
    """A new cgroup in the v1 `hierarchy`, whose controller file `probe` must exist."""
    base = CGROUP_ROOT / hierarchy
    if not (base / probe).exists():
        raise Unavailable(f"{missing} at {base}")
    return _make(base, name)


def _limit_group(
    name: str, *, v2: tuple[str, str, str], v1: tuple[str, str, str], v1_missing: str
) -> tuple[Cgroup, str, str]:
    """A new cgroup `name` and the (setting, value) of its limit, for the cgroup version this
    host runs: `v2` and `v1` are (controller or hierarchy, setting file, value); a v1 host
    without the setting file is `v1_missing`."""
    if cgroup_version() == 2:
        controller, setting, value = v2
        _enable_v2_controller(controller)
        return _make(CGROUP_ROOT, name), setting, value
    hierarchy, setting, value = v1
    return _v1_group(hierarchy, setting, v1_missing, name), setting, value


@contextlib.contextmanager
def _limited(cg: Cgroup, setting: str, value: str, error: str) -> Iterator[Cgroup]:
    """Writes the limit `setting` = `value`, yields the cgroup, removes it at the end."""
    try:
        try:
            (cg.path / setting).write_text(value)
        except OSError as exc:
            raise Unavailable(f"{error}: {exc}") from exc
        yield cg
    finally:
        cg.remove()


@contextlib.contextmanager
def cpu_cap(name: str, cores: float) -> Iterator[Cgroup]:
    """A cgroup whose members together get at most `cores` CPUs (CFS bandwidth control)."""
    _need_root()
    period = 100_000
    quota = max(1000, int(cores * period))
    cg, setting, value = _limit_group(
        name,
        v2=("cpu", "cpu.max", f"{quota} {period}"),
        v1=("cpu", "cpu.cfs_quota_us", str(quota)),
        v1_missing="cgroup v1 cpu controller with CFS quota not mounted",
    )
    if setting == "cpu.cfs_quota_us":  # v1 keeps the period in a file of its own
        (cg.path / "cpu.cfs_period_us").write_text(str(period))
    with _limited(cg, setting, value, f"cannot write {cg.path / setting}"):
        yield cg


def throttled_periods(cg: Cgroup) -> int:
    """How many CFS periods the cgroup was throttled in (cpu.stat nr_throttled)."""
    for line in cg.read("cpu.stat").splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            return int(value)
    return 0


@contextlib.contextmanager
def write_cap(name: str, device: str, bytes_per_s: int) -> Iterator[Cgroup]:
    """A cgroup whose members' writes to block device `device` ("MAJ:MIN", a whole disk) are
    capped at `bytes_per_s`."""
    _need_root()
    cg, setting, value = _limit_group(
        name,
        v2=("io", "io.max", f"{device} wbps={bytes_per_s}"),
        v1=("blkio", "blkio.throttle.write_bps_device", f"{device} {bytes_per_s}"),
        v1_missing="cgroup v1 blkio throttling is not available",
    )
    with _limited(cg, setting, value, f"cannot set {setting} = {value!r} on {cg.path}"):
        yield cg


def in_cgroup(cg: Cgroup, argv: list[str]) -> list[str]:
    """`argv` run inside `cg`: a shell joins the cgroup, then execs the command."""
    return ["sh", "-c", f'echo $$ > {cg.procs} && exec "$@"', "sh", *argv]


@dataclass
class LoopMount:
    mount: Path  # where the filesystem is mounted
    loop_device: str  # /dev/loopN
    loop_majmin: str  # the loop device's MAJ:MIN (its diskstats line)
    backing_disk: str  # MAJ:MIN of the whole disk holding the image (where a write cap goes)


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Unavailable(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def _whole_disk(majmin: str) -> str:
    """The whole disk of a partition's MAJ:MIN (block throttling applies to whole disks)."""
    sys_dev = Path("/sys/dev/block") / majmin
    if not sys_dev.exists():
        raise Unavailable(f"{sys_dev} does not exist: not a block device")
    real = sys_dev.resolve()
    if (real / "partition").exists():
        return (real.parent / "dev").read_text().strip()
    return majmin


@contextlib.contextmanager
def loop_mount(image_dir: Path, name: str, size_mib: int = 96) -> Iterator[LoopMount]:
    """A fresh ext4 filesystem on a loop device with direct I/O, mounted under `image_dir`."""
    _need_root()
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} is not installed (Debian packages mount, e2fsprogs)")
    if not Path("/dev/loop-control").exists():
        raise Unavailable("no /dev/loop-control: this kernel/container has no loop devices")
    image = image_dir / f"{name}.img"
    mount = image_dir / name
    with open(image, "wb") as fh:
        fh.truncate(size_mib << 20)
    st = os.stat(image)
    if os.major(st.st_dev) == 0:
        image.unlink()
        raise Unavailable(
            f"{image_dir} is on a filesystem without a block device (st_dev 0:"
            f"{os.minor(st.st_dev)}: tmpfs/overlay): a write cap on its disk cannot apply"
        )
    backing = _whole_disk(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    device = ""
    mounted = False
    try:
        device = _run(["losetup", "--find", "--show", "--direct-io=on", str(image)])
        dio = Path(f"/sys/block/{Path(device).name}/loop/dio")
        if dio.exists() and dio.read_text().strip() != "1":
            raise Unavailable(
                f"{device} did not get direct I/O (the filesystem of {image_dir} refuses "
                "O_DIRECT): its writes would not reach the capped disk in the writer's cgroup"
            )
        _run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", device])
        mount.mkdir()
        _run(["mount", device, str(mount)])
        mounted = True
        majmin = Path(f"/sys/block/{Path(device).name}/dev").read_text().strip()
        yield LoopMount(mount, device, majmin, backing)
    finally:
        if mounted:
            for _ in range(20):
                if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.25)
            else:
                subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        if device:
            subprocess.run(["losetup", "-d", device], capture_output=True)
        with contextlib.suppress(OSError):
            mount.rmdir()
        with contextlib.suppress(OSError):
            image.unlink()
