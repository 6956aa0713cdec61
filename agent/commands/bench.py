"""`proof-agent bench`: the agent's cost, measured.

With no flags: the collection-path benchmark (agent.runtime.bench_node) — one simulated 8-GPU
node at 1 Hz for `--duration` seconds (default 60) with the real file collectors on fixture
roots, the real eBPF probes on 8 stand-in GPU processes where BPF loads, and the real
transport (GrpcSink: encoding, on-disk spool, gRPC to a loopback ack server in a separate
process); prints the series count, CPU cores used (process CPU time / wall time) and peak RSS,
then the eBPF uprobes' cost per probed call (ns/call, agent.ebpf.bench) unless `--no-ebpf`.

`--ebpf`: only the per-call uprobe cost (needs root/BPF and a C compiler).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from agent.ebpf import bench as ebpf_bench
from agent.runtime.bench_node import bench_node


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ebpf", action="store_true", help="only measure the uprobes' cost per probed call (ns)"
    )
    parser.add_argument(
        "--no-ebpf",
        action="store_true",
        help="leave eBPF out: no real probes in the collection path, no ns/call section",
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of collection at 1 Hz (default 60)"
    )
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    ebpf_bench.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.ebpf:
        return ebpf_bench.run(args)
    if args.duration <= 0:
        print("proof-agent bench: --duration must be > 0", file=sys.stderr)
        return 2
    print(f"collection path: {args.gpus} simulated GPUs, 1 Hz, {args.duration:g} s ...", flush=True)
    result = bench_node(duration_s=args.duration, gpus=args.gpus, ebpf=not args.no_ebpf)
    if args.json:
        print(json.dumps({**asdict(result), "cores": result.cores}, indent=2))
    else:
        print("\n".join(result.lines()), flush=True)
    if args.no_ebpf:
        return 0
    print("\nuprobe cost per probed call (stand-in libcuda/libnccl):", flush=True)
    return ebpf_bench.run(args)
