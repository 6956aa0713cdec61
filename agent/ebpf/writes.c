// What tracked processes write to their stdout and stderr (fd 1 and 2), from the
// syscalls:sys_enter_write tracepoint. Compiled by bcc (agent/ebpf/output.py) with
// -DCAPTURE_BYTES (the most bytes kept per write, a power of two) and -DRING_PAGES.
//
// Maps:
//   tracked   hash pid -> 1: the processes whose output is captured (the GPU processes user
//             space found); every other write returns after one hash lookup.
//   events    ring buffer of struct write_event, read by user space each interval.
//   dropped   array[1]: writes lost because the ring buffer was full (reported as a count).
#include <uapi/linux/ptrace.h>

struct write_event {
    u64 ts;
    u32 pid;
    u32 fd;
    u32 len;       // bytes the process wrote
    u32 captured;  // bytes copied into data (<= CAPTURE_BYTES)
    char data[CAPTURE_BYTES];
};

BPF_HASH(tracked, u32, u8, 65536);
BPF_RINGBUF_OUTPUT(events, RING_PAGES);
BPF_ARRAY(dropped, u64, 1);

TRACEPOINT_PROBE(syscalls, sys_enter_write) {
    unsigned int fd = args->fd;
    if (fd != 1 && fd != 2)
        return 0;
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (!tracked.lookup(&pid))
        return 0;
    struct write_event *event = events.ringbuf_reserve(sizeof(struct write_event));
    if (!event) {
        u32 zero = 0;
        u64 *count = dropped.lookup(&zero);
        if (count)
            __sync_fetch_and_add(count, 1);
        return 0;
    }
    u64 len = args->count;
    u32 captured = CAPTURE_BYTES;
    if (len < CAPTURE_BYTES)
        captured = (u32)len;
    event->ts = bpf_ktime_get_ns();
    event->pid = pid;
    event->fd = fd;
    event->len = len > 0xffffffff ? 0xffffffff : (u32)len;
    if (bpf_probe_read_user(event->data, captured, (const void *)args->buf) != 0)
        captured = 0;  // the buffer was not readable (paged out): keep the length only
    event->captured = captured;
    events.ringbuf_submit(event, 0);
    return 0;
}
