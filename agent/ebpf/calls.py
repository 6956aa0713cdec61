"""What is probed: the call classes shared with probes.c, and the symbol → BPF function table.

`Call` values are compiled into probes.c as `-DW_<NAME>=<value>`, so the kernel side and the
reader here cannot disagree. `PROBES` lists, per library kind, every symbol the agent attaches
to; symbols a given library build does not export are skipped (the per-thread-default-stream
`_ptsz`/`_ptds` variants, for instance, exist only in libcuda, not in every wrapper).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum

from contract import signals

CUDA = "cuda"
NCCL = "nccl"

# Basenames in /proc/<pid>/maps that are the libraries we probe: libcuda.so, libcuda.so.1,
# libcuda.so.550.54.15; libnccl.so.2, libnccl.so.2.21.5.
LIBRARY_PATTERNS: dict[str, re.Pattern[str]] = {
    CUDA: re.compile(r"^libcuda\.so(\.\d+)*$"),
    NCCL: re.compile(r"^libnccl\.so(\.\d+)*$"),
}


class Call(IntEnum):
    """A call class: one row per process in the kernel's `stats` map."""

    LAUNCH = 0
    SYNC_STREAM = 1
    SYNC_EVENT = 2
    SYNC_CTX = 3
    MEMCPY_HTOD = 4
    MEMCPY_DTOH = 5
    MEMCPY_DTOD = 6
    MEMCPY_ANY = 7  # cuMemcpy/cuMemcpyAsync: unified addressing, direction not in the call
    MEMCPY_PEER = 8
    NCCL_ALLREDUCE = 9
    NCCL_ALLGATHER = 10
    NCCL_REDUCESCATTER = 11
    NCCL_BROADCAST = 12
    NCCL_REDUCE = 13
    NCCL_SEND = 14
    NCCL_RECV = 15
    NCCL_GROUP = 16
    GRAPH_LAUNCH = 17  # cuGraphLaunch
    MEM_ALLOC = 18  # cuMemAlloc_v2, cuMemAllocAsync
    MEM_FREE = 19  # cuMemFree_v2, cuMemFreeAsync
    NCCL_COMM_INIT = 20  # ncclCommInitRank, ncclCommInitRankConfig, ncclCommInitAll
    NCCL_COMM_ABORT = 21  # ncclCommAbort


SYNC_CALLS: frozenset[Call] = frozenset({Call.SYNC_STREAM, Call.SYNC_EVENT, Call.SYNC_CTX})
# libcuda's classes: a process with any of them is reported as a CUDA process
CUDA_CALLS: frozenset[Call] = frozenset(
    {*(c for c in Call if c <= Call.MEMCPY_PEER), Call.GRAPH_LAUNCH, Call.MEM_ALLOC, Call.MEM_FREE}
)
# The NCCL collectives: probes.c also counts these by dtype and message-size bucket
NCCL_COLLECTIVES: frozenset[Call] = frozenset(
    c for c in Call if Call.NCCL_ALLREDUCE <= c <= Call.NCCL_RECV
)
# labels.api of the {cuda,nccl}.api_latency_calls histograms: every timed class (not LAUNCH,
# whose "duration" is the gap between launches); collectives by their op name
API_LABELS: dict[Call, str] = {
    c: c.name.lower().removeprefix("nccl_") for c in Call if c is not Call.LAUNCH
}
HIST_BUCKETS = 40  # log2 µs buckets: bucket b holds [2^(b-1), 2^b) µs, bucket 0 < 1 µs
# labels.kind of the cuda.memcpy_* series
MEMCPY_KINDS: dict[Call, str] = {
    Call.MEMCPY_HTOD: "htod",
    Call.MEMCPY_DTOH: "dtoh",
    Call.MEMCPY_DTOD: "dtod",
    Call.MEMCPY_ANY: "any",
    Call.MEMCPY_PEER: "peer",
}
# labels.op of the nccl.* series (docs/design.md §4 names, contract.signals.NCCL_OPS)
NCCL_OP_LABELS: dict[Call, str] = dict(
    zip(
        (
            Call.NCCL_ALLREDUCE,
            Call.NCCL_ALLGATHER,
            Call.NCCL_REDUCESCATTER,
            Call.NCCL_BROADCAST,
            Call.NCCL_REDUCE,
            Call.NCCL_SEND,
            Call.NCCL_RECV,
        ),
        signals.NCCL_OPS,
        strict=True,
    )
)


@dataclass(frozen=True, slots=True)
class Probe:
    """Attach `entry` (uprobe) and/or `exit` (uretprobe) BPF functions to `symbol`."""

    symbol: str
    entry: str | None
    exit: str | None

    @property
    def group(self) -> str:
        """launch, sync, memcpy or nccl: what `EbpfCollector(probe_groups=...)` selects."""
        function = self.entry or self.exit or ""
        return function.split("_", 1)[0]


def _timed(function: str, *symbols: str) -> list[Probe]:
    return [Probe(s, f"{function}_enter", f"{function}_leave") for s in symbols]


PROBES: dict[str, tuple[Probe, ...]] = {
    CUDA: tuple(
        [
            Probe(s, "launch_enter", None)
            for s in (
                "cuLaunchKernel",
                "cuLaunchKernel_ptsz",
                "cuLaunchKernelEx",
                "cuLaunchKernelEx_ptsz",
                "cuLaunchCooperativeKernel",
                "cuLaunchCooperativeKernel_ptsz",
            )
        ]
        + _timed("sync_stream", "cuStreamSynchronize", "cuStreamSynchronize_ptsz")
        + _timed("sync_event", "cuEventSynchronize")
        + _timed("sync_ctx", "cuCtxSynchronize")
        + _timed(
            "memcpy_htod",
            "cuMemcpyHtoD_v2",
            "cuMemcpyHtoD_v2_ptds",
            "cuMemcpyHtoDAsync_v2",
            "cuMemcpyHtoDAsync_v2_ptsz",
        )
        + _timed(
            "memcpy_dtoh",
            "cuMemcpyDtoH_v2",
            "cuMemcpyDtoH_v2_ptds",
            "cuMemcpyDtoHAsync_v2",
            "cuMemcpyDtoHAsync_v2_ptsz",
        )
        + _timed(
            "memcpy_dtod",
            "cuMemcpyDtoD_v2",
            "cuMemcpyDtoD_v2_ptds",
            "cuMemcpyDtoDAsync_v2",
            "cuMemcpyDtoDAsync_v2_ptsz",
        )
        + _timed("memcpy_any", "cuMemcpy", "cuMemcpy_ptds", "cuMemcpyAsync", "cuMemcpyAsync_ptsz")
        + _timed(
            "memcpy_peer",
            "cuMemcpyPeer",
            "cuMemcpyPeer_ptds",
            "cuMemcpyPeerAsync",
            "cuMemcpyPeerAsync_ptsz",
        )
        + _timed("graph_launch", "cuGraphLaunch", "cuGraphLaunch_ptsz")
        + _timed("mem_alloc", "cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz")
        + _timed("mem_free", "cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz")
    ),
    NCCL: tuple(
        _timed("nccl_allreduce", "ncclAllReduce")
        + _timed("nccl_allgather", "ncclAllGather")
        + _timed("nccl_reducescatter", "ncclReduceScatter")
        + _timed("nccl_broadcast", "ncclBroadcast")
        + _timed("nccl_bcast", "ncclBcast")
        + _timed("nccl_reduce", "ncclReduce")
        + _timed("nccl_send", "ncclSend")
        + _timed("nccl_recv", "ncclRecv")
        + _timed("nccl_comm_init", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll")
        + _timed("nccl_comm_abort", "ncclCommAbort")
        + [
            Probe("ncclGroupStart", "nccl_group_start_enter", None),
            Probe("ncclGroupEnd", None, "nccl_group_end_leave"),
        ]
    ),
}

PROBE_GROUPS: tuple[str, ...] = ("launch", "sync", "memcpy", "nccl", "graph", "mem")

# Map capacities (entries), compiled in as -D definitions.
STATS_ENTRIES = 16384  # processes x call classes x 2 slots; allocated on demand
PROCESS_ENTRIES = 8192  # last launch time per process (LRU)
THREAD_ENTRIES = 16384  # calls in progress, NCCL group nesting per thread (LRU)
HIST_ENTRIES = 32768  # processes x timed classes x latency buckets x 2 slots; on demand
COLL_ENTRIES = 16384  # processes x collectives x dtypes x size buckets x 2 slots; on demand


def cflags() -> list[str]:
    """The -D definitions probes.c is compiled with."""
    flags = [f"-DW_{call.name}={call.value}" for call in Call]
    flags += [
        f"-DSTATS_ENTRIES={STATS_ENTRIES}",
        f"-DPROCESS_ENTRIES={PROCESS_ENTRIES}",
        f"-DTHREAD_ENTRIES={THREAD_ENTRIES}",
        f"-DHIST_ENTRIES={HIST_ENTRIES}",
        f"-DCOLL_ENTRIES={COLL_ENTRIES}",
        f"-DHIST_BUCKETS={HIST_BUCKETS}",
    ]
    return flags


def library_kind(path: str) -> str | None:
    """CUDA or NCCL when `path`'s basename is one of the probed libraries, else None."""
    base = path.rsplit("/", 1)[-1]
    for kind, pattern in LIBRARY_PATTERNS.items():
        if pattern.match(base):
            return kind
    return None
