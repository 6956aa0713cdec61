"""The live window cache's refresh, standalone: what a large job's evaluation spends reading
the blocks stored since its last refresh (issue 18).

Stores a simulated healthy training run (default 25 nodes × 8 GPUs, 300 s) through ingest's
own services, one 1 s batch per node as the agents ship them, into the database the
environment names (a bench database of your own: DATABASE_URL / DATABASE_OWNER_URL,
PROOF_ENV=development), then replays the live cadence over it: a refresh of the job's
`CachedIngestStore` every `--every` s of data from `--from` s on, each timed as the caller
thread's `time.thread_time()` plus the growth of `ingest.selectors.pool_decode_cpu_s()`.
Also prints what one node's 1 s block costs to decode, and a digest of every series the
entry holds after the last refresh (to compare two versions of the code bit for bit).

    . bench.env; nice -n 10 .venv/bin/python scripts/bench_refresh.py [--reuse]

`--reuse` skips storing when the operator of the last run (slug bench-refresh) holds data.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")

import django

django.setup()

from contract.wire.encode import BatchBuilder  # noqa: E402
from engine.window import JobWindow, build_job_window  # noqa: E402
from ingest import blocks  # noqa: E402
from ingest import selectors as ingest_selectors  # noqa: E402
from ingest import services as ingest_services  # noqa: E402
from ingest.models import Node  # noqa: E402
from ingest.processing import Limits, decode_batch  # noqa: E402
from ingest.storage import read_block_payloads  # noqa: E402
from investigations import window_cache  # noqa: E402
from investigations.tests.live_helpers import register_gpus  # noqa: E402
from simulator import simulate  # noqa: E402
from tenants.context import system_context, tenant_context  # noqa: E402

SLUG = "bench-refresh"


def _operator(slug: str) -> tuple[int, bool]:
    """The bench operator's id and whether it was just created."""
    from tenants import services as tenant_services
    from tenants.models import Operator

    with system_context():
        found = Operator.objects.filter(slug=slug).first()
    if found is not None:
        return int(found.pk), False
    operator, _admin = tenant_services.do_create_operator(
        name="Bench refresh",
        slug=slug,
        admin_username=slug,
        admin_email="bench@example.invalid",
        admin_password=os.urandom(16).hex(),
    )
    return int(operator.pk), True


def _store(operator_id: int, args: argparse.Namespace) -> str:
    """Simulate and store the run (ending now), one 1 s batch per node; the job id."""
    start_ts = float(int(time.time() - args.duration))
    run = simulate(
        "healthy_training",
        seed=args.seed,
        duration_s=args.duration,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        start_ts=start_ts,
    )
    register_gpus(operator_id, run.records())
    by_batch: dict[tuple[int, str], list[dict[str, Any]]] = {}
    job = ""
    for record in run.records():
        job = job or str(record.get("job") or "")
        second = int(record["ts"] - start_ts)
        by_batch.setdefault((second, str(record.get("node") or "")), []).append(record)
    limits = Limits()
    builders: dict[str, BatchBuilder] = {}
    sequences: dict[str, int] = {}
    began = time.monotonic()
    for i, ((second, node), records) in enumerate(sorted(by_batch.items())):
        builder = builders.setdefault(node, BatchBuilder(f"agent-{node}"))
        for record in records:
            builder.add(record)
        sequences[node] = sequences.get(node, 0) + 1
        ingest_services.store_batch(
            operator_id, decode_batch(builder.build(sequences[node]), limits)
        )
        if i % 1000 == 0:
            print(f"  stored {i} batches, {second} s, {time.monotonic() - began:.0f} s", flush=True)
    return job


def _job_span(operator_id: int) -> tuple[str, float, float]:
    """The bench job's id and data span (JobActivity, as the live evaluation reads it)."""
    from ingest.models import Job
    from investigations.live import _spans

    with tenant_context(operator_id):
        job = str(
            Job.objects.for_tenant(operator_id).order_by("pk").values_list("job_id", flat=True)[0]
        )
    first, last = _spans(operator_id, [job])[job]
    return job, float(first), float(last)


def _digest(entry: window_cache._Entry) -> str:
    h = hashlib.sha256()
    held = list(entry.series.items())
    for node in sorted(entry.node_series):
        held += list(entry.node_series[node].items())
    for info, series in sorted(held, key=lambda kv: repr(kv[0])):
        view = series.view()
        h.update(repr(info).encode())
        h.update(view.ts.tobytes())
        h.update(view.values.tobytes())
    return h.hexdigest()[:16]


def _window_bytes(window: JobWindow) -> bytes:
    """A window's times, matrices and node series as bytes."""
    parts = [window.times.tobytes()]
    for matrices in (window.gpu, window.proc):
        for name in sorted(matrices):
            parts += [name.encode(), matrices[name].tobytes()]
    if window.worker_cpu is not None:
        parts.append(window.worker_cpu.tobytes())
    for node in sorted(window.node_series):
        for s in sorted(window.node_series[node], key=lambda s: repr(s.info)):
            parts += [repr(s.info).encode(), s.ts.tobytes(), s.values.tobytes()]
    return b"".join(parts)


def _refreshes(
    operator_id: int, job: str, start: float, end: float, args: argparse.Namespace
) -> None:
    cache = window_cache.WindowCache()
    spans = {job: (start, end)}
    t1 = start + args.start
    costs: list[tuple[float, float]] = []
    builds: list[float] = []
    windows = hashlib.sha256()  # every window's matrices and raw series, to compare codes
    profile = cProfile.Profile() if args.profile else None
    with tenant_context(operator_id):
        while t1 <= end:
            thread0, pool0 = time.thread_time(), ingest_selectors.pool_decode_cpu_s()
            if profile is not None and cache.entry(operator_id, job).node_series:
                profile.enable()
            store = window_cache.CachedIngestStore(
                operator_id, job, spans, start, t1, cache=cache, now=t1
            )
            if profile is not None:
                profile.disable()
            thread = time.thread_time() - thread0
            pool = ingest_selectors.pool_decode_cpu_s() - pool0
            kind = "full" if store.changed_from is None else "delta"
            print(
                f"  t={t1 - start:5.0f} s {kind:5} refresh: caller {thread * 1e3:6.1f} ms"
                f" + pool {pool * 1e3:6.1f} ms = {(thread + pool) * 1e3:6.1f} ms",
                flush=True,
            )
            if kind == "delta":
                costs.append((thread, pool))
            # What the window builder asks for (not timed): every node's own series, which
            # the entry then holds and the next refreshes read with the job's.
            for node, _index in store.gpu_locations().values():
                store.node_series(node, start, t1)
            if args.window:  # the window built from it, as the live evaluation does
                entry = cache.entry(operator_id, job)
                began = time.thread_time()
                window = build_job_window(
                    store, job, start, t1, reuse=entry.matrices, changed_from=store.changed_from
                )
                entry.matrices = window.matrices
                builds.append(time.thread_time() - began)
                windows.update(_window_bytes(window))
            t1 += args.every
    entry = cache.entry(operator_id, job)
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    if costs:
        totals = [a + b for a, b in costs]
        print(
            f"delta refreshes: {len(costs)}, CPU median {statistics.median(totals) * 1e3:.1f} ms"
            f" (caller {statistics.median([a for a, _ in costs]) * 1e3:.1f},"
            f" pool {statistics.median([b for _, b in costs]) * 1e3:.1f}),"
            f" min {min(totals) * 1e3:.1f}, max {max(totals) * 1e3:.1f}"
        )
    if builds:
        print(
            f"window builds: median {statistics.median(builds[1:] or builds) * 1e3:.1f} ms"
            f" after the first ({builds[0] * 1e3:.1f} ms), windows' digest"
            f" {windows.hexdigest()[:16]}"
        )
    print(
        f"held series {len(entry.series)} + node {sum(map(len, entry.node_series.values()))},"
        f" digest {_digest(entry)}"
    )


def _block_decode(operator_id: int, start: float, end: float) -> None:
    """µs to decode one node's 1 s block (over the run's middle 30 s of every node's): one
    by one (blocks.decode) and, where the code has it, a node's blocks together."""
    with tenant_context(operator_id):
        node_ids = list(Node.objects.for_tenant(operator_id).values_list("pk", flat=True))
        t0 = int((start + end) / 2 * 1000)
        rows = list(read_block_payloads(operator_id, node_ids, t0, t0 + 30_000, with_node=True))
    by_node: dict[int, list[bytes]] = {}
    for node, payload in rows:
        by_node.setdefault(node, []).append(payload)
    payloads = [p for _n, p in rows]
    samples = [len(blocks.decode(p).values) for p in payloads[:50]]
    ways: dict[str, Callable[[], object]] = {"alone": lambda: [blocks.decode(p) for p in payloads]}
    many = getattr(blocks, "decode_many", None)
    if many is not None:
        ways["together"] = lambda: [many(ps) for ps in by_node.values()]
    for way, run in ways.items():
        rounds = []
        for _ in range(7):
            began = time.thread_time()
            run()
            rounds.append((time.thread_time() - began) / len(payloads))
        print(
            f"block decode {way}: {len(payloads)} blocks of ~{statistics.median(samples):.0f}"
            f" samples, {min(rounds) * 1e6:.1f} µs a block (best of 7),"
            f" {statistics.median(rounds) * 1e6:.1f} median"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=25)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=float, default=120.0, help="first refresh, data s")
    parser.add_argument("--every", type=float, default=10.0, help="data s between refreshes")
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--window", action="store_true", help="time the window builds too")
    parser.add_argument("--profile", action="store_true", help="cProfile the delta refreshes")
    parser.add_argument("--slug", default=SLUG, help="the bench operator's slug")
    args = parser.parse_args()
    operator_id, created = _operator(args.slug)
    if created or not args.reuse:
        if not created:
            print("the bench operator exists: pass --reuse, or drop it first", file=sys.stderr)
            return 2
        print(f"storing {args.nodes} x {args.gpus} GPUs, {args.duration:g} s", flush=True)
        _store(operator_id, args)
    job, start, end = _job_span(operator_id)
    print(f"job {job}: {end - start:.0f} s of data", flush=True)
    _block_decode(operator_id, start, end)
    _refreshes(operator_id, job, start, end, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
