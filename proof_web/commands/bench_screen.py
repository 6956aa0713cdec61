"""`proof bench screen`: the batch screen's CPU per stored batch (engine/screen.py).

Every batch ingest stores passes the screen (investigations/receivers.py), so its cost is paid
per node per second across the fleet. The bench decodes a simulated run's 1 s batches the way
ingest does (contract's BatchBuilder → ingest.processing.decode_batch: the same SeriesInfo
lists, counts and values), then times `BatchScreen.look` over them in one thread and prints the
CPU per batch, per series and per 1,000 GPUs at one batch per node per second.

    proof bench screen [--scenario healthy_training] [--nodes 1] [--gpus-per-node 8]
                       [--duration 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from contract.wire.encode import BatchBuilder
from engine.screen import BatchScreen
from ingest.processing import DecodedBatch, Limits, decode_batch
from simulator import simulate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="healthy_training")
    parser.add_argument("--nodes", type=int, default=1, help="nodes in one batch (one agent)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--duration", type=float, default=300.0, help="data seconds")
    parser.add_argument("--seed", type=int, default=1)


def _batches(args: argparse.Namespace) -> list[DecodedBatch]:
    start_ts = time.time() - args.duration  # decode_batch accepts the last 7 days only
    run = simulate(
        args.scenario,
        seed=args.seed,
        duration_s=args.duration,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        start_ts=start_ts,
    )
    records = sorted(run.records(), key=lambda r: float(r.get("ts", 0.0)))
    out: list[DecodedBatch] = []
    builder = BatchBuilder("bench-screen")
    cut = float(records[0]["ts"]) + 1.0
    for record in records:
        if float(record["ts"]) >= cut:
            out.append(decode_batch(builder.build(len(out) + 1), Limits()))
            builder = BatchBuilder("bench-screen")
            while float(record["ts"]) >= cut:
                cut += 1.0
        builder.add(record)
    if len(builder):
        out.append(decode_batch(builder.build(len(out) + 1), Limits()))
    return out


def run(args: argparse.Namespace) -> int:
    batches = _batches(args)
    series = float(np.mean([len(b.series) for b in batches]))
    screen = BatchScreen()
    with_signs = 0
    for batch in batches:
        signs = screen.look(
            batch.series, batch.counts, batch.values, batch.logs, batch.events, batch.ts_ms
        )
        with_signs += bool(signs)
    per_batch_ms = screen.cpu_s / len(batches) * 1e3
    gpus = args.nodes * args.gpus_per_node
    # One batch per agent per second: the screen's cores per 1,000 GPUs.
    cores_per_1000 = per_batch_ms / 1e3 * 1000 / gpus
    print(
        f"proof bench screen: {args.scenario}, {args.nodes} node(s) x {args.gpus_per_node} GPUs, "
        f"{len(batches)} batches of {series:.0f} series"
    )
    print(
        f"  {per_batch_ms:.3f} ms CPU a batch, {per_batch_ms * 1e3 / series:.2f} us a series; "
        f"{cores_per_1000:.4f} cores per 1,000 GPUs at one batch per node-group a second; "
        f"batches with a sign: {with_signs}"
    )
    return 0
