// Uprobes on libcuda and libnccl, aggregated in the kernel per process.
//
// Compiled by bcc at load time (agent/ebpf/collector.py). The call classes (W_*) and the map
// sizes are passed in as -D definitions from agent/ebpf/calls.py, the single source of truth
// shared with user space.
//
// Maps:
//   stats        per-CPU hash {pid, call class, slot} -> {calls, total_ns, max_ns, bytes}.
//                For launches total_ns/max_ns are the summed and longest gap between
//                consecutive launches of the process; for everything else they are the time
//                spent inside the call (entry uprobe to return uretprobe).
//   control      array[1]: the slot probes write into now. User space flips it once per
//                interval, then reads and deletes the other slot's entries: read-and-clear
//                without racing the probes' increments.
//   last_launch  LRU hash pid -> ktime of the process's latest kernel launch (not cleared per
//                interval, so a gap spanning two intervals is still measured).
//   inflight     LRU hash {tid, call class} -> {entry ktime, bytes, pid}: calls entered, not
//                yet returned (a thread that dies inside a call is evicted by the LRU). User
//                space reads it for the synchronize calls still blocked at interval end.
//   group_state  LRU hash tid -> ncclGroupStart nesting depth and the outermost start time.
//   hist         per-CPU hash {pid, call class, slot, bucket} -> calls: every timed call's
//                duration as a log2 histogram in microseconds (bucket 0: < 1 µs; bucket b:
//                [2^(b-1), 2^b) µs), per API and process, read-and-cleared like `stats`
//                but on its own slot (`hist_control`), flipped only when user space reads it.
//   colls        per-CPU hash {pid, collective, slot, dtype, size bucket} -> {calls, total_ns}:
//                NCCL collectives by op, ncclDataType_t and log2 message-size bucket (bucket
//                0: 0 bytes; bucket b: [2^(b-1), 2^b) bytes).
#include <uapi/linux/ptrace.h>

struct stat_key {
    u32 pid;
    u16 what;
    u16 slot;
};

struct stat_val {
    u64 calls;
    u64 total_ns;
    u64 max_ns;
    u64 bytes;
};

struct inflight_key {
    u32 tid;
    u32 what;
};

struct inflight_val {
    u64 ts;
    u64 bytes;
    u32 pid;  // so user space can report calls still blocked, per process
    u32 dtype;  // NCCL collectives: the ncclDataType_t argument
};

struct hist_key {
    u32 pid;
    u16 what;
    u8 slot;
    u8 bucket;
};

struct coll_key {
    u32 pid;
    u16 what;
    u8 slot;
    u8 dtype;
    u8 size_bucket;
    u8 pad[3];
};

struct coll_val {
    u64 calls;
    u64 total_ns;
};

struct group_val {
    u64 start;
    u64 depth;
};

// Allocated on demand: preallocating a per-CPU map costs entries x CPUs x 32 bytes up front.
BPF_F_TABLE("percpu_hash", struct stat_key, struct stat_val, stats, STATS_ENTRIES, BPF_F_NO_PREALLOC);
BPF_ARRAY(control, u32, 1);
BPF_TABLE("lru_hash", u32, u64, last_launch, PROCESS_ENTRIES);
BPF_TABLE("lru_hash", struct inflight_key, struct inflight_val, inflight, THREAD_ENTRIES);
BPF_TABLE("lru_hash", u32, struct group_val, group_state, THREAD_ENTRIES);
BPF_ARRAY(hist_control, u32, 1);
BPF_F_TABLE("percpu_hash", struct hist_key, u64, hist, HIST_ENTRIES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("percpu_hash", struct coll_key, struct coll_val, colls, COLL_ENTRIES, BPF_F_NO_PREALLOC);

static __always_inline u16 current_slot(void) {
    u32 zero = 0;
    u32 *slot = control.lookup(&zero);
    return slot ? (u16)*slot : 0;
}

static __always_inline void account(u32 pid, u16 what, u64 duration_ns, u64 bytes) {
    struct stat_key key = {};
    key.pid = pid;
    key.what = what;
    key.slot = current_slot();
    struct stat_val zero = {};
    struct stat_val *val = stats.lookup_or_try_init(&key, &zero);
    if (!val)
        return;
    // Per-CPU values: no other writer can interleave on this CPU, so plain adds are exact.
    val->calls += 1;
    val->total_ns += duration_ns;
    if (duration_ns > val->max_ns)
        val->max_ns = duration_ns;
    val->bytes += bytes;
}

// log2 bucket of `v`: 0 for 0, else floor(log2(v)) + 1 (what bcc's bpf_log2l returns),
// capped at HIST_BUCKETS - 1.
static __always_inline u8 log2_bucket(u64 v) {
    if (v == 0)
        return 0;
    u32 b = bpf_log2l(v);
    return b >= HIST_BUCKETS ? HIST_BUCKETS - 1 : (u8)b;
}

// The slot `hist` and `colls` write into: flipped by user space only when it reads them (every
// histogram_every_s), not every interval like `control`.
static __always_inline u8 current_hist_slot(void) {
    u32 zero = 0;
    u32 *slot = hist_control.lookup(&zero);
    return slot ? (u8)*slot : 0;
}

static __always_inline void account_hist(u32 pid, u16 what, u16 slot, u64 duration_ns) {
    struct hist_key key = {};
    key.pid = pid;
    key.what = what;
    key.slot = current_hist_slot();
    key.bucket = log2_bucket(duration_ns / 1000);
    u64 zero = 0;
    u64 *count = hist.lookup_or_try_init(&key, &zero);
    if (count)
        *count += 1;
}

static __always_inline void account_coll(
    u32 pid, u16 what, u16 slot, u32 dtype, u64 bytes, u64 duration_ns) {
    struct coll_key key = {};
    key.pid = pid;
    key.what = what;
    key.slot = current_hist_slot();
    key.dtype = dtype > 255 ? 255 : (u8)dtype;
    key.size_bucket = log2_bucket(bytes);
    struct coll_val zero = {};
    struct coll_val *val = colls.lookup_or_try_init(&key, &zero);
    if (!val)
        return;
    val->calls += 1;
    val->total_ns += duration_ns;
}

static __always_inline int on_launch(void) {
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    u64 now = bpf_ktime_get_ns();
    u64 gap = 0;
    u64 *last = last_launch.lookup(&pid);
    if (last) {
        // Threads of one process launching at the same instant may race on this word; the
        // gap they would compute is then near zero either way, so the maximum is unaffected.
        u64 previous = *last;
        if (now > previous)
            gap = now - previous;
        *last = now;
    } else {
        last_launch.update(&pid, &now);
    }
    account(pid, W_LAUNCH, gap, 0);
    return 0;
}

static __always_inline int enter(u32 what, u64 bytes, u32 dtype) {
    u64 id = bpf_get_current_pid_tgid();
    struct inflight_key key = {};
    key.tid = (u32)id;
    key.what = what;
    struct inflight_val val = {};
    val.ts = bpf_ktime_get_ns();
    val.bytes = bytes;
    val.pid = id >> 32;
    val.dtype = dtype;
    inflight.update(&key, &val);
    return 0;
}

static __always_inline int leave(u32 what) {
    u64 id = bpf_get_current_pid_tgid();
    struct inflight_key key = {};
    key.tid = (u32)id;
    key.what = what;
    struct inflight_val *val = inflight.lookup(&key);
    if (!val)
        return 0;  // entered before the probes were attached
    u64 now = bpf_ktime_get_ns();
    u64 duration = now > val->ts ? now - val->ts : 0;
    u64 bytes = val->bytes;
    u32 dtype = val->dtype;
    inflight.delete(&key);
    u32 pid = id >> 32;
    u16 slot = current_slot();
    account(pid, what, duration, bytes);
    account_hist(pid, what, slot, duration);
    if (what >= W_NCCL_ALLREDUCE && what <= W_NCCL_RECV)
        account_coll(pid, what, slot, dtype, bytes, duration);
    return 0;
}

// ncclDataType_t -> element size in bytes (nccl.h: Int8, Uint8, Int32, Uint32, Int64, Uint64,
// Float16, Float32, Float64, Bfloat16, Float8e4m3, Float8e5m2). Unknown types count 0 bytes.
static __always_inline u64 nccl_type_size(u64 datatype) {
    switch (datatype & 0xffffffff) {
    case 0: case 1: case 10: case 11:
        return 1;
    case 6: case 9:
        return 2;
    case 2: case 3: case 7:
        return 4;
    case 4: case 5: case 8:
        return 8;
    default:
        return 0;
    }
}

// Only calls to the helpers above inside macros: bcc cannot rewrite map methods in macros.
#define TIMED_CALL(name, what, bytes_expr)                                                    \
    int name##_enter(struct pt_regs *ctx) { return enter(what, (bytes_expr), 0); }            \
    int name##_leave(struct pt_regs *ctx) { return leave(what); }
// NCCL collectives also record their ncclDataType_t argument (for `colls`).
#define NCCL_CALL(name, what, bytes_expr, dtype_expr)                                         \
    int name##_enter(struct pt_regs *ctx) {                                                   \
        return enter(what, (bytes_expr), (u32)(dtype_expr));                                  \
    }                                                                                         \
    int name##_leave(struct pt_regs *ctx) { return leave(what); }

int launch_enter(struct pt_regs *ctx) { return on_launch(); }

// cuStreamSynchronize(stream), cuEventSynchronize(event), cuCtxSynchronize(void)
TIMED_CALL(sync_stream, W_SYNC_STREAM, 0)
TIMED_CALL(sync_event, W_SYNC_EVENT, 0)
TIMED_CALL(sync_ctx, W_SYNC_CTX, 0)

// cuMemcpyHtoD_v2(dst, src, bytes) and the DtoH/DtoD/Async variants: bytes is argument 3;
// cuMemcpy(dst, src, bytes), cuMemcpyAsync(dst, src, bytes, stream): direction unknown
// (unified addressing); cuMemcpyPeer(dst, dstCtx, src, srcCtx, bytes[, stream]): argument 5.
TIMED_CALL(memcpy_htod, W_MEMCPY_HTOD, PT_REGS_PARM3(ctx))
TIMED_CALL(memcpy_dtoh, W_MEMCPY_DTOH, PT_REGS_PARM3(ctx))
TIMED_CALL(memcpy_dtod, W_MEMCPY_DTOD, PT_REGS_PARM3(ctx))
TIMED_CALL(memcpy_any, W_MEMCPY_ANY, PT_REGS_PARM3(ctx))
TIMED_CALL(memcpy_peer, W_MEMCPY_PEER, PT_REGS_PARM5(ctx))

// ncclAllReduce(send, recv, count, type, op, comm, stream)
// ncclAllGather(send, recv, sendcount, type, comm, stream)      -- bytes this rank sends
// ncclReduceScatter(send, recv, recvcount, type, op, comm, stream) -- bytes this rank receives
// ncclBroadcast(send, recv, count, type, root, comm, stream)
// ncclReduce(send, recv, count, type, op, root, comm, stream)
// ncclSend(send, count, type, peer, comm, stream), ncclRecv(recv, count, type, peer, ...)
// ncclBcast(buff, count, type, root, comm, stream) (the in-place broadcast)
NCCL_CALL(nccl_allreduce, W_NCCL_ALLREDUCE, PT_REGS_PARM3(ctx) * nccl_type_size(PT_REGS_PARM4(ctx)), PT_REGS_PARM4(ctx))
NCCL_CALL(nccl_allgather, W_NCCL_ALLGATHER, PT_REGS_PARM3(ctx) * nccl_type_size(PT_REGS_PARM4(ctx)), PT_REGS_PARM4(ctx))
NCCL_CALL(nccl_reducescatter, W_NCCL_REDUCESCATTER, PT_REGS_PARM3(ctx) * nccl_type_size(PT_REGS_PARM4(ctx)), PT_REGS_PARM4(ctx))
NCCL_CALL(nccl_broadcast, W_NCCL_BROADCAST, PT_REGS_PARM3(ctx) * nccl_type_size(PT_REGS_PARM4(ctx)), PT_REGS_PARM4(ctx))
NCCL_CALL(nccl_bcast, W_NCCL_BROADCAST, PT_REGS_PARM2(ctx) * nccl_type_size(PT_REGS_PARM3(ctx)), PT_REGS_PARM3(ctx))
NCCL_CALL(nccl_reduce, W_NCCL_REDUCE, PT_REGS_PARM3(ctx) * nccl_type_size(PT_REGS_PARM4(ctx)), PT_REGS_PARM4(ctx))
NCCL_CALL(nccl_send, W_NCCL_SEND, PT_REGS_PARM2(ctx) * nccl_type_size(PT_REGS_PARM3(ctx)), PT_REGS_PARM3(ctx))
NCCL_CALL(nccl_recv, W_NCCL_RECV, PT_REGS_PARM2(ctx) * nccl_type_size(PT_REGS_PARM3(ctx)), PT_REGS_PARM3(ctx))

// cuGraphLaunch(graphExec, stream); cuMemAlloc_v2(&dptr, bytes), cuMemAllocAsync(&dptr, bytes,
// stream): bytes is argument 2; cuMemFree_v2(dptr), cuMemFreeAsync(dptr, stream).
TIMED_CALL(graph_launch, W_GRAPH_LAUNCH, 0)
TIMED_CALL(mem_alloc, W_MEM_ALLOC, PT_REGS_PARM2(ctx))
TIMED_CALL(mem_free, W_MEM_FREE, 0)
// ncclCommInitRank(&comm, nranks, id, rank), ncclCommInitRankConfig(…, config),
// ncclCommInitAll(comms, ndev, devlist); ncclCommAbort(comm).
TIMED_CALL(nccl_comm_init, W_NCCL_COMM_INIT, 0)
TIMED_CALL(nccl_comm_abort, W_NCCL_COMM_ABORT, 0)

// ncclGroupStart()/ncclGroupEnd() nest; a group is timed from the outermost start's entry to
// the matching end's return (where NCCL actually launches the grouped operations).
int nccl_group_start_enter(struct pt_regs *ctx) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct group_val zero = {};
    struct group_val *group = group_state.lookup_or_try_init(&tid, &zero);
    if (!group)
        return 0;
    if (group->depth == 0)
        group->start = bpf_ktime_get_ns();
    group->depth += 1;
    return 0;
}

int nccl_group_end_leave(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct group_val *group = group_state.lookup(&tid);
    if (!group || group->depth == 0)
        return 0;
    group->depth -= 1;
    if (group->depth != 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 duration = now > group->start ? now - group->start : 0;
    account(id >> 32, W_NCCL_GROUP, duration, 0);
    account_hist(id >> 32, W_NCCL_GROUP, current_slot(), duration);
    return 0;
}
