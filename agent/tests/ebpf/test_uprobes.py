"""The real uprobes on a stand-in libcuda/libnccl: attach through the driver's memory maps,
make known calls, and assert what the kernel-side aggregation reads back."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.ebpf import bpfsys
from agent.ebpf.collector import EbpfCollector
from agent.ebpf.probe_target import Built, Driver
from contract import signals
from contract.trace import check_record

pytestmark = pytest.mark.bpf

Record = dict[str, Any]
HISTOGRAMS = frozenset(
    {
        signals.CUDA_API_LATENCY_CALLS,
        signals.NCCL_API_LATENCY_CALLS,
        signals.NCCL_COLLECTIVE_CALLS,
        signals.NCCL_COLLECTIVE_MS,
    }
)


def of_pid(records: list[Record], pid: int) -> dict[tuple[str, str | None], float]:
    """(name, label value) -> value, for one process's samples."""
    out: dict[tuple[str, str | None], float] = {}
    for record in records:
        assert record["type"] == "sample"
        assert check_record(record) is None, (check_record(record), record)
        if record[signals.PID] != pid or record["name"] in HISTOGRAMS:
            continue  # the histograms have labels of their own: test_uprobe_histograms.py
        labels = record.get("labels") or {}
        label = labels.get("op") or labels.get("kind")
        key = (record["name"], label)
        assert key not in out, f"duplicate sample {key}"
        out[key] = record["value"]
    return out


def mine(collector: EbpfCollector, built: Built) -> dict[str, list[str]]:
    """The attached libraries that are this test's build (other tests may run alongside)."""
    return {
        path: symbols
        for path, symbols in collector.attached_libraries.items()
        if path.endswith(str(built.libcuda)) or path.endswith(str(built.libnccl))
    }


@pytest.fixture
def driver(built: Built, collector: EbpfCollector) -> Iterator[Driver]:
    """The stand-in driver running, found through its maps and probed by the collector's
    first interval."""
    with Driver(built) as running:
        collector.collect(time.time())
        yield running


def timed_ms(driver: Driver, *commands: str) -> float:
    """Run `commands` one after the other; the wall milliseconds they took, seen from here."""
    started = time.monotonic()
    for command in commands:
        driver.command(command)
    return (time.monotonic() - started) * 1000.0


def test_counts_durations_gaps_and_bytes_read_back_exactly(
    built: Built, collector: EbpfCollector, driver: Driver
) -> None:
    attached = mine(collector, built)
    assert len(attached) == 2, collector.attached_libraries
    cuda_symbols = next(s for p, s in attached.items() if p.endswith("libcuda.so.1"))
    nccl_symbols = next(s for p, s in attached.items() if p.endswith("libnccl.so.2"))
    assert {"cuLaunchKernel", "cuStreamSynchronize", "cuMemcpyHtoD_v2"} <= set(cuda_symbols)
    assert "cuLaunchKernel_ptsz" not in cuda_symbols  # not exported by the stand-in
    assert {"ncclAllReduce", "ncclGroupStart", "ncclGroupEnd"} <= set(nccl_symbols)
    assert "ncclBcast" not in nccl_symbols

    # Synchronize: 20 x 2 ms stream, 5 x 1 ms event, 3 x 1 ms context.
    # Durations are bounded below by the sleeps the stand-in does and above by the wall
    # time the commands took as seen from here, which holds however loaded the machine is.
    elapsed: dict[str, float] = {}
    elapsed["sync"] = timed_ms(
        driver, "sync stream 20 2000", "sync event 5 1000", "sync ctx 3 1000"
    )
    # Copies: (kind, calls, bytes each)
    timed_ms(
        driver,
        "memcpy htod 10 1048576 0",
        "memcpy htod_async 2 4096 0",
        "memcpy dtoh 4 4096 0",
        "memcpy dtoh_async 1 100 0",
        "memcpy dtod 2 123 0",
        "memcpy any 3 1000 0",
        "memcpy any_async 1 5 0",
        "memcpy peer 2 777 0",
    )
    # Collectives: op, calls, count, ncclDataType_t, microseconds inside the call.
    elapsed["allreduce"] = timed_ms(driver, "nccl allreduce 10 1048576 7 1000")  # float32
    timed_ms(
        driver,
        "nccl allgather 5 1000 6 0",  # float16
        "nccl reducescatter 3 2048 9 0",  # bfloat16
        "nccl broadcast 4 999 0 0",  # int8
        "nccl reduce 2 100 8 0",  # float64
        "nccl reduce 1 100 42 0",  # unknown type: counted, 0 bytes
        "nccl send 3 10 2 0",  # int32
        "nccl recv 1 7 5 0",  # uint64
    )
    # Each: nested groups around send+recv of 256 float32.
    elapsed["group"] = timed_ms(driver, "group 2 5000")
    # Launches last, so the longest gap is the pause: 500, 300 ms, 500 + 7 Ex + 4 threads.
    elapsed["pause"] = timed_ms(driver, "launch 500", "pause 300", "launch 500")
    timed_ms(driver, "launchex 7", "threads 4 1000")
    values = of_pid(collector.collect(time.time()), driver.pid)

    assert values[(signals.CUDA_LAUNCHES, None)] == 500 + 500 + 7 + 4 * 1000
    gap = values[(signals.CUDA_LAUNCH_GAP_MAX_MS, None)]
    # Both launches around the pause happened within the three commands' wall time.
    assert 300.0 <= gap <= elapsed["pause"], (gap, elapsed)

    assert values[(signals.CUDA_SYNCS, None)] == 28
    sync_ms = values[(signals.CUDA_SYNC_MS, None)]
    expected_sync_ms = 20 * 2.0 + 5 * 1.0 + 3 * 1.0
    assert expected_sync_ms <= sync_ms <= elapsed["sync"], (sync_ms, elapsed)
    assert 2.0 <= values[(signals.CUDA_SYNC_MAX_MS, None)] < 20.0

    memcpy = {
        "htod": (12, 10 * 1048576 + 2 * 4096),
        "dtoh": (5, 4 * 4096 + 100),
        "dtod": (2, 2 * 123),
        "any": (4, 3 * 1000 + 5),
        "peer": (2, 2 * 777),
    }
    for kind, (calls, nbytes) in memcpy.items():
        assert values[(signals.CUDA_MEMCPY_CALLS, kind)] == calls, kind
        assert values[(signals.CUDA_MEMCPY_BYTES, kind)] == nbytes, kind
        assert values[(signals.CUDA_MEMCPY_MS, kind)] >= 0.0

    group_bytes = 2 * 256 * 4
    nccl = {
        "allreduce": (10, 10 * 1048576 * 4),
        "allgather": (5, 5 * 1000 * 2),
        "reducescatter": (3, 3 * 2048 * 2),
        "broadcast": (4, 4 * 999),
        "reduce": (3, 2 * 100 * 8),
        "send": (3 + 2, 3 * 10 * 4 + group_bytes),
        "recv": (1 + 2, 7 * 8 + group_bytes),
    }
    assert set(nccl) == set(signals.NCCL_OPS)
    for op, (calls, nbytes) in nccl.items():
        assert values[(signals.NCCL_CALLS, op)] == calls, op
        assert values[(signals.NCCL_BYTES, op)] == nbytes, op
    allreduce_ms = values[(signals.NCCL_MS, "allreduce")]
    assert 10.0 <= allreduce_ms <= elapsed["allreduce"], (allreduce_ms, elapsed)
    assert values[(signals.NCCL_GROUPS, None)] == 2  # outermost groups only
    assert 10.0 <= values[(signals.NCCL_GROUP_MS, None)] <= elapsed["group"]


def test_each_interval_is_read_and_cleared_and_an_idle_process_shows_a_growing_gap(
    collector: EbpfCollector, driver: Driver
) -> None:
    driver.command("launch 100")
    driver.command("nccl allreduce 3 16 7 0")
    first = of_pid(collector.collect(time.time()), driver.pid)
    assert first[(signals.CUDA_LAUNCHES, None)] == 100
    assert first[(signals.NCCL_CALLS, "allreduce")] == 3

    driver.command("launch 40")
    second = of_pid(collector.collect(time.time()), driver.pid)
    assert second[(signals.CUDA_LAUNCHES, None)] == 40  # not 140: the first was cleared
    assert (signals.NCCL_CALLS, "allreduce") not in second

    time.sleep(0.4)
    idle = of_pid(collector.collect(time.time()), driver.pid)
    assert idle[(signals.CUDA_LAUNCHES, None)] == 0
    assert idle[(signals.CUDA_LAUNCH_GAP_MAX_MS, None)] >= 400.0
    assert idle[(signals.CUDA_SYNC_MS, None)] == 0.0


def test_a_synchronize_call_still_blocked_is_reported_until_it_returns(
    collector: EbpfCollector, driver: Driver
) -> None:
    driver.command("launch 3")
    collector.collect(time.time())
    started = time.monotonic()
    driver.send("sync stream 1 900000")  # blocks 0.9 s
    time.sleep(0.3)
    blocked = of_pid(collector.collect(time.time()), driver.pid)
    waited_ms = (time.monotonic() - started) * 1000.0
    assert 300.0 <= blocked[(signals.CUDA_SYNC_OPEN_MS, None)] <= waited_ms
    assert blocked[(signals.CUDA_SYNC_MS, None)] == 0.0  # not returned yet
    assert (signals.CUDA_SYNCS, None) not in blocked
    driver.wait()
    returned = of_pid(collector.collect(time.time()), driver.pid)
    assert returned[(signals.CUDA_SYNCS, None)] == 1
    assert returned[(signals.CUDA_SYNC_MS, None)] >= 900.0
    assert (signals.CUDA_SYNC_OPEN_MS, None) not in returned


def test_a_process_started_later_is_found_and_one_library_file_is_probed_once(
    built: Built, collector: EbpfCollector
) -> None:
    assert mine(collector, built) == {}
    collector.collect(time.time())
    with Driver(built) as first, Driver(built) as second:
        collector.collect(time.time())
        # Two processes, one file each for libcuda and libnccl: probed once, counted per pid.
        assert len(mine(collector, built)) == 2
        first.command("launch 10")
        second.command("launch 25")
        second.command("nccl send 2 8 7 0")
        records = collector.collect(time.time())
        assert of_pid(records, first.pid)[(signals.CUDA_LAUNCHES, None)] == 10
        assert of_pid(records, second.pid)[(signals.CUDA_LAUNCHES, None)] == 25
        assert of_pid(records, second.pid)[(signals.NCCL_BYTES, "send")] == 64
        assert (signals.NCCL_BYTES, "send") not in of_pid(records, first.pid)
        for record in records:
            assert record[signals.NODE] == "test-node"


def test_an_exited_process_is_reported_once_more_then_forgotten_and_probes_detached(
    built: Built, collector: EbpfCollector
) -> None:
    driver = Driver(built)
    pid = driver.pid
    try:
        collector.collect(time.time())
        driver.command("launch 33")
    finally:
        assert driver.close() == 0
    # The calls made before it exited are still delivered...
    assert of_pid(collector.collect(time.time()), pid)[(signals.CUDA_LAUNCHES, None)] == 33
    # ...then nothing more for that pid, and no process maps the library files any more.
    assert of_pid(collector.collect(time.time()), pid) == {}
    assert mine(collector, built) == {}
    assert pid not in collector.last_launches()
    # The probes are removed a few per interval (each takes the kernel ~0.1 s), then gone.
    for _ in range(200):
        if collector.pending_detach == 0:
            break
        collector.collect(time.time())
    assert collector.pending_detach == 0
    assert collector.probe_fds == {
        fd for path in collector.attached_libraries for fd in collector.probes_of(path)
    }


def test_a_job_restarting_within_the_grace_period_keeps_its_probes(built: Built) -> None:
    collector = EbpfCollector(rescan_interval_s=0.0, detach_grace_s=60.0)
    if not collector.start():
        pytest.skip(collector.unavailable_reason or "BPF programs cannot be loaded")
    try:
        with Driver(built):
            collector.collect(time.time())
        events_before = collector.probe_fds
        collector.collect(time.time())  # the first run exited: within the grace period
        assert len(mine(collector, built)) == 2 and collector.pending_detach == 0
        with Driver(built) as restarted:
            restarted.command("launch 12")
            values = of_pid(collector.collect(time.time()), restarted.pid)
        assert values[(signals.CUDA_LAUNCHES, None)] == 12
        assert collector.probe_fds == events_before  # nothing attached again
    finally:
        collector.close()


def test_probe_groups_left_out_are_not_attached(built: Built) -> None:
    collector = EbpfCollector(rescan_interval_s=0.0, probe_groups=("sync", "nccl"))
    if not collector.start():
        pytest.skip(collector.unavailable_reason or "BPF programs cannot be loaded")
    try:
        with Driver(built) as driver:
            collector.collect(time.time())
            symbols = [s for symbols in mine(collector, built).values() for s in symbols]
            assert "cuStreamSynchronize" in symbols and "ncclAllReduce" in symbols
            assert not [s for s in symbols if s.startswith(("cuLaunch", "cuMemcpy"))]
            driver.command("launch 50")
            driver.command("sync stream 2 0")
            values = of_pid(collector.collect(time.time()), driver.pid)
        assert values[(signals.CUDA_SYNCS, None)] == 2
        # Not probed: not reported (a zero would claim the process launched nothing).
        assert (signals.CUDA_LAUNCHES, None) not in values
        assert (signals.CUDA_LAUNCH_GAP_MAX_MS, None) not in values
    finally:
        collector.close()


def test_batch_map_reads_and_deletes_agree_with_the_per_key_commands(
    collector: EbpfCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bpfsys.items() (BPF_MAP_LOOKUP_BATCH) and its per-key fallback (old kernels) return the
    same entries; delete_many() removes the keys given, one already gone included."""
    table = collector._map("last_launch")  # LRU hash u32 pid -> u64 ktime
    entries = {struct.pack("<I", 100_000 + i): struct.pack("<Q", 7 * i) for i in range(300)}
    for key, value in entries.items():
        bpfsys.update(table, key, value)
    batched = dict(bpfsys.items(table, 4, 8, chunk=16))  # several batch calls
    monkeypatch.setattr(bpfsys, "_batch_supported", False)
    per_key = dict(bpfsys.items(table, 4, 8))
    monkeypatch.undo()
    assert {k: batched[k] for k in entries} == entries
    assert per_key == batched
    assert bpfsys.delete(table, struct.pack("<I", 100_000))
    # The first key is gone already: a DELETE_BATCH stops there, and the rest still go.
    bpfsys.delete_many(table, list(entries), 4)
    assert not set(dict(bpfsys.items(table, 4, 8))) & set(entries)
