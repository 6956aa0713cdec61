import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.storage import (
    STORAGE_NFS_EXEC_MS,
    STORAGE_NFS_OPS,
    StorageCollector,
    parse_diskstats,
    parse_mountinfo,
    parse_mountstats,
)
from contract import signals
from contract.trace import check_record

DATA = Path(__file__).parent / "data" / "proc"
MOUNTINFO = """\
22 1 8:4 / / rw,relatime shared:1 - ext4 /dev/sda4 rw
23 22 259:2 / /data rw,relatime shared:2 - xfs /dev/nvme0n1p2 rw
24 22 252:0 / /home rw,relatime shared:3 - ext4 /dev/mapper/vg-home rw
25 22 0:25 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw
26 23 8:4 /var/lib/docker /var/lib/docker/overlay2/x rw shared:1 - ext4 /dev/sda4 rw
27 22 0:50 / /mnt/nfs/test rw,relatime shared:5 - nfs4 192.168.1.1:/srv/test rw
"""


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True)
    shutil.copy(DATA / "mountstats_nfs.txt", root / "self" / "mountstats")
    shutil.copy(DATA / "diskstats.txt", root / "diskstats")
    (root / "self" / "mountinfo").write_text(MOUNTINFO)
    return root


def pick(records: list[dict[str, Any]], name: str, **labels: str) -> list[dict[str, Any]]:
    return [
        r
        for r in records
        if r["name"] == name and all(r["labels"].get(k) == v for k, v in labels.items())
    ]


def test_parse_mountstats_fixture() -> None:
    mounts = parse_mountstats((DATA / "mountstats_nfs.txt").read_text())
    assert [(m.mount, m.fstype) for m in mounts] == [
        ("/mnt/nfs/test", "nfs4"),
        ("/mnt/nfs/test-dupe", "nfs4"),
        ("/mnt/nfs/test-dupe", "nfs"),
    ]
    m = mounts[0]
    assert m.device == "192.168.1.1:/srv/test"
    assert m.read_bytes == 1207640230 and m.write_bytes == 0
    assert m.ops["READ"] == [1298, 1298, 0, 207680, 1210292152, 6, 79386, 79407]
    assert mounts[1].ops["ACCESS"][5] == 18446743919241604546  # reported as read (wrapped)


def test_parse_diskstats_all_variants() -> None:
    stats = parse_diskstats((DATA / "diskstats.txt").read_text())
    assert stats[(8, 4)][0] == "sda4" and len(stats[(8, 4)][1]) == 11
    # sda, sdb and sdc all say 8:0 in this fixture; the last (20-field flush variant) wins
    assert stats[(8, 0)][0] == "sdc" and len(stats[(8, 0)][1]) == 17
    assert stats[(8, 0)][1][15:] == [1555, 1944]
    assert len(stats[(8, 1)][1]) == 17 and stats[(8, 1)][0] == "sdc1"
    assert stats[(259, 2)] == (
        "nvme0n1p2",
        [45914, 4, 4631243, 21626, 1036885, 43950, 39451632, 919480, 0, 131580, 940970],
    )


def test_mountinfo_keeps_shortest_mount_per_device() -> None:
    info = parse_mountinfo(MOUNTINFO)
    assert info[(8, 4)] == ("/", "ext4")
    assert info[(259, 2)] == ("/data", "xfs")


def test_first_collect_cumulative_bytes(proc: Path) -> None:
    records = StorageCollector(proc).collect(10.0)
    assert all(check_record(r) is None for r in records)
    nfs = pick(records, signals.STORAGE_READ_BYTES, mount="/mnt/nfs/test", fstype="nfs4")
    assert [r["value"] for r in nfs] == [1207640230]
    assert nfs[0]["labels"]["device"] == "192.168.1.1:/srv/test"
    assert len(pick(records, signals.STORAGE_READ_BYTES, mount="/mnt/nfs/test-dupe")) == 2
    root_w = pick(records, signals.STORAGE_WRITE_BYTES, mount="/")
    assert [r["value"] for r in root_w] == [505696880 * 512]
    assert root_w[0]["labels"] == {"mount": "/", "fstype": "ext4", "device": "sda4"}
    assert [r["value"] for r in pick(records, signals.STORAGE_READ_BYTES, mount="/home")] == [
        1003337218 * 512
    ]
    assert not pick(records, signals.STORAGE_READ_BYTES, mount="/dev/shm")  # noqa: S108 - a mount label the collector must skip, not a file
    assert not pick(records, signals.STORAGE_READ_BYTES, mount="/var/lib/docker/overlay2/x")
    ops = pick(records, STORAGE_NFS_OPS, mount="/mnt/nfs/test", op="READ")
    assert [r["value"] for r in ops] == [1298]
    assert [
        r["value"] for r in pick(records, STORAGE_NFS_EXEC_MS, op="READ", mount="/mnt/nfs/test")
    ] == [79407]
    assert not pick(records, signals.STORAGE_WRITE_MS)  # no interval yet


def test_write_latency_over_the_interval(proc: Path) -> None:
    col = StorageCollector(proc)
    col.collect(10.0)
    ms = proc / "self" / "mountstats"
    text = ms.read_text()
    first_write = "\t       WRITE: 0 0 0 0 0 0 0 0\n"
    assert first_write in text
    ms.write_text(text.replace(first_write, "\t       WRITE: 10 10 0 40960 1280 30 200 250\n", 1))
    ds = proc / "diskstats"
    ds.write_text(
        ds.read_text().replace(
            "8       4 sda4 25353629 34367650 1003337964 18492232 27448755 11134218 505696880 "
            "61593380",
            "8       4 sda4 25353629 34367650 1003337964 18492232 27448855 11134218 505697880 "
            "61593880",
        )
    )
    records = col.collect(11.0)
    nfs = pick(records, signals.STORAGE_WRITE_MS, mount="/mnt/nfs/test")
    assert [r["value"] for r in nfs] == [25.0]  # 250 ms over 10 WRITEs
    sda = pick(records, signals.STORAGE_WRITE_MS, mount="/")
    assert [r["value"] for r in sda] == [5.0]  # 500 ms over 100 writes
    assert [r["value"] for r in pick(records, signals.STORAGE_WRITE_BYTES, mount="/")] == [
        505697880 * 512
    ]
    assert not pick(records, signals.STORAGE_WRITE_MS, mount="/data")  # no writes: no sample


def test_missing_files_return_nothing(tmp_path: Path) -> None:
    assert StorageCollector(tmp_path).collect(1.0) == []


def test_this_machines_proc() -> None:
    col = StorageCollector("/proc")
    first = col.collect(1.0)
    assert all(check_record(r) is None for r in first)
    stats = parse_diskstats(Path("/proc/diskstats").read_text())
    info = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    local_mounts = {info[d][0] for d in info if d in stats}
    reported = {r["labels"]["mount"] for r in first if r["labels"]["fstype"] not in ("nfs", "nfs4")}
    assert reported == local_mounts


def test_paths_can_be_given_one_by_one(tmp_path: Path) -> None:
    shutil.copy(DATA / "mountstats_nfs.txt", tmp_path / "ms")
    shutil.copy(DATA / "diskstats.txt", tmp_path / "ds")
    (tmp_path / "mi").write_text(MOUNTINFO)
    col = StorageCollector(
        tmp_path / "no-proc-here",
        mountstats_path=tmp_path / "ms",
        diskstats_path=tmp_path / "ds",
        mountinfo_path=tmp_path / "mi",
    )
    mounts = {r["labels"]["mount"] for r in col.collect(1.0)}
    assert {"/mnt/nfs/test", "/", "/data", "/home"} <= mounts
