"""`proof simulate`: write a simulated trace for a scenario, or list the scenarios.

Imports no Django: it runs without a database.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from contract.cli import NumberOption
from simulator import UnknownScenario, list_scenarios, simulate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help="scenario name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the scenarios, one per line")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--duration", type=float, default=1800.0, help="trace length in seconds (default 1800)"
    )
    parser.add_argument(
        "--nodes", type=int, default=None, help="nodes of the job (default: random)"
    )
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default 8)")
    parser.add_argument("--start-ts", type=float, default=None, help="trace start, Unix seconds")
    parser.add_argument(
        "--without",
        default="",
        help="comma-separated sources the agent could not read: ebpf, dcgm_prof, logs, ib, "
        "storage, kernel_log (their records are left out, meta.missing_sources says so)",
    )
    parser.add_argument("--out", help="output path (.jsonl or .jsonl.gz)")


def run(args: argparse.Namespace) -> int:
    if args.list:
        infos = list_scenarios()
        width = max(len(i.name) for i in infos)
        for info in infos:
            family = info.family or "healthy"
            print(f"{info.name:<{width}}  {info.kind:<9}  {family:<20}  {info.description}")
        return 0
    if not args.scenario or not args.out:
        print("proof simulate: give SCENARIO and --out FILE (or --list)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        sim = simulate(
            args.scenario,
            seed=args.seed,
            duration_s=args.duration,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            start_ts=args.start_ts,
            without=[src for src in args.without.split(",") if src],
        )
    except (UnknownScenario, ValueError) as exc:
        print(f"proof simulate: {exc}", file=sys.stderr)
        return 2
    t1 = time.perf_counter()
    written = sim.write(args.out)
    t2 = time.perf_counter()
    size = os.path.getsize(args.out)
    print(
        f"{args.scenario} seed={args.seed}: {written} records, {size / 1e6:.1f} MB -> {args.out} "
        f"(simulate {t1 - t0:.1f}s, write {t2 - t1:.1f}s)",
        file=sys.stderr,
    )
    return 0


def run_options(
    *, seeds: int, first_seed: int, nodes: int, nodes_note: str, sizes_from_scenario: bool
) -> list[NumberOption]:
    """The options that choose which simulated runs a command plays (`proof eval`,
    `proof bench live`): seeds, first seed, length, size; each command gives its defaults.
    `sizes_from_scenario`: the command reads 0 as "the scenario's own size"."""
    gpus_note = "; 0: the simulator's 8" if sizes_from_scenario else ""
    return [
        ("--seeds", int, seeds, f"seeds per scenario (default {seeds})"),
        ("--first-seed", int, first_seed, f"first seed (default {first_seed})"),
        ("--duration", float, 600.0, "simulated seconds per run (default 600)"),
        ("--nodes", int, nodes, f"nodes per scenario run (default {nodes}; {nodes_note})"),
        ("--gpus-per-node", int, 4, f"GPUs per node (default 4{gpus_note})"),
    ]
