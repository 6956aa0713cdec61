"""The signal vocabulary of docs/design.md §3–§4 (normative names), as constants.

Every other module refers to these constants, never to string literals. Names not listed here
are carried through untouched (`spec_for()` returns None for them); they are never rejected.
Constant names are the signal names upper-cased with "." and ":" turned into "_".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contract.names import prefixed


class Scope(StrEnum):
    GPU = "gpu"
    PROCESS = "process"
    NODE = "node"
    INFERENCE = "inference"


class Kind(StrEnum):
    GAUGE = "gauge"  # a reading at an instant
    COUNTER = "counter"  # cumulative as the hardware/software reports it; use deltas
    INTERVAL = "interval"  # one value per collection interval (count, max or mean over it)
    BITMASK = "bitmask"  # a set of flags at an instant


@dataclass(frozen=True)
class SignalSpec:
    name: str
    unit: str
    scope: Scope
    kind: Kind
    description: str


# --- Identity (docs/design.md §3) ------------------------------------------------------------
NODE = "node"
GPU = "gpu"
GPU_INDEX = "gpu_index"
PID = "pid"
JOB = "job"
RANK = "rank"
LOCAL_RANK = "local_rank"
STEP = "step"
# In the order trace records are written (contract.trace.records): node first, what readers group by.
IDENTITY_KEYS: tuple[str, ...] = (NODE, GPU, GPU_INDEX, PID, JOB, RANK, LOCAL_RANK, STEP)
# `tenant` is an identity key too, but it is never carried in a payload: ingest takes it from
# the agent's token.

# --- Name families (how a name says where it came from; for names outside this vocabulary) ---
DCGM_PREFIX = "DCGM_FI_"  # every DCGM field, GPU scope
DCGM_PROF_PREFIX = "DCGM_FI_PROF_"  # profiling fields: need DCGM, not NVML alone
CUDA_PREFIX = "cuda."  # eBPF uprobes on the CUDA runtime
NCCL_PREFIX = "nccl."  # eBPF uprobes on NCCL
IB_PREFIX = "ib."  # InfiniBand port counters
STORAGE_PREFIX = "storage."  # per-mount storage statistics
# Inference servers' own metric names, and the agent's inference.* additions.
INFERENCE_PREFIXES: tuple[str, ...] = ("vllm:", "sglang:", "tgi_", "inference.")

# --- GPU scope (DCGM field names) -----------------------------------------------------------
DCGM_FI_DEV_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FI_PROF_GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DCGM_FI_PROF_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
DCGM_FI_PROF_SM_OCCUPANCY = "DCGM_FI_PROF_SM_OCCUPANCY"
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DCGM_FI_PROF_DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
DCGM_FI_DEV_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FI_DEV_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_FI_DEV_POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
DCGM_FI_DEV_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_FI_DEV_MEMORY_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
DCGM_FI_DEV_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
DCGM_FI_DEV_PCIE_LINK_GEN = "DCGM_FI_DEV_PCIE_LINK_GEN"
DCGM_FI_DEV_PCIE_LINK_WIDTH = "DCGM_FI_DEV_PCIE_LINK_WIDTH"
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
DCGM_FI_DEV_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
DCGM_FI_DEV_PCIE_REPLAY_COUNTER = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
# Extensions (DCGM names of quantities the NVML/DCGM collectors also read; docs/design.md §4
# allows new names).
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL = "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
DCGM_FI_DEV_ROW_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
DCGM_FI_PROF_PCIE_TX_BYTES = "DCGM_FI_PROF_PCIE_TX_BYTES"
DCGM_FI_PROF_PCIE_RX_BYTES = "DCGM_FI_PROF_PCIE_RX_BYTES"
DCGM_FI_PROF_NVLINK_TX_BYTES = "DCGM_FI_PROF_NVLINK_TX_BYTES"
DCGM_FI_PROF_NVLINK_RX_BYTES = "DCGM_FI_PROF_NVLINK_RX_BYTES"

# Throttle-reason bits of DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (docs/design.md §4).
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_REASON_NAMES: dict[int, str] = {
    THROTTLE_SW_POWER_CAP: "sw_power_cap",
    THROTTLE_HW_SLOWDOWN: "hw_slowdown",
    THROTTLE_SW_THERMAL: "sw_thermal",
    THROTTLE_HW_THERMAL: "hw_thermal",
    THROTTLE_HW_POWER_BRAKE: "hw_power_brake",
}

# --- Process scope (eBPF uprobes; one value per interval) -----------------------------------
CUDA_LAUNCHES = "cuda.launches"
CUDA_LAUNCH_GAP_MAX_MS = "cuda.launch_gap_max_ms"
CUDA_SYNC_MS = "cuda.sync_ms"
NCCL_CALLS = "nccl.calls"
NCCL_BYTES = "nccl.bytes"
HOST_CPU_UTIL = "host.cpu_util"  # process scope with a pid, node scope without
# Extensions from the eBPF uprobes (docs/ebpf.md), one value per interval like the above.
CUDA_SYNCS = "cuda.syncs"  # synchronize calls that returned in the interval
CUDA_SYNC_MAX_MS = "cuda.sync_max_ms"  # longest single synchronize call
CUDA_SYNC_OPEN_MS = "cuda.sync_open_ms"  # synchronize call still blocked at interval end
CUDA_MEMCPY_CALLS = "cuda.memcpy_calls"  # labels.kind: htod, dtoh, dtod, peer, any
CUDA_MEMCPY_BYTES = "cuda.memcpy_bytes"
CUDA_MEMCPY_MS = "cuda.memcpy_ms"
NCCL_MS = "nccl.ms"  # host time inside the NCCL call, labels.op
NCCL_GROUPS = "nccl.groups"  # outermost ncclGroupStart/ncclGroupEnd pairs completed
NCCL_GROUP_MS = "nccl.group_ms"  # time from outermost ncclGroupStart to ncclGroupEnd return
# In-kernel log2 histograms and the calls added by issue 17 (docs/ebpf.md), per interval too.
# Latency per API and process: calls whose duration fell in the bucket, labels.api (the call
# class: sync_stream, memcpy_htod, graph_launch, mem_alloc, allreduce, comm_init…) and
# labels.le_us (the bucket's exclusive upper bound in µs: 1, 2, 4, …; 1 holds the calls < 1 µs).
CUDA_API_LATENCY_CALLS = "cuda.api_latency_calls"
NCCL_API_LATENCY_CALLS = "nccl.api_latency_calls"
# NCCL collectives by labels.op, labels.dtype (nccl.h names) and labels.size_le (the message
# size bucket's exclusive upper bound in bytes, a power of two)
NCCL_COLLECTIVE_CALLS = "nccl.collective_calls"
NCCL_COLLECTIVE_MS = "nccl.collective_ms"
CUDA_GRAPH_LAUNCHES = "cuda.graph_launches"  # cuGraphLaunch calls returned
CUDA_GRAPH_LAUNCH_MS = "cuda.graph_launch_ms"
CUDA_MEM_ALLOCS = "cuda.mem_allocs"  # cuMemAlloc_v2/cuMemAllocAsync (and _ptsz) calls
CUDA_MEM_ALLOC_BYTES = "cuda.mem_alloc_bytes"
CUDA_MEM_ALLOC_MS = "cuda.mem_alloc_ms"
CUDA_MEM_FREES = "cuda.mem_frees"  # cuMemFree_v2/cuMemFreeAsync calls
CUDA_MEM_FREE_MS = "cuda.mem_free_ms"
NCCL_COMM_INITS = "nccl.comm_inits"  # ncclCommInitRank/…InitRankConfig/…InitAll returned
NCCL_COMM_INIT_MS = "nccl.comm_init_ms"
NCCL_COMM_ABORTS = "nccl.comm_aborts"  # ncclCommAbort calls (a rank tearing NCCL down)
NCCL_OPS: tuple[str, ...] = (
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "send",
    "recv",
)
# ncclDataType_t values (nccl.h) -> the labels.dtype of nccl.collective_* series
NCCL_DTYPES: tuple[str, ...] = (
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "float8e4m3",
    "float8e5m2",
)

# --- Node scope -----------------------------------------------------------------------------
IB_PORT_XMIT_DATA = "ib.port_xmit_data"
IB_PORT_RCV_DATA = "ib.port_rcv_data"
IB_PORT_XMIT_WAIT = "ib.port_xmit_wait"
IB_SYMBOL_ERROR = "ib.symbol_error"
IB_LINK_DOWNED = "ib.link_downed"
IB_LINK_ERROR_RECOVERY = "ib.link_error_recovery"
IB_PORT_RCV_ERRORS = "ib.port_rcv_errors"
STORAGE_WRITE_BYTES = "storage.write_bytes"
STORAGE_READ_BYTES = "storage.read_bytes"
STORAGE_WRITE_MS = "storage.write_ms"
HOST_MEM_USED_BYTES = "host.mem_used_bytes"

# --- Inference servers (the servers' own Prometheus names) ----------------------------------
VLLM_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
VLLM_GPU_CACHE_USAGE_PERC = "vllm:gpu_cache_usage_perc"  # older vLLM name of the same gauge
VLLM_PROMPT_TOKENS_TOTAL = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS_TOTAL = "vllm:generation_tokens_total"
VLLM_REQUEST_PREFILL_TIME_SECONDS_SUM = "vllm:request_prefill_time_seconds_sum"
VLLM_REQUEST_DECODE_TIME_SECONDS_SUM = "vllm:request_decode_time_seconds_sum"
VLLM_PREFIX_CACHE_QUERIES_TOTAL = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_CACHE_HITS_TOTAL = "vllm:prefix_cache_hits_total"
INFERENCE_MAX_NUM_SEQS = "inference.max_num_seqs"

# --- Events (trace `event` records) ---------------------------------------------------------
EVENT_XID = "xid"
EVENT_ECC_DBE = "ecc_dbe"
EVENT_THROTTLE = "throttle"
EVENT_LINK_DOWN = "link_down"
EVENT_GPU_LOST = "gpu_lost"  # the GPU fell off the bus / stopped answering NVML
EVENT_COLLECTOR_ERROR = "collector_error"  # a source failed; the agent keeps running
# A process the agent saw (GPU process) is gone from /proc and its exit code is unknown (it was
# not the agent's child); a known exit code is an `exit` record instead.
EVENT_PROCESS_GONE = "process_gone"
# The agent's on-disk spool hit its size cap during an ingest outage and dropped its oldest
# unsent batches (`value` = batches dropped this time; labels carry the running totals).
EVENT_SPOOL_DROPPED = "spool_dropped"
# Ingest refused one of the agent's batches (INVALID_ARGUMENT); the agent kept it in its dead
# letter (`value` = the batch's sequence, `text` = the server's reason).
EVENT_BATCH_REFUSED = "batch_refused"
EVENT_NAMES: tuple[str, ...] = prefixed(globals(), "EVENT_")  # every EVENT_* above, in order


def _spec(name: str, unit: str, scope: Scope, kind: Kind, description: str) -> SignalSpec:
    return SignalSpec(name, unit, scope, kind, description)


_G, _P, _N, _I = Scope.GPU, Scope.PROCESS, Scope.NODE, Scope.INFERENCE
_GA, _C, _IV, _B = Kind.GAUGE, Kind.COUNTER, Kind.INTERVAL, Kind.BITMASK

SIGNALS: dict[str, SignalSpec] = {
    s.name: s
    for s in (
        _spec(DCGM_FI_DEV_GPU_UTIL, "%", _G, _GA, "GPU utilization (a kernel was running)"),
        _spec(DCGM_FI_PROF_GR_ENGINE_ACTIVE, "ratio", _G, _GA, "graphics engine active"),
        _spec(DCGM_FI_PROF_SM_ACTIVE, "ratio", _G, _GA, "SMs with at least one warp"),
        _spec(DCGM_FI_PROF_SM_OCCUPANCY, "ratio", _G, _GA, "resident warps / max warps"),
        _spec(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, "ratio", _G, _GA, "tensor pipes active"),
        _spec(DCGM_FI_PROF_DRAM_ACTIVE, "ratio", _G, _GA, "device memory interface active"),
        _spec(DCGM_FI_DEV_FB_USED, "MiB", _G, _GA, "framebuffer memory used"),
        _spec(DCGM_FI_DEV_FB_FREE, "MiB", _G, _GA, "framebuffer memory free"),
        _spec(DCGM_FI_DEV_POWER_USAGE, "W", _G, _GA, "power draw"),
        _spec(DCGM_FI_DEV_GPU_TEMP, "C", _G, _GA, "GPU temperature"),
        _spec(DCGM_FI_DEV_MEMORY_TEMP, "C", _G, _GA, "HBM temperature"),
        _spec(DCGM_FI_DEV_SM_CLOCK, "MHz", _G, _GA, "SM clock"),
        _spec(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, "bitmask", _G, _B, "clock throttle reasons"),
        _spec(DCGM_FI_DEV_PCIE_LINK_GEN, "gen", _G, _GA, "current PCIe link generation"),
        _spec(DCGM_FI_DEV_PCIE_LINK_WIDTH, "lanes", _G, _GA, "current PCIe link width"),
        _spec(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, "errors", _G, _C, "single-bit ECC, volatile"),
        _spec(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, "errors", _G, _C, "double-bit ECC, volatile"),
        _spec(DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, "rows", _G, _C, "rows remapped (SBE)"),
        _spec(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, "rows", _G, _C, "rows remapped (DBE)"),
        _spec(DCGM_FI_DEV_ROW_REMAP_FAILURE, "flag", _G, _C, "a row remap failed"),
        _spec(
            DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            "errors",
            _G,
            _C,
            "NVLink CRC flit errors",
        ),
        _spec(DCGM_FI_DEV_PCIE_REPLAY_COUNTER, "replays", _G, _C, "PCIe replays"),
        _spec(DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, "errors", _G, _C, "single-bit ECC, lifetime"),
        _spec(DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, "errors", _G, _C, "double-bit ECC, lifetime"),
        _spec(DCGM_FI_DEV_ROW_REMAP_PENDING, "flag", _G, _GA, "a remap waits for a GPU reset"),
        _spec(DCGM_FI_PROF_PCIE_TX_BYTES, "B/s", _G, _GA, "PCIe bytes transmitted per second"),
        _spec(DCGM_FI_PROF_PCIE_RX_BYTES, "B/s", _G, _GA, "PCIe bytes received per second"),
        _spec(DCGM_FI_PROF_NVLINK_TX_BYTES, "B/s", _G, _GA, "NVLink bytes transmitted per second"),
        _spec(DCGM_FI_PROF_NVLINK_RX_BYTES, "B/s", _G, _GA, "NVLink bytes received per second"),
        _spec(CUDA_LAUNCHES, "launches", _P, _IV, "kernel launches in the interval"),
        _spec(CUDA_LAUNCH_GAP_MAX_MS, "ms", _P, _IV, "longest gap between launches"),
        _spec(CUDA_SYNC_MS, "ms", _P, _IV, "host time blocked in synchronize calls"),
        _spec(NCCL_CALLS, "calls", _P, _IV, "NCCL collective calls (labels.op)"),
        _spec(NCCL_BYTES, "bytes", _P, _IV, "NCCL bytes by collective (labels.op)"),
        _spec(CUDA_SYNCS, "calls", _P, _IV, "synchronize calls returned"),
        _spec(CUDA_SYNC_MAX_MS, "ms", _P, _IV, "longest synchronize call"),
        _spec(CUDA_SYNC_OPEN_MS, "ms", _P, _GA, "synchronize call blocked so far"),
        _spec(CUDA_MEMCPY_CALLS, "calls", _P, _IV, "cuMemcpy* calls (labels.kind)"),
        _spec(CUDA_MEMCPY_BYTES, "bytes", _P, _IV, "cuMemcpy* bytes (labels.kind)"),
        _spec(CUDA_MEMCPY_MS, "ms", _P, _IV, "host time in cuMemcpy* (labels.kind)"),
        _spec(NCCL_MS, "ms", _P, _IV, "host time inside NCCL calls (labels.op)"),
        _spec(NCCL_GROUPS, "groups", _P, _IV, "NCCL groups completed"),
        _spec(NCCL_GROUP_MS, "ms", _P, _IV, "time in NCCL groups, start to end"),
        _spec(CUDA_API_LATENCY_CALLS, "calls", _P, _IV, "CUDA calls per log2 latency bucket"),
        _spec(NCCL_API_LATENCY_CALLS, "calls", _P, _IV, "NCCL calls per log2 latency bucket"),
        _spec(NCCL_COLLECTIVE_CALLS, "calls", _P, _IV, "NCCL calls by op, dtype, size bucket"),
        _spec(NCCL_COLLECTIVE_MS, "ms", _P, _IV, "NCCL host time by op, dtype, size bucket"),
        _spec(CUDA_GRAPH_LAUNCHES, "calls", _P, _IV, "cuGraphLaunch calls"),
        _spec(CUDA_GRAPH_LAUNCH_MS, "ms", _P, _IV, "host time in cuGraphLaunch"),
        _spec(CUDA_MEM_ALLOCS, "calls", _P, _IV, "device memory allocations"),
        _spec(CUDA_MEM_ALLOC_BYTES, "bytes", _P, _IV, "device memory allocated"),
        _spec(CUDA_MEM_ALLOC_MS, "ms", _P, _IV, "host time in allocation calls"),
        _spec(CUDA_MEM_FREES, "calls", _P, _IV, "device memory frees"),
        _spec(CUDA_MEM_FREE_MS, "ms", _P, _IV, "host time in free calls"),
        _spec(NCCL_COMM_INITS, "calls", _P, _IV, "NCCL communicators initialised"),
        _spec(NCCL_COMM_INIT_MS, "ms", _P, _IV, "host time in NCCL communicator init"),
        _spec(NCCL_COMM_ABORTS, "calls", _P, _IV, "NCCL communicators aborted"),
        _spec(HOST_CPU_UTIL, "cores", _N, _GA, "CPU used (node: 0–1; process: cores)"),
        _spec(IB_PORT_XMIT_DATA, "bytes", _N, _C, "IB bytes transmitted"),
        _spec(IB_PORT_RCV_DATA, "bytes", _N, _C, "IB bytes received"),
        _spec(IB_PORT_XMIT_WAIT, "ticks", _N, _C, "IB ticks with data but no credits"),
        _spec(IB_SYMBOL_ERROR, "errors", _N, _C, "IB symbol errors"),
        _spec(IB_LINK_DOWNED, "events", _N, _C, "IB link went down"),
        _spec(IB_LINK_ERROR_RECOVERY, "events", _N, _C, "IB link error recoveries"),
        _spec(IB_PORT_RCV_ERRORS, "errors", _N, _C, "IB receive errors"),
        _spec(STORAGE_WRITE_BYTES, "bytes", _N, _C, "bytes written to the mount"),
        _spec(STORAGE_READ_BYTES, "bytes", _N, _C, "bytes read from the mount"),
        _spec(STORAGE_WRITE_MS, "ms", _N, _IV, "mean write latency over the interval"),
        _spec(HOST_MEM_USED_BYTES, "bytes", _N, _GA, "host memory used"),
        _spec(VLLM_NUM_REQUESTS_RUNNING, "requests", _I, _GA, "requests in the running batch"),
        _spec(VLLM_NUM_REQUESTS_WAITING, "requests", _I, _GA, "requests queued"),
        _spec(VLLM_KV_CACHE_USAGE_PERC, "ratio", _I, _GA, "KV cache blocks in use"),
        _spec(VLLM_GPU_CACHE_USAGE_PERC, "ratio", _I, _GA, "KV cache in use (older name)"),
        _spec(VLLM_PROMPT_TOKENS_TOTAL, "tokens", _I, _C, "prompt tokens processed"),
        _spec(VLLM_GENERATION_TOKENS_TOTAL, "tokens", _I, _C, "tokens generated"),
        _spec(VLLM_REQUEST_PREFILL_TIME_SECONDS_SUM, "s", _I, _C, "summed prefill time"),
        _spec(VLLM_REQUEST_DECODE_TIME_SECONDS_SUM, "s", _I, _C, "summed decode time"),
        _spec(VLLM_PREFIX_CACHE_QUERIES_TOTAL, "tokens", _I, _C, "prefix cache queries"),
        _spec(VLLM_PREFIX_CACHE_HITS_TOTAL, "tokens", _I, _C, "prefix cache hits"),
        _spec(INFERENCE_MAX_NUM_SEQS, "slots", _I, _GA, "configured batch slots"),
    )
}

GPU_SIGNALS: tuple[str, ...] = tuple(n for n, s in SIGNALS.items() if s.scope is Scope.GPU)
GPU_COUNTERS: tuple[str, ...] = tuple(
    n for n, s in SIGNALS.items() if s.scope is Scope.GPU and s.kind is Kind.COUNTER
)
# The GPU error counters a fault shows up in while it happens. The *_AGG_TOTAL counters are
# left out: they are lifetime totals that persist across driver reloads, not a window's events.
GPU_ERROR_COUNTERS: tuple[str, ...] = (
    DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
    DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
    DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
    DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
    DCGM_FI_DEV_ROW_REMAP_FAILURE,
    DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
)


def spec_for(name: str) -> SignalSpec | None:
    """The spec of a known signal; None for names outside the vocabulary (kept, not rejected)."""
    return SIGNALS.get(name)


def is_cumulative(name: str) -> bool:
    spec = SIGNALS.get(name)
    return spec is not None and spec.kind is Kind.COUNTER
