"""`proof bench live`: how long from a fault's onset to its verdict, and what detection costs.

Plays one simulator scenario per detector family (the one whose ground truth is that family)
and the healthy controls through the real path — `proof-agent run --backend sim` processes
(proof_web/commands/demo_live.py starts them) → gRPC → ingest (in this process) →
`batch_stored` → the debounced `evaluate_job` and the schedule's fan-outs → incidents in the
database — at `--speed` (simulated seconds per real second), once per seed (`--seeds`), each
(scenario, seed) in an operator of its own so nothing of one run can reach another's verdicts.

Where the tasks run is the settings' choice (proof_web/settings.py `TASKS_IN_PROCESS`): with
REDIS_URL and PROOF_ENV other than test, `--workers` real `celery -A proof_web.celery:app
worker` processes and one `celery beat` (the production layout, on the production schedule);
otherwise the embedded default's in-process runner (proof_web/runner.py). The output says which.
Both record through proof_web/bench_probe.py (loaded into the workers with `--include`).

Printed per family, over seeds:
- **delay (data s)**: truth onset (`meta.truth.onset`, data time) → the data time at which the
  verdict first existed: the job's `JobActivity.last_data_ts` when the evaluation that created
  the incident committed (the notification hook). p50, p90, max. At `--speed S` the pipeline's
  own waits (the 10 s debounce countdown, the 15 s fan-out, the worker) are wall time, so they
  count S× in data seconds: `--speed 1` gives what an operator sees. The wall column is the
  real seconds from the moment the agent played the onset to the verdict.
- verdicts found only by the end-of-run sweep (one last job and fleet-health fan-out after the
  agents stopped, as `proof demo` does) are marked `*`: fleet health (`gpu_degrading`) runs every
  600 s of wall time, longer than a short run.
- missed faults (no incident of the truth's family by the end) and the controls' verdicts
  (any incident on a healthy control: must be 0).
- **detection CPU**: thread CPU time of the `evaluate_job` / fleet-health (`evaluate_node_health`,
  `evaluate_fleet_health`) task bodies (Celery task_prerun → task_postrun), plus what their
  block reads decoded on ingest's decode pool (each worker process's growth) and ingest's batch
  screen, per data second played = cores; × 1000 / GPUs played = cores per 1,000 GPUs; and CPU
  per GPU per evaluation.

`--fleet-gpus N`: instead, N GPUs (8 a node) as `--fleet-agents` agent processes each playing a
multi-node run of a scenario (`--fleet-faulty` of them a fault, families in turn; the others
healthy training, training saving to local disk, inference in turn), to measure detection CPU
and evaluations per second at that scale — over the whole run and past its start-up.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import simulator
from contract.cli import NumberOption, add_number_options
from engine.screen import SCREEN
from proof_web import bench_probe
from proof_web.commands.demo_live import (
    AgentRun,
    agent_argv,
    start_agent,
    stop_agents,
)
from simulator.cli import run_options
from simulator.scenarios import list_scenarios

JOB_TASK = "investigations.evaluate_job"
FLEET_TASKS = ("investigations.evaluate_fleet_health", "investigations.evaluate_node_health")
FAN_OUT_JOBS = "investigations.fan_out_job_evaluations"
FAN_OUT_FLEET = "investigations.fan_out_fleet_health"
FLEET_GPUS_PER_NODE = 8
# Fleet mode: what the healthy agents play, in turn (training, training that saves to local
# disk, an inference server).
HEALTHY_FLEET = ("healthy_training", "healthy_local_checkpoint", "healthy_inference")
STARTUP_DATA_S = 120.0
# After the agents stop: what the debounce countdown (10 s) still holds, then the final sweep.
COUNTDOWN_WAIT_S = 12.0
DRAIN_TIMEOUT_S = 300.0

_NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    *run_options(
        seeds=2,
        first_seed=1,
        nodes=1,
        nodes_note="a neighbour job may add one",
        sizes_from_scenario=False,
    ),
    ("--speed", float, 10.0, "simulated seconds per real second (default 10)"),
    (
        "--interval",
        float,
        0.0,
        "agent collection interval in simulated s (default: --speed, one batch per real second)",
    ),
    ("--workers", int, 1, "celery worker processes when tasks go to Redis (default 1)"),
    ("--concurrency", int, 2, "task slots per worker (default 2)"),
    ("--fleet-gpus", int, 0, "fleet mode: this many GPUs (default 0: the fault benchmark)"),
    ("--fleet-agents", int, 5, "fleet mode: agent processes (default 5)"),
    (
        "--fleet-faulty",
        int,
        0,
        "fleet mode: agents playing a fault (default 0: every agent but one, families in turn)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_number_options(parser, _NUMBER_OPTIONS)
    parser.add_argument("--families", default="", help="families to play, comma-separated (all)")
    parser.add_argument("--no-controls", action="store_true", help="no healthy control runs")


# --- what to play ------------------------------------------------------------------------------


def family_scenarios() -> dict[str, str]:
    """Each family → the scenario that plays it: the one named after it, else the first whose
    truth is that family."""
    chosen: dict[str, str] = {}
    for info in list_scenarios():
        if info.family and (info.family not in chosen or info.name == info.family):
            chosen[info.family] = info.name
    return dict(sorted(chosen.items()))


def control_scenarios() -> list[str]:
    return [info.name for info in list_scenarios() if info.family is None]


@dataclass
class Play:
    """One scenario run of one seed, in an operator of its own."""

    scenario: str
    family: str | None  # the truth's family; None for a control
    seed: int
    nodes: int
    gpus_per_node: int
    operator_id: int = 0
    token: str = ""
    onset: float | None = None
    gpus: int = 0
    agent: AgentRun | None = None
    start_ts: float = 0.0  # data time the agent starts playing at
    played_from_wall: float = 0.0  # wall time at which the agent's clock was at start_ts


@dataclass
class Outcome:
    family: str
    seed: int
    delay_s: float | None = None  # data seconds, onset → verdict
    wall_s: float | None = None  # real seconds, onset played → verdict
    swept: bool = False  # found only by the end-of-run sweep
    wrong: list[str] = field(default_factory=list)  # other families' verdicts on this run


# --- where the tasks run -----------------------------------------------------------------------


class Tasks:
    """The in-process runner, or real `celery worker` + `celery beat` processes on Redis."""

    def __init__(self, probe: str, workers: int, concurrency: int, logs: Path) -> None:
        from proof_web.runner import TaskRunner, in_process

        self.probe = probe
        self.runner: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.queues: list[str] = ["celery"]
        self.in_process = in_process()
        if self.in_process:
            bench_probe.install(probe)
            self.runner = TaskRunner(concurrency=concurrency)
            self.runner.start()
            self.describe = (
                f"in-process runner (proof_web/runner.py: {concurrency} worker threads, the "
                "schedule's periodic tasks), not worker processes: tasks go to the in-process "
                "broker here (TASKS_IN_PROCESS: no REDIS_URL, or PROOF_ENV=test)"
            )
            return
        # One evaluation queue per worker process (investigations/routing.py): each job's
        # evaluations go to one worker, which keeps the job's recent data. Its task slots are
        # threads, so they share that data (prefork children would each keep their own).
        from django.conf import settings

        settings.PROOF_EVAL_QUEUES = workers  # this process enqueues (ingest runs here)
        self.queues = ["celery"] + [f"proof.eval.{i}" for i in range(workers)]
        env = dict(os.environ, PROOF_BENCH_PROBE=probe, PROOF_EVAL_QUEUES=str(workers))
        celery = [sys.executable, "-m", "celery", "-A", "proof_web.celery:app"]
        self.app().control.purge()  # what an earlier run left queued is nobody's now
        pool = "threads" if workers > 1 else "prefork"
        for i in range(workers):
            argv = [
                *celery,
                "worker",
                "--include",
                "proof_web.bench_probe",
                "--concurrency",
                str(concurrency),
                "-Q",
                f"proof.eval.{i},celery" if workers > 1 else "celery",
                "--pool",
                pool,
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"bench-{os.getpid()}-{i}@%h",
            ]
            self.procs.append(self._spawn(argv, env, logs / f"worker-{i}.log"))
        beat = [
            *celery,
            "beat",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(logs / "celerybeat-schedule"),
        ]
        self.procs.append(self._spawn(beat, env, logs / "beat.log"))
        self.describe = (
            f"{workers} celery worker process(es) × {concurrency} ({pool}; "
            f"{'one evaluation queue each' if workers > 1 else 'one queue'}) and celery beat "
            "on Redis, the production schedule"
        )

    @staticmethod
    def app() -> Any:
        from proof_web.celery import app

        return app

    @staticmethod
    def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        log = log_path.open("wb")
        # S603: this interpreter's celery with fixed arguments, no shell.
        return subprocess.Popen(  # noqa: S603
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )

    def sweep(self) -> None:
        """One last job and fleet-health fan-out, then wait until everything ran."""
        if self.runner is not None:
            names = [p.name for p in self.runner.plan if p.task in (FAN_OUT_JOBS, FAN_OUT_FLEET)]
            self.runner.wait_idle(COUNTDOWN_WAIT_S + 60)
            self.runner.send_now(names)
            self.runner.wait_idle(DRAIN_TIMEOUT_S)
            return
        time.sleep(COUNTDOWN_WAIT_S)
        app = self.app()
        for name in (FAN_OUT_JOBS, FAN_OUT_FLEET):
            app.tasks[name].delay()
        self._drain()

    def _drain(self) -> None:
        """Until the queue is empty and no worker runs or holds a task, twice in a row."""
        inspect = self.app().control.inspect(timeout=2.0)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        calm = 0
        while calm < 2 and time.monotonic() < deadline:
            time.sleep(1.0)
            with self.app().connection_for_write() as conn:
                # The Redis transport keeps each queue as a list of that name.
                client = conn.default_channel.client
                queued = sum(int(client.llen(q)) for q in self.queues)
            active = inspect.active() or {}
            reserved = inspect.reserved() or {}
            scheduled = inspect.scheduled() or {}
            busy = sum(len(v) for d in (active, reserved, scheduled) for v in d.values())
            calm = calm + 1 if queued == 0 and busy == 0 else 0

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
            bench_probe.uninstall()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- the run -----------------------------------------------------------------------------------


def _operator(run_id: str, key: str, label: str) -> tuple[int, str]:
    """A new operator (slug `bench-live-<run>-<key>`, its name says `label`) and an agent token."""
    from tenants import services as tenant_services

    slug = f"bench-live-{run_id}-{key}"
    operator, _admin = tenant_services.do_create_operator(
        name=f"Bench live {run_id} {label}",
        slug=slug,
        admin_username=slug,
        admin_email="bench@example.invalid",
        admin_password=os.urandom(16).hex(),
    )
    _token, plaintext = tenant_services.do_create_agent_token(operator.pk, name="bench live")
    return operator.pk, plaintext


def _play_wave(
    plays: Sequence[Play],
    args: argparse.Namespace,
    port: int,
    logs: Path,
    tasks: Tasks,
    what: str,
) -> tuple[float, float, list[dict[str, Any]]]:
    """Say what is played (`what`), start every play's agent (one process playing all its
    nodes), wait for them, sweep. Returns (wall time the agents started, wall time they all
    stopped, what the probe recorded so far)."""
    print(f"proof bench live: {what}, playing {args.duration:g} s at {args.speed:g}x", flush=True)
    start_ts = float(int(time.time() - args.duration))
    interval = args.interval or (args.speed if math.isfinite(args.speed) else 1.0)
    for play in plays:
        run = simulator.simulate(
            play.scenario,
            seed=play.seed,
            duration_s=args.duration,
            nodes=play.nodes,
            gpus_per_node=play.gpus_per_node,
            start_ts=start_ts,
        )
        truth = run.meta.get("truth") or {}
        play.start_ts = start_ts
        play.onset = float(truth["onset"]) if truth.get("onset") is not None else None
        play.gpus = len(run.meta.get("nodes") or []) * play.gpus_per_node
    began = time.time()
    for play in plays:
        argv = agent_argv(
            scenario=play.scenario,
            seed=play.seed,
            duration_s=args.duration,
            speed=args.speed,
            start_ts=start_ts,
            server=f"127.0.0.1:{port}",
            token=play.token,
            nodes=play.nodes,
            gpus_per_node=play.gpus_per_node,
            interval_s=interval,
        )
        # The agent's clock starts at start_ts when its process is up (~1 s after Popen).
        play.played_from_wall = time.time()
        play.agent = start_agent(
            play.scenario, "all", argv, logs / f"{play.scenario}-{play.seed}.log"
        )
    limit = args.duration / args.speed + 120 if args.speed > 0 else 600
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(
        p.agent is not None and p.agent.process.poll() is None for p in plays
    ):
        time.sleep(0.5)
    stop_agents([p.agent for p in plays if p.agent is not None])
    ended = time.time()
    tasks.sweep()
    return began, ended, bench_probe.read(tasks.probe)


def _percentiles(values: Sequence[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7}"
    arr = np.array(values, dtype=float)
    p50, p90 = np.percentile(arr, [50, 90])
    return f"{p50:7.0f} {p90:7.0f} {arr.max():7.0f}"


def _incidents(operator_id: int) -> list[tuple[int, str]]:
    from investigations.models import Incident
    from tenants.context import tenant_context

    with tenant_context(operator_id):
        return list(
            Incident.objects.for_tenant(operator_id).order_by("pk").values_list("pk", "family")
        )


def _gpus_per_job(operator_ids: Sequence[int]) -> dict[tuple[int, int], int]:
    from investigations.models import JobGpuUsage
    from tenants.context import tenant_context

    counts: dict[tuple[int, int], int] = defaultdict(int)
    for op in operator_ids:
        with tenant_context(op):
            for job_pk in JobGpuUsage.objects.for_tenant(op).values_list("job_id", flat=True):
                counts[(op, job_pk)] += 1
    return counts


def _task_start(event: dict[str, Any]) -> float:
    """Wall time a probed task began (the probe records its end and its wall time)."""
    return float(event["t"]) - float(event.get("wall_s") or 0.0)


def _stored_data_s(operator_id: int) -> float:
    """Data seconds ingest stored for the operator's jobs: the longest job's span (the fleet's
    jobs are played side by side from one start)."""
    from investigations.models import JobActivity
    from tenants.context import tenant_context

    with tenant_context(operator_id):
        spans = JobActivity.objects.for_tenant(operator_id).values_list(
            "first_data_ts", "last_data_ts"
        )
        return max((b - a for a, b in spans), default=0.0)


def _cpu_lines(
    events: Sequence[dict[str, Any]],
    data_s: float,
    gpus: int,
    gpus_per_job: dict[tuple[int, int], int],
    wall_s: float,
    screen_cpu_s: float = 0.0,
    screen_batches: int = 0,
) -> list[str]:
    # This run's tasks only: the fleet-health fan-out also evaluates GPUs an earlier run in the
    # same database reported within the day, which are not among the GPUs played here.
    operators = {op for op, _job in gpus_per_job}
    tasks = [
        e
        for e in events
        if e["event"] == "task" and (not operators or (e["args"] and e["args"][0] in operators))
    ]
    jobs = [e for e in tasks if e["task"] == JOB_TASK]
    fleet = [e for e in tasks if e["task"] in FLEET_TASKS]
    cpu_jobs = sum(e["cpu_s"] for e in jobs)
    cpu_fleet = sum(e["cpu_s"] for e in fleet)
    # The decode pool's CPU (block reads of the task bodies): each process's cumulative figure
    # grows over the run; its first task's reading holds what it decoded before (≤ one read).
    pool: dict[int, list[float]] = {}
    for e in tasks:
        if "pool_cpu_s" in e:
            pool.setdefault(int(e["pid"]), []).append(float(e["pool_cpu_s"]))
    cpu_pool = sum(max(v) - min(v) for v in pool.values())
    cores = (cpu_jobs + cpu_fleet + cpu_pool + screen_cpu_s) / data_s if data_s else float("nan")
    per_1000 = cores * 1000 / gpus if gpus else float("nan")
    per_gpu_eval = [
        e["cpu_s"] / gpus_per_job[(e["args"][0], e["args"][1])]
        for e in jobs
        if len(e["args"]) >= 2 and gpus_per_job.get((e["args"][0], e["args"][1]))
    ]
    lines = [
        f"detection CPU: evaluate_job {len(jobs)} runs {cpu_jobs:.1f} s CPU "
        f"({(cpu_jobs / len(jobs) * 1000) if jobs else 0:.0f} ms each), fleet health (per node) "
        f"{len(fleet)} runs {cpu_fleet:.1f} s CPU, their block decoding on the pool "
        f"{cpu_pool:.1f} s CPU, ingest's batch screen {screen_batches} "
        f"batches {screen_cpu_s:.1f} s CPU, over {data_s:,.0f} data s of {gpus} GPUs",
        f"  = {cores:.4f} cores at {gpus} GPUs → {per_1000:.3f} cores per 1,000 GPUs "
        "(CPU s per data s, × 1000 / GPUs)",
    ]
    if per_gpu_eval:
        lines.append(
            f"  CPU per GPU per evaluate_job: median {np.median(per_gpu_eval) * 1000:.1f} ms, "
            f"p90 {np.percentile(per_gpu_eval, 90) * 1000:.1f} ms"
        )
    evictions: dict[int, int] = {}
    for e in tasks:
        if "evictions" in e:
            evictions[int(e["pid"])] = max(evictions.get(int(e["pid"]), 0), int(e["evictions"]))
    if evictions:
        lines.append(
            f"  window cache evictions (PROOF_EVAL_CACHE_SAMPLES): {sum(evictions.values())} "
            f"over {len(evictions)} worker processes"
        )
    lines += _read_kind_lines(jobs, gpus_per_job)
    if wall_s > 0:
        lines.append(
            f"  evaluations per second: {(len(jobs) + len(fleet)) / wall_s:.2f} "
            f"({len(jobs) + len(fleet)} in {wall_s:.0f} s wall)"
        )
    return lines


JOBS_SHOWN = 8


def _read_kind_lines(
    jobs: Sequence[dict[str, Any]], gpus_per_job: dict[tuple[int, int], int]
) -> list[str]:
    """Which of the evaluations read more than their delta, from the probe's per-entry read
    counters (a task's reads are the growth since the previous task of its process: with
    several threads a worker, another thread's read can be counted with it), and the runs and
    CPU of the JOBS_SHOWN costliest jobs."""
    kinds: dict[str, list[float]] = {"full": [], "added series": [], "delta": []}
    previous: dict[int, dict[str, list[int]]] = {}
    for e in sorted(jobs, key=lambda e: float(e["t"])):
        reads: dict[str, list[int]] = e.get("reads") or {}
        before = previous.get(int(e["pid"]), {})
        grew = [
            (now[0] - before.get(key, [0, 0, 0])[0], now[2] - before.get(key, [0, 0, 0])[2])
            for key, now in reads.items()
        ]
        previous[int(e["pid"])] = reads
        if any(full > 0 for full, _ in grew):
            kinds["full"].append(float(e["cpu_s"]))
        elif any(added > 0 for _, added in grew):
            kinds["added series"].append(float(e["cpu_s"]))
        else:
            kinds["delta"].append(float(e["cpu_s"]))
    if not any("reads" in e for e in jobs):
        return []
    lines = [
        "  evaluate_job by read: "
        + ", ".join(f"{kind} {len(v)} runs {sum(v):.1f} s CPU" for kind, v in kinds.items())
    ]
    per_job: dict[tuple[int, int], list[float]] = {}
    for e in jobs:
        if len(e["args"]) >= 2:
            per_job.setdefault((e["args"][0], e["args"][1]), []).append(float(e["cpu_s"]))
    # The costliest few (a family run has one small job per scenario and seed).
    costliest = sorted(per_job.items(), key=lambda item: -sum(item[1]))[:JOBS_SHOWN]
    for (op, pk), cpu in sorted(costliest):
        lines.append(
            f"    job {op}:{pk} ({gpus_per_job.get((op, pk), 0)} GPUs): {len(cpu)} runs, "
            f"{sum(cpu):.1f} s CPU, median {np.median(cpu) * 1000:.0f} ms, "
            f"max {max(cpu) * 1000:.0f} ms"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from ingest.server import IngestServer

    if args.speed <= 0 or not math.isfinite(args.speed):
        print("proof bench live: --speed must be a positive number", file=sys.stderr)
        return 2
    if not settings.IS_POSTGRES:
        call_command("migrate", interactive=False, verbosity=0)  # the embedded SQLite
    by_family = family_scenarios()
    wanted = [f.strip() for f in args.families.split(",") if f.strip()] or list(by_family)
    unknown = [f for f in wanted if f not in by_family]
    if unknown:
        print(
            f"proof bench live: unknown family(ies) {', '.join(unknown)}; known: "
            + ", ".join(by_family),
            file=sys.stderr,
        )
        return 2
    run_id = f"{int(time.time())}"
    work = Path(tempfile.mkdtemp(prefix="proof-bench-live-"))
    probe = str(work / "probe.jsonl")
    tasks = Tasks(probe, args.workers, args.concurrency, work)
    server = IngestServer("127.0.0.1", 0)
    port = server.start()
    print(f"proof bench live: tasks: {tasks.describe}", flush=True)
    print(f"proof bench live: ingest on 127.0.0.1:{port}, agent logs in {work}", flush=True)
    try:
        if args.fleet_gpus > 0:
            return _fleet(args, by_family, run_id, port, work, tasks)
        return _faults(args, by_family, wanted, run_id, port, work, tasks)
    finally:
        server.stop(grace=2.0)
        tasks.stop()


def _faults(
    args: argparse.Namespace,
    by_family: dict[str, str],
    wanted: Sequence[str],
    run_id: str,
    port: int,
    work: Path,
    tasks: Tasks,
) -> int:
    controls = [] if args.no_controls else control_scenarios()
    outcomes: list[Outcome] = []
    false_verdicts: list[tuple[str, int, str]] = []
    all_plays: list[Play] = []
    data_s = 0.0
    wall_s = 0.0
    screen_cpu0, batches0 = SCREEN.cpu_s, SCREEN.batches
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        plays = [Play(by_family[f], f, seed, args.nodes, args.gpus_per_node) for f in wanted] + [
            Play(c, None, seed, args.nodes, args.gpus_per_node) for c in controls
        ]
        for i, play in enumerate(plays):
            play.operator_id, play.token = _operator(
                run_id, f"{seed}-{i}", f"{play.scenario} seed {seed}"
            )
        what = (
            f"seed {seed}: {len(plays)} agent processes "
            f"({len(wanted)} families, {len(controls)} controls)"
        )
        began, ended, events = _play_wave(plays, args, port, work, tasks, what)
        wall_s += time.time() - began
        data_s += args.duration
        first_new: dict[int, dict[str, Any]] = {}
        for e in events:
            if e["event"] == "verdict" and e["kind"] == "new":
                first_new.setdefault(int(e["incident"]), e)
        for play in plays:
            all_plays.append(play)
            incidents = _incidents(play.operator_id)
            if play.family is None:
                false_verdicts += [(play.scenario, seed, fam) for _pk, fam in incidents]
                continue
            out = Outcome(play.family, seed)
            out.wrong = sorted({fam for _pk, fam in incidents if fam != play.family})
            mine = [first_new.get(pk) for pk, fam in incidents if fam == play.family]
            found = sorted((e for e in mine if e is not None), key=lambda e: float(e["t"]))
            if found and play.onset is not None and found[0].get("data_ts") is not None:
                first = found[0]
                out.delay_s = float(first["data_ts"]) - play.onset
                onset_wall = play.played_from_wall + (play.onset - play.start_ts) / args.speed
                out.wall_s = float(first["t"]) - onset_wall
                out.swept = float(first["t"]) > ended
            elif [pk for pk, fam in incidents if fam == play.family]:
                out.delay_s = None  # found, but the hook's record is missing
            outcomes.append(out)
    print(
        f"\nonset → verdict, data seconds (p50 p90 max over {args.seeds} seed(s)), "
        f"--speed {args.speed:g}, {args.duration:g} s runs, {args.nodes}×{args.gpus_per_node} GPUs"
    )
    print(f"{'family':<22} {'scenario':<22} {'p50':>7} {'p90':>7} {'max':>7}  wall p50  found")
    missed_total = 0
    for family in wanted:
        rows = [o for o in outcomes if o.family == family]
        delays = [o.delay_s for o in rows if o.delay_s is not None]
        walls = [o.wall_s for o in rows if o.wall_s is not None]
        missed = len(rows) - len(delays)
        missed_total += missed
        swept = "*" if any(o.swept for o in rows if o.delay_s is not None) else " "
        wall = f"{np.median(walls):8.1f}" if walls else f"{'-':>8}"
        print(
            f"{family:<22} {by_family[family]:<22} {_percentiles(delays)}{swept} {wall}  "
            f"{len(delays)}/{len(rows)}"
        )
    print("  * found by the end-of-run sweep (after the agents stopped), not while data arrived")
    print(f"missed faults: {missed_total} of {len(outcomes)}")
    other = [(o.family, o.seed, w) for o in outcomes for w in o.wrong]
    if other:
        print(
            "other families' verdicts on fault runs: "
            + ", ".join(f"{w} on {f} (seed {s})" for f, s, w in other)
        )
    print(
        f"controls' false verdicts: {len(false_verdicts)} on "
        f"{len(controls) * args.seeds} control run(s)"
        + (
            ""
            if not false_verdicts
            else ": " + ", ".join(f"{f} on {c}" for c, _s, f in false_verdicts)
        )
    )
    events = bench_probe.read(tasks.probe)
    gpus = sum(p.gpus for p in all_plays) // max(args.seeds, 1)
    per_job = _gpus_per_job([p.operator_id for p in all_plays])
    for line in _cpu_lines(
        events, data_s, gpus, per_job, wall_s, SCREEN.cpu_s - screen_cpu0, SCREEN.batches - batches0
    ):
        print(line)
    agent_errors = [p.agent.error for p in all_plays if p.agent is not None and p.agent.error]
    for error in agent_errors:
        print(f"agent failed: {error}")
    return 1 if agent_errors else 0


def _fleet(
    args: argparse.Namespace,
    by_family: dict[str, str],
    run_id: str,
    port: int,
    work: Path,
    tasks: Tasks,
) -> int:
    screen_cpu0, batches0 = SCREEN.cpu_s, SCREEN.batches
    nodes_total = max(1, math.ceil(args.fleet_gpus / FLEET_GPUS_PER_NODE))
    agents = max(1, min(args.fleet_agents, nodes_total))
    faults = list(by_family.values())
    faulty = agents - 1 if args.fleet_faulty <= 0 else min(args.fleet_faulty, agents)
    healthy = [HEALTHY_FLEET[i % len(HEALTHY_FLEET)] for i in range(agents - faulty)]
    mix = healthy + [faults[i % len(faults)] for i in range(faulty)]
    plays = [
        Play(
            mix[i],
            None,
            args.first_seed + i,
            nodes_total // agents + (1 if i < nodes_total % agents else 0),
            FLEET_GPUS_PER_NODE,
        )
        for i in range(agents)
    ]
    operator_id, token = _operator(run_id, "fleet", "fleet")
    for play in plays:
        play.operator_id, play.token = operator_id, token
    what = (
        f"fleet: {nodes_total} nodes × {FLEET_GPUS_PER_NODE} GPUs as {agents} agent processes "
        f"({', '.join(f'{p.scenario} {p.nodes} nodes' for p in plays)})"
    )
    began, ended, events = _play_wave(plays, args, port, work, tasks, what)
    wall_s = ended - began
    # The end-of-run sweep (one more job and fleet-health fan-out once the agents stopped) is
    # the bench's, not a site's: a site runs fleet health once per 600 s, and a 600 s run's
    # beat pass and the sweep would count it twice. Left out of the cost, said apart.
    swept = [e for e in events if e["event"] == "task" and _task_start(e) >= ended]
    events = [e for e in events if e["event"] != "task" or _task_start(e) < ended]
    if swept:
        print(
            f"end-of-run sweep (not counted below): {len(swept)} tasks, "
            f"{sum(float(e['cpu_s']) for e in swept):.1f} s CPU"
        )
    gpus = sum(p.gpus for p in plays)
    screen_cpu, batches = SCREEN.cpu_s - screen_cpu0, SCREEN.batches - batches0
    per_job = _gpus_per_job([operator_id])
    # What ingest stored, not what the agents played: on a loaded machine ingest falls behind
    # (a run at load 8-14 on 2 cores stored ~250 of 600 data s), while the evaluations keep
    # their wall-clock cadence, so CPU per data second played would overstate the cost.
    data_s = min(args.duration, _stored_data_s(operator_id)) or args.duration
    if data_s < 0.95 * args.duration:
        print(
            f"ingest stored {data_s:.0f} of the {args.duration:.0f} data s played "
            f"({batches} batches): the machine did not keep up; the figures below are per "
            "data second stored"
        )
    for line in _cpu_lines(events, data_s, gpus, per_job, wall_s, screen_cpu, batches):
        print(line)
    # Past start-up: every job is young (evaluated every 2 s) through its first minute, which
    # a fleet of long jobs spends a tiny share of its time in and a short run most of its own.
    # The wall time at which the stored data passed it, data arriving at the rate it was stored.
    played_wall_s = args.duration / args.speed
    steady_from = began + STARTUP_DATA_S * played_wall_s / data_s
    steady_data_s = data_s - STARTUP_DATA_S
    if steady_data_s > 0:
        steady = [e for e in events if e["event"] != "task" or e["t"] >= steady_from]
        share = steady_data_s / data_s  # the screen's cost is per batch: pro rata
        print(f"after the first {STARTUP_DATA_S:.0f} data s (start-up):")
        lines = _cpu_lines(
            steady, steady_data_s, gpus, per_job, 0.0, screen_cpu * share, round(batches * share)
        )
        for line in lines:
            print("  " + line)
    errors = [p.agent.error for p in plays if p.agent is not None and p.agent.error]
    for error in errors:
        print(f"agent failed: {error}")
    return 1 if errors else 0
