"""`proof bench ingest`: the ingest pipeline's throughput, latency, footprint and read speed.
(The `proof bench` dispatcher is proof_web/commands/bench.py.)

Starts `proof ingest` (real gRPC on loopback, real PostgreSQL with row-level security), then
--agents simulated agents spread over --agent-processes processes, each a node with 8 GPUs and
--series series at 1 Hz. Every agent streams batches of --batch-seconds seconds of data as
fast as the server acks them (window --window), for --duration seconds; the data is stamped
in the past (a few days ago, within the accepted window), so the run measures how many
samples per second the server sustains, not how fast a clock ticks. Then it prints:

  samples/s sustained (acked samples / wall time), p50/p99 ack latency,
  bytes on disk per sample (growth of pg_total_relation_size of the sample tables / samples),
  the time to read one job's 10 minutes of all series for 64 GPUs (8 nodes × 8 GPUs),
  and the rate of a bare PostgreSQL binary COPY of the same samples as plain rows
  (series_id, ts, value) into an unindexed table — the ratio is the pipeline's overhead.

Needs DATABASE_URL (and DATABASE_OWNER_URL for the COPY baseline table). CI does not run it.

`--codec` prints only the block codec's figures on the agents' batches (no server, no
database): bytes per sample and the CPU time to encode and decode one batch (one node's block)
in format 3 and in format 2, interleaved.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import django
import grpc
import numpy as np
from django.conf import settings
from django.db import connections
from grpc_health.v1 import health_pb2, health_pb2_grpc

from contract import signals
from contract.wire import ingest_pb2
from contract.wire.client import BatchSender, EncodedBatch, open_channel
from contract.wire.encode import BatchBuilder
from ingest import blocks

GPUS_PER_NODE = 8
JOB_ID = "bench-job"
JOB_NODES = 8  # 64 GPUs


# --- simulated agents (no Django in here: they run in spawned processes) -----------------------


def _template(node: str, series: int, seconds: int, job: str | None, seed: int) -> Any:
    """One batch: `series` series (GPU-scope mostly, some node-scope) × `seconds` samples at
    1 Hz, with values shaped like the real signals (constants, small integers, 3-decimal ratios,
    counters, watts to 0.1)."""
    rng = np.random.default_rng(seed)
    builder = BatchBuilder(f"bench-{node}")
    ts = np.arange(seconds, dtype=np.float64) + 1.0e9  # replaced per batch
    per_gpu = (series - 50) // GPUS_PER_NODE
    names: list[tuple[str, dict[str, Any]]] = []
    for g in range(GPUS_PER_NODE):
        ident: dict[str, Any] = {
            signals.NODE: node,
            signals.GPU: f"GPU-{node}-{g}",
            signals.GPU_INDEX: g,
        }
        if job:
            ident.update({signals.JOB: job, signals.RANK: g, signals.LOCAL_RANK: g})
        names += [(f"bench.gpu.{k}", ident) for k in range(per_gpu)]
    names += [(f"bench.node.{k}", {signals.NODE: node}) for k in range(series - len(names))]
    for i, (name, ident) in enumerate(names):
        kind = i % 5
        if kind == 0:
            values = np.full(seconds, float(rng.integers(0, 100)))
        elif kind == 1:
            values = np.round(60 + np.cumsum(rng.normal(0, 0.3, seconds)))
        elif kind == 2:
            values = np.round(rng.uniform(0, 1, seconds), 3)
        elif kind == 3:
            values = np.cumsum(rng.integers(0, 1_000_000, seconds)).astype(np.float64)
        else:
            values = np.round(300 + rng.normal(0, 20, seconds), 1)
        builder.add_samples(name, ident, ts, values)
    return builder.build(1)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _sint64(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))  # zigzag


class _Wire:
    """One template batch serialized once, around the two fields each send changes (the
    sequence, field 2, and the first timestamp, the first element of the packed ts_ms, field
    6): `batch(sequence, ts0)` is the bytes SerializeToString gives for the template with those
    two set (checked here once), sent as an EncodedBatch, as an agent sends its spool. The
    simulated agents share the server's two cores: re-encoding 51,000 samples a batch (~2 ms)
    would be CPU taken from the ingest under test."""

    def __init__(self, template: Any) -> None:
        def only(*numbers: int) -> bytes:
            part = ingest_pb2.Batch()
            part.CopyFrom(template)
            for f in part.DESCRIPTOR.fields:
                if f.number not in numbers:
                    part.ClearField(f.name)
            return part.SerializeToString()  # type: ignore[no-any-return]

        self.head = only(1)
        self.middle = only(3, 4, 5)
        self.tail = only(*range(7, 13))
        rest = ingest_pb2.Batch(ts_ms=template.ts_ms[1:]).SerializeToString()
        length_end = 1  # after the tag byte, the packed field's length varint
        while rest[length_end] & 0x80:
            length_end += 1
        self.ts_rest = rest[length_end + 1 :]
        probe = ingest_pb2.Batch()
        probe.CopyFrom(template)
        probe.sequence, probe.ts_ms[0] = 7, 1_700_000_000_000
        if self.batch(7, 1_700_000_000_000) != probe.SerializeToString():
            raise AssertionError("the patched bytes differ from the serialized batch")

    def batch(self, sequence: int, ts0: int) -> bytes:
        first = _sint64(ts0)
        ts_field = b"\x32" + _varint(len(first) + len(self.ts_rest)) + first + self.ts_rest
        return b"".join((self.head, b"\x10", _varint(sequence), self.middle, ts_field, self.tail))


def _agent(
    port: int, token: str, index: int, args: dict[str, Any], deadline: float, out: Any
) -> None:
    node = f"bench-{args['run']}-node-{index}"
    job = JOB_ID if index < JOB_NODES else None
    seconds = args["batch_seconds"]
    templates = [_template(node, args["series"], seconds, job, index * 10 + v) for v in range(3)]
    per_batch = sum(templates[0].sample_counts)
    variants = [_Wire(t) for t in templates]
    sender = BatchSender(
        open_channel(f"127.0.0.1:{port}"), token, window=args["window"], keep_latencies=True
    )
    base_ms = args["base_ms"]
    sequence = 0
    while time.time() < deadline:
        wire = variants[sequence % 3]
        sequence += 1
        ts0 = base_ms + (sequence - 1) * seconds * 1000
        sender.send(EncodedBatch(sequence, wire.batch(sequence, ts0)), timeout=300)
    sender.flush(timeout=300)
    sender.close(timeout=10)
    out.put((index, sequence, per_batch, sender.stats.acked, list(sender.stats.ack_latencies)))


def _agent_process(
    port: int, token: str, indices: list[int], args: dict[str, Any], deadline: float, out: Any
) -> None:
    threads = [
        threading.Thread(target=_agent, args=(port, token, i, args, deadline, out)) for i in indices
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of streaming (≥ 60)")
    parser.add_argument("--agents", type=int, default=16, help="simulated agents (nodes)")
    parser.add_argument("--agent-processes", type=int, default=2)
    parser.add_argument("--series", type=int, default=850, help="series per agent")
    parser.add_argument("--batch-seconds", type=int, default=60, help="seconds of data per batch")
    parser.add_argument("--window", type=int, default=2, help="batches in flight per agent")
    parser.add_argument("--server-workers", type=int, default=1, help="ingest server processes")
    parser.add_argument("--writers", type=int, default=2, help="writer threads per server process")
    parser.add_argument(
        "--copy-samples",
        type=int,
        default=20_000_000,
        help="cap on samples for the bare COPY baseline",
    )
    parser.add_argument(
        "--codec",
        action="store_true",
        help="only the block codec's figures on the agents' batches (no server, no database)",
    )


def proof_ingest_command(port: int, *options: str) -> list[str]:
    """The command line of `proof ingest` on `port` run by this interpreter (a child process)."""
    return [sys.executable, "-m", "proof_web.cli", "ingest", "--port", str(port), *options]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=2
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the ingest server did not become healthy")


def _block_parts(batch: Any) -> tuple[np.ndarray, ...]:
    """A batch as ingest stores it: one node's block (series ids, counts, ms, values)."""
    counts = np.array(batch.sample_counts, dtype=np.int64)
    ids = np.arange(1, len(counts) + 1, dtype=np.int64)  # the catalog's ids: one run per node
    ts = np.cumsum(np.array(batch.ts_ms, dtype=np.int64))  # the wire's deltas
    return ids, counts, ts, np.array(batch.values, dtype=np.float64)


def codec_figures(series: int, seconds: int, rounds: int = 60) -> list[str]:
    """Bytes/sample and CPU ms per block to encode and decode the agents' batches, format 3
    against format 2 (interleaved rounds, the best round of each: the machine is shared)."""
    parts = [
        _block_parts(_template(f"codec-{i}", series, seconds, JOB_ID if i < 2 else None, i * 10))
        for i in range(4)
    ]
    samples = sum(len(p[3]) for p in parts)
    codecs = {"format 3": blocks.encode, "format 2": blocks.encode_v2}
    payloads = {name: [enc(*p) for p in parts] for name, enc in codecs.items()}
    best: dict[str, list[float]] = {name: [np.inf, np.inf] for name in codecs}
    for _ in range(rounds):
        # Encodes back to back, then decodes back to back (as ingest's writers and the read
        # pool run them), the formats alternating within each.
        for step in (0, 1):
            for name, enc in codecs.items():
                began = time.thread_time()
                if step == 0:
                    for p in parts:
                        enc(*p)
                else:
                    for payload in payloads[name]:
                        blocks.decode(payload)
                spent = (time.thread_time() - began) / len(parts)
                best[name][step] = min(best[name][step], spent)
    lines = [f"block codec, {len(parts)} blocks of {samples // len(parts):,} samples:"]
    for name in codecs:
        size = sum(len(b) for b in payloads[name]) / samples
        lines.append(
            f"  {name}: {size:.3f} bytes/sample (payload), encode {best[name][0] * 1000:.2f} ms, "
            f"decode {best[name][1] * 1000:.2f} ms per block (CPU, best of {rounds})"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    if args.codec:
        print("\n".join(codec_figures(args.series, args.batch_seconds)))
        return 0
    django.setup()
    if not settings.IS_POSTGRES:
        print("proof bench ingest: needs PostgreSQL (set DATABASE_URL)", file=sys.stderr)
        return 2
    # After django.setup(): these import models.
    from ingest import selectors, storage
    from tenants import services as tenant_services

    run_id = f"{int(time.time())}"
    operator, _admin = tenant_services.do_create_operator(
        name=f"Bench {run_id}",
        slug=f"bench-{run_id}",
        admin_username=f"bench-{run_id}",
        admin_email="bench@example.invalid",
        admin_password=os.urandom(16).hex(),
    )
    _, token = tenant_services.do_create_agent_token(operator.pk, name="bench")
    bytes_before = storage.block_table_bytes()
    port = _free_port()
    server = subprocess.Popen(  # noqa: S603 - our interpreter running our own ingest server
        proof_ingest_command(
            port,
            "--workers",
            str(args.server_workers),
            "--writers",
            str(args.writers),
            "--metrics-port",
            "0",
        ),
        cwd=Path(__file__).resolve().parents[1],
    )
    results: list[tuple[int, int, int, int, list[float]]] = []
    try:
        _wait_healthy(port)
        base_ms = int((time.time() - 3 * 86400) * 1000)
        params = {
            "run": run_id,
            "series": args.series,
            "batch_seconds": args.batch_seconds,
            "window": args.window,
            "base_ms": base_ms,
        }
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        groups = [
            list(range(p, args.agents, args.agent_processes)) for p in range(args.agent_processes)
        ]
        started = time.time()
        deadline = started + args.duration
        procs = [
            ctx.Process(target=_agent_process, args=(port, token, g, params, deadline, out))
            for g in groups
            if g
        ]
        for p in procs:
            p.start()
        give_up = time.time() + args.duration + 600
        while len(results) < args.agents:
            if server.poll() is not None:
                raise RuntimeError(f"the ingest server exited with status {server.returncode}")
            if time.time() > give_up:
                raise RuntimeError("agents did not finish in time")
            try:
                results.append(out.get(timeout=2))
            except queue.Empty:
                continue
        elapsed = time.time() - started
        for p in procs:
            p.join()
    finally:
        server.terminate()
        server.wait(timeout=120)

    acked_samples = sum(acked * per_batch for _i, _s, per_batch, acked, _l in results)
    latencies = np.array([x for r in results for x in r[4]])
    bytes_after = storage.block_table_bytes()
    rate = acked_samples / elapsed
    print(
        f"agents: {args.agents} × {args.series} series, batches of {args.batch_seconds} s, "
        f"window {args.window}, {args.agent_processes} agent processes, "
        f"{args.server_workers} server process(es) × {args.writers} writers, {os.cpu_count()} CPUs"
    )
    print(f"samples acked: {acked_samples:,} in {elapsed:.1f} s")
    print(f"samples/s sustained: {rate:,.0f}   (target ≥ 850,000)")
    if len(latencies):
        print(
            f"ack latency p50: {np.percentile(latencies, 50) * 1000:.0f} ms   "
            f"p99: {np.percentile(latencies, 99) * 1000:.0f} ms"
        )
    growth = bytes_after - bytes_before
    print(
        f"bytes on disk per sample: {growth / max(acked_samples, 1):.2f}   (target ≤ 4; "
        f"{growth:,} bytes for the run's sample tables)"
    )

    t0 = base_ms / 1000
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        data = selectors.job_series(operator.pk, JOB_ID, t0, t0 + 600)
        timings.append(time.perf_counter() - began)
    n_series = len(data)
    n_read = sum(len(d.values) for d in data)
    print(
        f"read job's 10 min, 64 GPUs: {n_series} series, {n_read:,} samples in "
        f"{timings[0] * 1000:.0f} ms cold, {min(timings[1:]) * 1000:.0f} ms warm   "
        "(target ≤ 200 ms)"
    )

    copy_n = min(acked_samples, args.copy_samples)
    copy_rate = bare_copy_rate(copy_n, args.series)
    print(
        f"bare PostgreSQL COPY of {copy_n:,} (series_id, ts, value) rows: "
        f"{copy_rate:,.0f} samples/s → pipeline/COPY = {rate / copy_rate:.2f}"
    )
    return 0


def bare_copy_rate(samples: int, series: int) -> float:
    """Binary COPY of `samples` plain rows into a fresh unindexed table (as the owner when
    configured, else a temporary table), the COPY payload pre-built with numpy."""
    alias = "owner" if "owner" in connections.settings else "default"
    connection = connections[alias]
    table = "ingest_bench_copy" if alias == "owner" else "pg_temp.ingest_bench_copy"
    row = np.dtype(
        [
            ("n", ">i2"),
            ("l1", ">i4"),
            ("sid", ">i8"),
            ("l2", ">i4"),
            ("ts", ">i8"),
            ("l3", ">i4"),
            ("v", ">f8"),
        ]
    )
    chunk = 1_000_000
    rng = np.random.default_rng(0)
    rows = np.zeros(chunk, dtype=row)
    rows["n"], rows["l1"], rows["l2"], rows["l3"] = 3, 8, 8, 8
    rows["sid"] = np.arange(chunk) % series
    rows["ts"] = 1_700_000_000_000 + (np.arange(chunk) // series) * 1000
    rows["v"] = np.round(rng.uniform(0, 100, chunk), 1)
    header = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
    body = rows.tobytes()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {table}")
        cursor.execute(f"CREATE TABLE {table} (series_id bigint, ts_ms bigint, value float8)")
    began = time.perf_counter()
    written = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor
        while written < samples:
            n = min(chunk, samples - written)
            with raw.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
                copy.write(
                    header + (body if n == chunk else body[: n * row.itemsize]) + b"\xff\xff"
                )
            written += n
    elapsed = time.perf_counter() - began
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {table}")
    return written / elapsed
