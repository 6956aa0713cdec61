"""`proof bench scale` (python -m proof_web.commands.bench_scale): ingest and workers scaled out
on this machine, measured side by side in one run (issue 16, docs/scaling.md).

For each pair (N ingest processes, M Celery workers) of `--ingest` × `--workers`, on a private
`redis-server` (broker and cache, as production) and the configured PostgreSQL:

- `proof ingest --workers N` (SO_REUSEPORT: N processes on one port) and M `celery worker`
  processes (prefork, concurrency 1 each), every one a real process;
- `--agents` flood agents (ingest/bench.py's: 850-series batches, as fast as acks allow, in
  `--agent-processes` processes) for `--duration` seconds: samples/s stored;
- at the same time one real `proof-agent run` of a simulated node with a hardware fault at
  `--fault-speed` (its data clock runs that much faster than the wall), and the job fan-out sent
  every 2 s as beat would: the verdict latency is the wall time from the moment the fault's
  first data was played to the incident's creation (data time → wall time by the agent's clock),
  and "after data" from the fault agent's last batch stored before the incident to the incident
  (the queue's and the evaluation's part alone).

Prints one row per pair. Needs PostgreSQL (DATABASE_URL) and `redis-server` on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import django
from django.conf import settings

from ingest.bench import _agent_process, _free_port, _wait_healthy, proof_ingest_command

REPO = Path(__file__).resolve().parents[2]
BEAT_S = 2.0
FAULT_SCENARIO = "hardware_fault"


def _counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ingest", type=_counts, default=[1, 2], help="ingest processes: 1,2")
    parser.add_argument("--workers", type=_counts, default=[1, 2], help="Celery workers: 1,2")
    parser.add_argument("--agents", type=int, default=4, help="flood agents per run")
    parser.add_argument("--agent-processes", type=int, default=2)
    parser.add_argument("--series", type=int, default=850, help="series per flood agent")
    parser.add_argument("--batch-seconds", type=int, default=60)
    parser.add_argument("--window", type=int, default=8, help="unacked batches per agent")
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of flood per run")
    parser.add_argument("--fault-speed", type=float, default=8.0)
    parser.add_argument("--fault-duration", type=float, default=240.0, help="data s")


def _env(redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_OWNER_URL"}
    env.update(
        PROOF_ENV="development",
        PROOF_DEBUG="false",
        PROOF_LOG_LEVEL="WARNING",
        REDIS_URL=redis_url,
        PROOF_EVAL_QUEUES="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def one_run(n_ingest: int, n_workers: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from celery import Celery

    from ingest.models import BatchReceipt
    from investigations.models import Incident
    from tenants import services as tenant_services
    from tenants.context import tenant_context

    run_id = f"{int(time.time())}-{n_ingest}-{n_workers}"
    operator, _ = tenant_services.do_create_operator(
        name=f"Scale {run_id}",
        slug=f"scale-{run_id}",
        admin_username=f"scale-{run_id}",
        admin_email="bench@example.invalid",
        admin_password=os.urandom(16).hex(),
    )
    _, token = tenant_services.do_create_agent_token(operator.pk, name="bench")
    redis_port = _free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    env = _env(redis_url)
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp / run_id
    logs.mkdir(parents=True)

    def start(argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(  # noqa: S603 - our interpreter and redis-server, our argv
                argv,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        procs.append(proc)
        return proc

    app = Celery("proof-bench-scale", broker=redis_url, set_as_current=False)
    try:
        redis_argv = ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"]
        start([*redis_argv, "--save", "", "--appendonly", "no", "--dir", str(logs)], "redis")
        port = _free_port()
        start(proof_ingest_command(port, "--workers", str(n_ingest), "--writers", "2"), "ingest")
        for i in range(n_workers):
            argv = [sys.executable, "-m", "celery", "-A", "proof_web.celery:app", "worker"]
            argv += ["--pool", "prefork", "--concurrency", "1", "--loglevel", "WARNING"]
            argv += ["--without-gossip", "--without-mingle", "-n", f"scale{i}@%h"]
            start(argv, f"worker-{i}")
        _wait_healthy(port)
        time.sleep(5.0)  # the workers connect to the broker
        # The fault agent: its data runs from now - duration at fault-speed.
        fault_started = time.time()
        data_start = float(int(fault_started - args.fault_duration))
        agent = [shutil.which("proof-agent") or str(Path(sys.executable).with_name("proof-agent"))]
        agent += ["run", "--backend", "sim", "--scenario", FAULT_SCENARIO, "--seed", "3"]
        agent += ["--nodes", "1", "--gpus-per-node", "2", "--duration", f"{args.fault_duration:g}"]
        agent += ["--speed", f"{args.fault_speed:g}", "--start-ts", f"{data_start:.0f}"]
        agent += ["--server", f"127.0.0.1:{port}", "--token", token]
        agent += ["--spool-dir", str(logs / "spool")]
        start(agent, "fault-agent")
        # The flood.
        params = {
            "run": run_id,
            "series": args.series,
            "batch_seconds": args.batch_seconds,
            "window": args.window,
            "base_ms": int((time.time() - 3 * 86400) * 1000),
        }
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        groups = [
            list(range(p, args.agents, args.agent_processes)) for p in range(args.agent_processes)
        ]
        started = time.time()
        deadline = started + args.duration
        flood = [
            ctx.Process(target=_agent_process, args=(port, token, g, params, deadline, out))
            for g in groups
            if g
        ]
        for p in flood:
            p.start()
        results: list[Any] = []
        last_beat = 0.0
        give_up = deadline + 300
        incident = None
        while (len(results) < args.agents or incident is None) and time.time() < give_up:
            if time.monotonic() - last_beat >= BEAT_S:
                last_beat = time.monotonic()
                app.send_task("investigations.fan_out_job_evaluations")
            with contextlib.suppress(queue.Empty):
                results.append(out.get(timeout=0.5))
                continue
            if incident is None:
                with tenant_context(operator.pk):
                    incident = (
                        Incident.objects.for_tenant(operator.pk)
                        .filter(family=FAULT_SCENARIO)
                        .order_by("created_at")
                        .first()
                    )
        elapsed = time.time() - started
        for p in flood:
            p.join(timeout=60)
        acked = sum(r[3] * r[2] for r in results)
        flood_s = args.duration if len(results) == args.agents else elapsed
        latency = after_data = None
        if incident is not None:
            onset_wall = (
                fault_started + (incident.first_seen.timestamp() - data_start) / args.fault_speed
            )
            latency = incident.created_at.timestamp() - onset_wall
            # The pipeline's own part: from the fault agent's last batch stored before the
            # incident existed to the incident (what the detectors needed had arrived by then).
            agent_id = (logs / "spool" / "agent_id").read_text().strip()
            with tenant_context(operator.pk):
                last = (
                    BatchReceipt.objects.for_tenant(operator.pk)
                    .filter(agent_id=agent_id, received_at__lte=incident.created_at)
                    .order_by("-received_at")
                    .values_list("received_at", flat=True)
                    .first()
                )
            if last is not None:
                after_data = (incident.created_at - last).total_seconds()
        return {
            "ingest": n_ingest,
            "workers": n_workers,
            "samples_s": acked / max(flood_s, 1e-9),
            "acked": acked,
            "latency": latency,
            "after_data": after_data,
        }
    finally:
        app.close()
        _stop(procs)


def run(args: argparse.Namespace) -> int:
    django.setup()
    if not settings.IS_POSTGRES:
        print("proof bench scale: needs PostgreSQL (set DATABASE_URL)", file=sys.stderr)
        return 2
    if shutil.which("redis-server") is None:
        print("proof bench scale: needs redis-server on PATH", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="proof-bench-scale-") as tmp:
        for n, m in itertools.product(args.ingest, args.workers):
            load = os.getloadavg()[0]
            row = one_run(n, m, args, Path(tmp))
            row["load"] = (load, os.getloadavg()[0])
            rows.append(row)
            lat = "-" if row["latency"] is None else f"{row['latency']:.1f}"
            print(
                f"ingest {n} × workers {m}: {row['samples_s']:,.0f} samples/s, verdict {lat} s",
                flush=True,
            )
    print(
        f"\n{args.agents} flood agents × {args.series} series ({args.batch_seconds} s batches) for "
        f"{args.duration:g} s, one {FAULT_SCENARIO} agent at {args.fault_speed:g}× ; "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"{'ingest':>6} {'workers':>7} {'samples/s':>12} {'verdict s':>10} "
        f"{'after data s':>12} {'load':>11}"
    )
    for r in rows:
        lat = "missed" if r["latency"] is None else f"{r['latency']:.1f}"
        after = "-" if r["after_data"] is None else f"{r['after_data']:.1f}"
        print(
            f"{r['ingest']:>6} {r['workers']:>7} {r['samples_s']:>12,.0f} {lat:>10} "
            f"{after:>12} {r['load'][0]:>5.1f}→{r['load'][1]:<5.1f}"
        )
    return 0


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")
    parser = argparse.ArgumentParser(prog="proof bench scale", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
