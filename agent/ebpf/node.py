"""What a real node asks of the eBPF package: whether the uprobes can run here
(`ebpf_status()`, for `proof-agent doctor`) and the collectors to run (`build_collectors()`,
for the real-node backend).

Kept out of the package `__init__` so that `agent.ebpf` imports none of its submodules and the
collector and output modules, which import `agent.ebpf.bpfsys`/`discovery`, form no circle
with it.
"""

from __future__ import annotations

import os
from typing import Any

from agent.ebpf._bcc import BccUnavailable, import_bcc
from agent.ebpf.bpfsys import UPROBE_PMU
from agent.ebpf.calls import PROBE_GROUPS
from agent.ebpf.collector import EbpfCollector
from agent.ebpf.loader import load_in_child
from agent.ebpf.output import OutputCapture


def ebpf_status() -> tuple[bool, str]:
    """Whether this node can run the eBPF collector, and why not: imports bcc, checks that the
    kernel can create uprobes, and compiles and loads the real probe program the way the
    collector does (so a missing header tree or a refusing kernel shows up here, not at run
    time). Takes ~1 s."""
    try:
        bcc = import_bcc()
    except BccUnavailable as error:
        return False, str(error)
    if not os.path.exists(UPROBE_PMU):
        return False, (
            f"the kernel offers no uprobe PMU ({UPROBE_PMU}): Linux 4.17+ with "
            "CONFIG_UPROBE_EVENTS is needed"
        )
    try:
        # The real path: compiled and loaded in a child process, the fds handed to this one.
        load_in_child().close()
    except RuntimeError as error:
        return False, f"BPF programs cannot be loaded: {error}"
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
    uprobes = EbpfCollector(
        node=node, proc_root=proc_root, probe_groups=probe_groups or PROBE_GROUPS
    )
    collectors: list[Any] = [uprobes]
    if capture_output:
        collectors.append(
            OutputCapture(node=node, proc_root=proc_root, pid_source=lambda: uprobes.cuda_pids)
        )
    return collectors
