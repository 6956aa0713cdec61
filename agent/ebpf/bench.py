"""What the uprobes cost the probed program, in nanoseconds per call.

Builds the stand-in libcuda/libnccl (agent.ebpf.probe_target) and times N calls each of
cuLaunchKernel (an entry uprobe only), cuStreamSynchronize and ncclAllReduce (entry uprobe and
return uretprobe) in the driver program. It does so for two builds of the stand-in, -O2 and -O0
(VARIANTS), because the probed function's first instruction decides what a uprobe costs (see
docs/ebpf.md); for each, three ways:
1. without probes;
2. with a no-op BPF program on the same probes: the kernel's own uprobe cost (the trap, and for
   uretprobes the return trampoline), which no BPF program can avoid;
3. with the real collector attached (probes.c), which also checks that the probes saw every
   call and times one `collect()` (the agent-side read of the maps).
The stand-in functions return at once, so the differences are the probes' own cost. Times are
CPU time of the calling process (user + kernel, CLOCK_PROCESS_CPUTIME_ID): what the probes
take from the job, independent of other load on the machine; wall time is reported beside it.

`proof-agent bench --ebpf` prints this; `python -m agent.ebpf.bench` does too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.ebpf._bcc import import_bcc
from agent.ebpf.collector import EbpfCollector
from agent.ebpf.probe_target import Built, Driver, build
from contract import signals

KINDS = ("launch", "sync", "allreduce")
_PROBES = {"launch": "uprobe", "sync": "uprobe+uretprobe", "allreduce": "uprobe+uretprobe"}
# kind -> (library, symbol, with a uretprobe)
_TARGETS = {
    "launch": ("cuda", b"cuLaunchKernel", False),
    "sync": ("cuda", b"cuStreamSynchronize", True),
    "allreduce": ("nccl", b"ncclAllReduce", True),
}
_NOOP_PROGRAM = b"int noop(void *ctx) { return 0; }"


def _time_calls(driver: Driver, kind: str, calls: int, repeats: int) -> tuple[float, float]:
    """Median (wall, CPU) ns per call over `repeats` runs of `calls` calls."""
    runs = [driver.command(f"bench {kind} {calls}").split() for _ in range(repeats)]
    return (
        statistics.median(float(r[0]) for r in runs),
        statistics.median(float(r[1]) for r in runs),
    )


def _time_noop_probes(built: Built, driver: Driver, calls: int, repeats: int) -> dict[str, Any]:
    bcc = import_bcc()
    timings = {}
    for kind, (library, symbol, with_return) in _TARGETS.items():
        path = bytes(built.libcuda if library == "cuda" else built.libnccl)
        bpf = bcc.BPF(text=_NOOP_PROGRAM)
        try:
            bpf.attach_uprobe(name=path, sym=symbol, fn_name=b"noop")
            if with_return:
                bpf.attach_uretprobe(name=path, sym=symbol, fn_name=b"noop")
            timings[kind] = _time_calls(driver, kind, calls, repeats)
        finally:
            bpf.cleanup()
    return timings


# The stand-in built two ways: the probed functions' first instruction decides whether the
# kernel can emulate it or must single-step it out of line (a debug trap: much dearer in a VM).
VARIANTS: dict[str, str] = {
    "-O2": "first instruction a RIP-relative load: single-stepped out of line",
    "-O0": "first instruction push %rbp: emulated by the kernel, no single-step",
}


def _first_bytes(bcc: Any, library: Path, symbol: bytes) -> str:
    """The first bytes of `symbol` in `library`, in hex (what the uprobe replaces)."""
    for name, address in bcc.BPF.get_user_functions_and_addresses(bytes(library), symbol):
        if name == symbol:
            with open(library, "rb") as elf:
                elf.seek(address)  # a gcc-built .so maps its text at file offset == vaddr
                return elf.read(4).hex(" ")
    return "?"


def _measure_variant(library_opt: str, calls: int, repeats: int) -> dict[str, Any]:
    bcc = import_bcc()
    with tempfile.TemporaryDirectory(prefix="proof-ebpf-bench-") as tmp:
        built = build(Path(tmp), library_opt=library_opt)
        first = {
            kind: _first_bytes(bcc, built.libcuda if lib == "cuda" else built.libnccl, symbol)
            for kind, (lib, symbol, _) in _TARGETS.items()
        }
        with Driver(built) as driver:
            _time_calls(driver, "launch", min(calls, 100_000), 1)  # warm up caches and pages
            without = {kind: _time_calls(driver, kind, calls, repeats) for kind in KINDS}
            collector = EbpfCollector(rescan_interval_s=3600.0)
            if not collector.start():
                raise RuntimeError(collector.unavailable_reason or "BPF cannot be loaded")
            try:
                noop = _time_noop_probes(built, driver, calls, repeats)
                collector.collect(time.time())  # attaches to the driver's libraries
                with_probes = {kind: _time_calls(driver, kind, calls, repeats) for kind in KINDS}
                started = time.perf_counter()
                records = collector.collect(time.time())
                collect_ms = (time.perf_counter() - started) * 1000.0
            finally:
                collector.close()
    counts = {
        (r["name"], (r.get("labels") or {}).get("op")): r["value"]
        for r in records
        if r.get(signals.PID) == driver.pid
    }
    expected = repeats * calls  # the no-op runs are not counted: other BPF programs
    probed = {
        "launch": counts.get((signals.CUDA_LAUNCHES, None)),
        "sync": counts.get((signals.CUDA_SYNCS, None)),
        "allreduce": counts.get((signals.NCCL_CALLS, "allreduce")),
    }
    variant: dict[str, Any] = {"library_opt": library_opt, "kinds": {}}
    for kind in KINDS:
        base_cpu, noop_cpu, real_cpu = without[kind][1], noop[kind][1], with_probes[kind][1]
        variant["kinds"][kind] = {
            "probes": _PROBES[kind],
            "first_bytes": first[kind],
            "cpu_ns_per_call_without": round(base_cpu, 1),
            "cpu_ns_per_call_noop_probes": round(noop_cpu, 1),
            "cpu_ns_per_call_with": round(real_cpu, 1),
            "overhead_ns_per_call": round(real_cpu - base_cpu, 1),
            "of_which_kernel_uprobe_ns": round(noop_cpu - base_cpu, 1),
            "of_which_bpf_program_ns": round(real_cpu - noop_cpu, 1),
            "wall_ns_per_call_without": round(without[kind][0], 1),
            "wall_ns_per_call_with": round(with_probes[kind][0], 1),
            "calls_seen_by_probes": probed[kind],
            "calls_made": expected,
        }
    variant["collect_ms"] = round(collect_ms, 2)
    variant["complete"] = all(probed[kind] == expected for kind in KINDS)
    return variant


def measure_probe_overhead(calls: int = 1_000_000, repeats: int = 1) -> dict[str, Any]:
    """CPU ns/call without and with the probes for each probed kind, for each build variant
    of the stand-in library (VARIANTS), and the overhead split into the kernel's uprobe cost
    and our BPF program's.

    Raises RuntimeError when BPF programs cannot be loaded here (the reason in the message)."""
    result: dict[str, Any] = {"calls_per_run": calls, "runs": repeats, "variants": {}}
    for library_opt in VARIANTS:
        result["variants"][library_opt] = _measure_variant(library_opt, calls, repeats)
    result["complete"] = all(v["complete"] for v in result["variants"].values())
    return result


def format_report(result: dict[str, Any]) -> str:
    lines = [
        f"eBPF uprobe cost, {result['calls_per_run']:,} calls x {result['runs']} runs "
        "(median), stand-in libcuda/libnccl; CPU ns per call of the calling process "
        "(user + kernel):"
    ]
    for library_opt, variant in result["variants"].items():
        lines.append(f"  library built {library_opt}: {VARIANTS[library_opt]}")
        for kind, row in variant["kinds"].items():
            lines.append(
                f"    {kind:<10} {row['probes']:<17} without {row['cpu_ns_per_call_without']:>8.1f}"
                f"  with {row['cpu_ns_per_call_with']:>8.1f}"
                f"  overhead {row['overhead_ns_per_call']:>8.1f} ns/call"
                f" = kernel uprobe {row['of_which_kernel_uprobe_ns']:>8.1f}"
                f" + BPF program {row['of_which_bpf_program_ns']:>7.1f}"
            )
            lines.append(
                f"    {'':<10} first bytes {row['first_bytes']}; wall"
                f" {row['wall_ns_per_call_without']:.1f} -> {row['wall_ns_per_call_with']:.1f}"
                f" ns/call; probes saw {row['calls_seen_by_probes']:,}"
                f" of {row['calls_made']:,} calls"
            )
        lines.append(f"    one collect() reading the maps: {variant['collect_ms']:.2f} ms")
    if not result["complete"]:
        lines.append("  WARNING: the probes did not see every call")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls per timed run")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs (median reported)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    try:
        result = measure_probe_overhead(args.calls, args.repeats)
    except Exception as error:  # no compiler, no BPF: say why, non-zero exit
        print(f"ebpf bench: cannot run: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0 if result["complete"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.ebpf.bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
