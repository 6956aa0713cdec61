"""eBPF uprobes on libcuda and libnccl (bcc), aggregated in the kernel per process.

See docs/ebpf.md. `EbpfCollector` (agent.ebpf.collector) is the collector; `ebpf_status()` is
what `proof-agent doctor` asks.
"""

from __future__ import annotations

import os
from typing import Any

from agent.ebpf._bcc import BccUnavailable, import_bcc, load_failure_hints

UPROBE_PMU = "/sys/bus/event_source/devices/uprobe"
TRACEFS_UPROBE_EVENTS = (
    "/sys/kernel/tracing/uprobe_events",
    "/sys/kernel/debug/tracing/uprobe_events",
)


def ebpf_status() -> tuple[bool, str]:
    """Whether this node can run the eBPF collector, and why not: imports bcc, compiles and
    loads the real probe program (so a missing header tree or a refusing kernel shows up
    here, not at run time), and checks that the kernel can create uprobes. Takes ~1 s."""
    try:
        bcc = import_bcc()
    except BccUnavailable as error:
        return False, str(error)
    if not os.path.exists(UPROBE_PMU) and not any(os.path.exists(p) for p in TRACEFS_UPROBE_EVENTS):
        return False, (
            "the kernel offers no uprobes (no uprobe PMU, no tracefs uprobe_events: "
            "CONFIG_UPROBE_EVENTS, or mount tracefs at /sys/kernel/tracing)"
        )
    from agent.ebpf.collector import load_bpf

    try:
        bpf = load_bpf(bcc)
        for name in ("launch_enter", "sync_stream_leave"):
            bpf.load_func(name.encode(), bcc.BPF.KPROBE)
    except Exception as error:  # bcc raises plain Exception for compile/load refusals
        reason = str(error) or error.__class__.__name__
        hints = load_failure_hints()
        return False, f"BPF programs cannot be loaded: {reason}" + (f" ({hints})" if hints else "")
    bpf.cleanup()
    return True, f"bcc {getattr(bcc, '__version__', '?')}: uprobe programs load"


def build_collectors(
    *,
    node: str | None = None,
    proc_root: str = "/proc",
    capture_output: bool = True,
    probe_groups: tuple[str, ...] | None = None,
) -> list[Any]:
    """The eBPF collectors for a real node, ready for the agent loop: the uprobe collector
    and, with `capture_output`, the stdout/stderr capture of the processes it found mapping
    libcuda. Nothing is loaded until the first `collect()`; each logs once and yields nothing
    if BPF cannot load."""
    from agent.ebpf.calls import PROBE_GROUPS
    from agent.ebpf.collector import EbpfCollector
    from agent.ebpf.output import OutputCapture

    uprobes = EbpfCollector(
        node=node, proc_root=proc_root, probe_groups=probe_groups or PROBE_GROUPS
    )
    collectors: list[Any] = [uprobes]
    if capture_output:
        collectors.append(
            OutputCapture(node=node, proc_root=proc_root, pid_source=lambda: uprobes.cuda_pids)
        )
    return collectors
