import time
from pathlib import Path

import pytest

from agent.collectors.host import HostCollector, cpu_times, mem_used_bytes
from contract import signals
from contract.trace import check_record

MEMINFO = """\
MemTotal:       16303428 kB
MemFree:         1021548 kB
MemAvailable:    9876540 kB
Buffers:          514220 kB
Cached:          7601824 kB
HugePages_Total:       0
"""


def write_stat(root: Path, user: int, idle: int, iowait: int) -> None:
    (root / "stat").write_text(
        f"cpu  {user} 0 100 {idle} {iowait} 0 0 0 0 0\n"
        f"cpu0 {user} 0 100 {idle} {iowait} 0 0 0 0 0\n"
        "intr 0\nbtime 1700000000\n"
    )


def test_cpu_util_from_deltas_and_mem_used(tmp_path: Path) -> None:
    write_stat(tmp_path, user=1000, idle=5000, iowait=100)
    (tmp_path / "meminfo").write_text(MEMINFO)
    col = HostCollector(tmp_path)
    first = col.collect(1.0)
    assert [r["name"] for r in first] == [signals.HOST_MEM_USED_BYTES]  # baseline for CPU
    assert first[0]["value"] == (16303428 - 9876540) * 1024
    write_stat(tmp_path, user=1300, idle=5600, iowait=200)  # +300 busy, +700 idle/iowait
    second = {r["name"]: r for r in col.collect(2.0)}
    assert second[signals.HOST_CPU_UTIL]["value"] == pytest.approx(0.3)
    assert all(check_record(r) is None for r in second.values())
    assert "pid" not in second[signals.HOST_CPU_UTIL]  # node scope


def test_meminfo_without_memavailable() -> None:
    text = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 250 kB\n"
    assert mem_used_bytes(text) == (1000 - 400) * 1024
    assert mem_used_bytes("garbage") is None
    assert cpu_times("no cpu line") is None


def test_unreadable_proc_returns_nothing(tmp_path: Path) -> None:
    assert HostCollector(tmp_path / "nope").collect(1.0) == []


def test_this_machines_proc() -> None:
    col = HostCollector("/proc")
    col.collect(time.time())
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        pass  # burn some CPU so the interval is not empty
    got = {r["name"]: r["value"] for r in col.collect(time.time())}
    assert 0.0 < got[signals.HOST_CPU_UTIL] <= 1.0
    total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    assert 0 < got[signals.HOST_MEM_USED_BYTES] < total
