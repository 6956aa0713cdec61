"""The in-kernel histograms and the calls issue 17 added, on the real uprobes: latency per API
and process in log2 µs buckets, NCCL collectives by op, dtype and message-size bucket, CUDA
graph launches, device memory alloc/free and NCCL communicator init/abort (the stand-in
libraries of agent/ebpf/probe_target, calls of known count, size and duration)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.ebpf.collector import EbpfCollector
from agent.ebpf.probe_target import Built, Driver
from agent.tests.ebpf.loaded import loaded_or_skip
from agent.tests.ebpf.test_uprobes import HISTOGRAMS, of_pid, timed_ms
from contract import signals
from contract.trace import check_record

pytestmark = pytest.mark.bpf

Record = dict[str, Any]


@pytest.fixture
def collector() -> Iterator[EbpfCollector]:
    """Histograms sent at every collect (the agent's default sums them over 10 s)."""
    yield from loaded_or_skip(
        EbpfCollector(
            rescan_interval_s=0.0, node="test-node", detach_grace_s=0.0, histogram_every_s=0.0
        )
    )


@pytest.fixture
def driver(built: Built, collector: EbpfCollector) -> Iterator[Driver]:
    with Driver(built) as running:
        collector.collect(time.time())
        yield running


def histogram(records: list[Record], pid: int, name: str) -> dict[tuple[str, ...], float]:
    """(label values in key order) -> value, for one process's `name` samples."""
    out: dict[tuple[str, ...], float] = {}
    for r in records:
        assert check_record(r) is None, r
        if r[signals.PID] != pid or r["name"] != name:
            continue
        key = tuple(str(v) for _k, v in sorted(r["labels"].items()))
        assert key not in out, f"duplicate {name} {key}"
        out[key] = r["value"]
    return out


def test_latency_histograms_per_api_and_process(collector: EbpfCollector, driver: Driver) -> None:
    elapsed_ms = timed_ms(driver, "sync stream 10 2000")
    timed_ms(driver, "sync event 5 0", "graph 6 1000", "comm init 2 500")
    records = collector.collect(time.time())
    cuda = histogram(records, driver.pid, signals.CUDA_API_LATENCY_CALLS)
    nccl = histogram(records, driver.pid, signals.NCCL_API_LATENCY_CALLS)
    # keys sort as (api, le_us)
    sync = {int(le): n for (api, le), n in cuda.items() if api == "sync_stream"}
    assert sum(sync.values()) == 10
    # each call slept >= 2000 µs: bucket [1024, 2048) µs or above, and none longer than the
    # whole command took
    assert min(sync) >= 2048, sync
    assert max(sync) <= 2 * max(2048, int(elapsed_ms * 1000)), (sync, elapsed_ms)
    # bucket bounds are powers of two
    assert all(le & (le - 1) == 0 for le in sync)
    assert sum(n for (api, _le), n in cuda.items() if api == "sync_event") == 5
    graph = {int(le): n for (api, le), n in cuda.items() if api == "graph_launch"}
    assert sum(graph.values()) == 6 and min(graph) >= 1024
    init = {int(le): n for (api, le), n in nccl.items() if api == "comm_init"}
    assert sum(init.values()) == 2 and min(init) >= 512
    # the next interval starts empty: read and cleared like the other maps
    driver.command("launch 5")
    again = collector.collect(time.time())
    assert histogram(again, driver.pid, signals.CUDA_API_LATENCY_CALLS) == {}


def test_nccl_collectives_by_op_dtype_and_size_bucket(
    collector: EbpfCollector, driver: Driver
) -> None:
    timed_ms(
        driver,
        "nccl allreduce 4 1048576 7 0",  # float32: 4 MiB = 2^22 bytes -> [2^22, 2^23)
        "nccl allreduce 3 1000 9 0",  # bfloat16: 2000 bytes -> [1024, 2048)
        "nccl allgather 2 16 6 0",  # float16: 32 bytes -> [32, 64)
        "nccl send 1 0 7 0",  # 0 bytes: bucket 0
    )
    records = collector.collect(time.time())
    calls = histogram(records, driver.pid, signals.NCCL_COLLECTIVE_CALLS)
    ms = histogram(records, driver.pid, signals.NCCL_COLLECTIVE_MS)
    # keys sort as (dtype, op, size_le)
    assert calls == {
        ("float32", "allreduce", str(2**23)): 4,
        ("bfloat16", "allreduce", "2048"): 3,
        ("float16", "allgather", "64"): 2,
        ("float32", "send", "1"): 1,
    }
    assert set(ms) == set(calls) and all(v >= 0.0 for v in ms.values())
    # the per-op totals still add up to the same calls
    per_op = of_pid(records, driver.pid)
    assert per_op[(signals.NCCL_CALLS, "allreduce")] == 7
    assert per_op[(signals.NCCL_BYTES, "allreduce")] == 4 * 2**22 + 3 * 2000


def test_graph_launches_memory_and_communicators(
    built: Built, collector: EbpfCollector, driver: Driver
) -> None:
    attached = {
        path: set(symbols)
        for path, symbols in collector.attached_libraries.items()
        if path.endswith((str(built.libcuda), str(built.libnccl)))
    }
    probed = set().union(*attached.values())
    assert {"cuGraphLaunch", "cuMemAlloc_v2", "cuMemAllocAsync", "cuMemFree_v2"} <= probed
    assert {"cuMemFreeAsync", "ncclCommInitRank", "ncclCommInitRankConfig"} <= probed
    assert "ncclCommAbort" in probed
    elapsed = timed_ms(driver, "graph 3 1000")
    timed_ms(
        driver,
        "alloc 4 1048576 0",
        "allocasync 2 4096 0",
        "comm init 2 0",
        "comm initconfig 1 0",
        "comm abort 1 0",
    )
    values = of_pid(collector.collect(time.time()), driver.pid)
    assert values[(signals.CUDA_GRAPH_LAUNCHES, None)] == 3
    assert 3.0 <= values[(signals.CUDA_GRAPH_LAUNCH_MS, None)] <= elapsed
    assert values[(signals.CUDA_MEM_ALLOCS, None)] == 6
    assert values[(signals.CUDA_MEM_ALLOC_BYTES, None)] == 4 * 1048576 + 2 * 4096
    assert values[(signals.CUDA_MEM_FREES, None)] == 6
    assert values[(signals.NCCL_COMM_INITS, None)] == 3
    assert values[(signals.NCCL_COMM_ABORTS, None)] == 1
    assert (signals.NCCL_COMM_INIT_MS, None) in values
    assert not HISTOGRAMS & {name for name, _ in values}


def test_histograms_are_summed_between_sends(built: Built) -> None:
    for collector in loaded_or_skip(
        EbpfCollector(rescan_interval_s=0.0, node="test-node", detach_grace_s=0.0)
    ):
        with Driver(built) as driver:
            collector.collect(time.time())  # attaches; the first send is due at once
            driver.command("sync stream 3 0")
            first = collector.collect(time.time())
            driver.command("sync stream 4 0")
            second = collector.collect(time.time())
            # within 10 s of the last send nothing is sent; the counts are kept, not lost
            assert histogram(first, driver.pid, signals.CUDA_API_LATENCY_CALLS) == {}
            assert histogram(second, driver.pid, signals.CUDA_API_LATENCY_CALLS) == {}
            collector._next_hist_ns = 0  # the 10 s have passed
            third = histogram(
                collector.collect(time.time()), driver.pid, signals.CUDA_API_LATENCY_CALLS
            )
            assert sum(n for (api, _le), n in third.items() if api == "sync_stream") == 7
