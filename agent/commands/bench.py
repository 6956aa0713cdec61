"""`proof-agent bench`: the agent's cost, measured.

`--ebpf`: the cost per probed call of the eBPF uprobes, on the stand-in libcuda/libnccl
(agent.ebpf.bench; needs root/BPF and a C compiler). The collection-path benchmark (simulated
8-GPU node at 1 Hz: CPU cores and peak RSS) is a separate part of this command.
"""

from __future__ import annotations

import argparse
import sys

from agent.ebpf import bench as ebpf_bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ebpf", action="store_true", help="measure the uprobes' cost per probed call (ns)"
    )
    ebpf_bench.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.ebpf:
        return ebpf_bench.run(args)
    print(
        "proof-agent bench: the collection-path benchmark is not in this build; "
        "use --ebpf for the uprobe cost",
        file=sys.stderr,
    )
    return 2
