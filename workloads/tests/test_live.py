"""Real programs through the live path: the node agent on this machine (`proof-agent run`,
node backend) → gRPC → the real ingest server → `evaluate_job` → incidents in the database.

Each test starts its own ingest server and agent for a fresh tenant, runs its workload(s)
through `proof-agent exec --inbox`, evaluates the tenant's due jobs as the live pipeline does
and reads the verdicts back; `proof analyze` on the trace the agent also wrote (the records it
sent) must find the same families.
"""

from __future__ import annotations

import contextlib
import re
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from contract import signals
from ingest import services as ingest_services
from ingest.server import IngestServer
from tenants import services as tenant_services
from tenants.testing import make_tenant
from workloads import system
from workloads.harness import PROOF_AGENT, analyze, program, torchrun
from workloads.live import LiveJob, NodeAgent, evaluate_live, series
from workloads.runs import RECORDED
from workloads.tests.conftest import require_workload_packages

pytestmark = [pytest.mark.workload, pytest.mark.django_db(transaction=True)]
T = TypeVar("T")


@pytest.fixture
def ingest_server() -> Iterator[IngestServer]:
    require_workload_packages()
    ingest_services.clear_caches()
    srv = IngestServer("127.0.0.1", 0, writers=2, queue_depth=16)
    srv.start()
    yield srv
    srv.stop(grace=2)


def _tenant(slug: str) -> tuple[int, str]:
    tenant = make_tenant(slug)
    token = tenant_services.do_create_agent_token(tenant.operator.pk, name="workloads")[1]
    return tenant.operator.pk, token


def _report(live: dict[str, LiveJob]) -> None:
    """What the live pipeline said, for the test log (`pytest -rP`) and docs/detectors.md."""
    for job in live.values():
        print(f"job {job.job_id} ({job.state}, world {job.world_size}): {job.said()}")


def _one_job(live: dict[str, LiveJob], agent: NodeAgent) -> LiveJob:
    assert len(live) == 1, (
        f"expected one job in the database, found {sorted(live)}; agent log:\n{agent.output()}"
    )
    return next(iter(live.values()))


def _offline_families(agent: NodeAgent) -> dict[str, list[str]]:
    """`proof analyze --json` of what the agent sent: families per job id."""
    analysis = analyze(agent.trace)
    assert analysis.rc == 0, analysis.stderr
    out: dict[str, list[str]] = {}
    for job in analysis.jobs or []:
        out.setdefault(str(job["job"]), [])
    for v in analysis.verdicts:
        out.setdefault(str(v["subject"]["job"]), []).append(v["family"])
    return {k: sorted(v) for k, v in out.items()}


def test_live_hf_trainer_healthy_no_incident(ingest_server: IngestServer, tmp_path: Path) -> None:
    op, token = _tenant("wl-live-hf")
    with NodeAgent(tmp_path / "agent", ingest_server.port, token) as agent:
        run = agent.exec("hf-healthy", program("hf_trainer", "--out-dir", str(tmp_path / "hf")))
    assert run.rc == 0, run.describe()
    assert agent.rc == 0, agent.output()
    live = evaluate_live(op)
    _report(live)
    job = _one_job(live, agent)
    assert job.state == "completed" and job.ranks == [0], job
    assert job.families == [], job.said()
    assert _offline_families(agent) == {job.job_id: []}


@pytest.mark.parametrize(
    ("slug", "name", "argv", "family"),
    [
        ("wl-live-lr0", "torch-lr0", lambda w: program("torch_loop", "--lr", "0"), "no_learning"),
        ("wl-live-hfx", "hf-exploding", RECORDED["hf-exploding"].argv, "numerical_divergence"),
    ],
    ids=["torch_loop_lr_zero_is_no_learning", "hf_trainer_exploding_lr_is_divergence"],
)
def test_live_job_fault_is_its_family(
    ingest_server: IngestServer,
    tmp_path: Path,
    slug: str,
    name: str,
    argv: Callable[[Path], list[str]],
    family: str,
) -> None:
    op, token = _tenant(slug)
    with NodeAgent(tmp_path / "agent", ingest_server.port, token) as agent:
        run = agent.exec(name, argv(tmp_path))
    assert run.rc == 0, run.describe()
    live = evaluate_live(op)
    _report(live)
    job = _one_job(live, agent)
    assert job.families == [family], job.said()
    assert job.incidents[0]["category"] == "job"
    assert _offline_families(agent) == {job.job_id: [family]}


def test_live_torchrun_per_rank_exec_is_one_job_of_two_ranks(
    ingest_server: IngestServer, tmp_path: Path
) -> None:
    """The per-rank form: torchrun starts `proof-agent exec` for each worker, the node agent
    ships both ranks' output; one job (its torchelastic run id) of world size 2."""
    op, token = _tenant("wl-live-ddp")
    with NodeAgent(tmp_path / "agent", ingest_server.port, token) as agent:
        wrap = [PROOF_AGENT, "exec", "--inbox", str(agent.inbox), "--"]
        run = agent.exec("ddp", torchrun(2, "ddp_gloo", wrap=wrap), wrapped=True)
    assert run.rc == 0, run.describe()
    assert run.output_has("training completed: 200 steps on 2 ranks")
    records = agent.records()
    ranks = {r.get("rank") for r in records if r.get("type") == "process"}
    assert ranks == {0, 1}, ranks
    live = evaluate_live(op)
    _report(live)
    job = _one_job(live, agent)
    assert job.families == [], job.said()
    offline = analyze(agent.trace)
    assert [(j["job"], sorted(j["ranks"]), j["state"]) for j in offline.jobs or []] == [
        (job.job_id, [0, 1], "completed")
    ], offline.jobs
    # The stored job: both ranks, their world, and ended when both ranks exited 0.
    assert job.ranks == [0, 1], job
    assert job.world_size == 2, job
    assert job.state == "completed", job


def _save_seconds(stdout: str) -> list[float]:
    """Each save's duration, from the program's `checkpoint written in S s` lines."""
    return [float(m) for m in re.findall(r"checkpoint written in ([\d.]+) s", stdout)]


def _enter_or_skip(stack: contextlib.ExitStack, cm: contextlib.AbstractContextManager[T]) -> T:
    """Enter a fault-injection context, or skip the test with the precise reason."""
    try:
        return stack.enter_context(cm)
    except system.Unavailable as exc:
        pytest.skip(str(exc))


def test_live_checkpoints_slow_mount_vs_fast_mount(
    ingest_server: IngestServer, tmp_path: Path
) -> None:
    """Checkpoints to a fast loop-device ext4 mount, then to one whose disk writes are capped
    at 1 MiB/s for the writer's cgroup. The agent must see the slow mount's write latency
    during the saves (what `checkpoint_stall` cites as the storage evidence); the verdict
    also needs every rank to stop launching kernels during the saves (eBPF/DCGM), which a CPU
    run does not have — so no family but `checkpoint_stall` may be blamed on the slow run,
    and the fast run gets no verdict."""
    args = ["--steps", "300", "--ckpt-every", "50", "--ckpt-mib", "2"]
    with contextlib.ExitStack() as stack:
        fast = _enter_or_skip(stack, system.loop_mount(tmp_path, "fast"))
        slow = _enter_or_skip(stack, system.loop_mount(tmp_path, "slow"))
        cap = _enter_or_skip(stack, system.write_cap("ckpt", slow.backing_disk, 1 << 20))
        op, token = _tenant("wl-live-ckpt")
        with NodeAgent(tmp_path / "agent", ingest_server.port, token) as agent:
            fast_run = agent.exec(
                "ckpt-fast", program("torch_loop", "--ckpt-dir", str(fast.mount), *args)
            )
            slow_argv = program("torch_loop", "--ckpt-dir", str(slow.mount), *args)
            slow_run = agent.exec("ckpt-slow", system.in_cgroup(cap, slow_argv))
    records = agent.records()

    assert fast_run.rc == 0, fast_run.describe()
    assert slow_run.rc == 0, slow_run.describe()
    # The premise: each save to the slow mount waited on the 1 MiB/s cap (≥ 2 MiB each), each
    # save to the fast one did not.
    slow_saves, fast_saves = _save_seconds(slow_run.stdout), _save_seconds(fast_run.stdout)
    assert len(slow_saves) == len(fast_saves) == 6, (slow_saves, fast_saves)
    assert min(slow_saves) >= 1.5 and max(fast_saves) < 1.0, (slow_saves, fast_saves)

    # What the agent saw on each mount, in the records it shipped.
    def latency(mount: Path) -> list[float]:
        return [
            float(r["value"])
            for r in series(records, signals.STORAGE_WRITE_MS, mount=str(mount))
            if r["value"] > 0
        ]

    slow_lat, fast_lat = latency(slow.mount), latency(fast.mount)
    assert slow_lat and fast_lat, "no storage.write_ms for the loop mounts"
    assert max(slow_lat) >= 10 * statistics.median(fast_lat), (slow_lat, fast_lat)

    live = evaluate_live(op)
    _report(live)
    assert len(live) == 2, sorted(live)
    by_start = sorted(live.values(), key=lambda j: j.job_id)
    families = {j.job_id: j.families for j in by_start}
    offline = _offline_families(agent)
    assert offline == families, (offline, families)
    # Which job is which: the one whose log names the slow mount.
    slow_jobs = {
        str(r.get("job"))
        for r in records
        if r.get("type") == "log" and str(slow.mount) in str(r.get("line"))
    }
    assert len(slow_jobs) == 1, slow_jobs
    (slow_job,) = slow_jobs
    for job_id, fams in families.items():
        if job_id == slow_job:
            assert set(fams) <= {"checkpoint_stall"}, live[job_id].said()
        else:
            assert fams == [], live[job_id].said()


def test_live_dataloader_starved_of_cpu(ingest_server: IngestServer, tmp_path: Path) -> None:
    """The data-loader worker runs in a cgroup capped at 0.1 CPU while each batch costs it
    20 ms of CPU: every step waits ~200 ms for input. `input_starvation` needs the GPUs' idle
    share (NVML/DCGM) beside the workers' CPU; without a GPU there is nothing idle to see, so
    the job must be seen, still learning, and blamed for nothing."""
    op, token = _tenant("wl-live-starved")
    with contextlib.ExitStack() as stack:
        cap = _enter_or_skip(stack, system.cpu_cap("loader", 0.1))
        argv = program("torch_loop", "--steps", "80", "--num-workers", "1")
        argv += ["--worker-cpu-ms", "20", "--worker-cgroup", str(cap.path)]
        with NodeAgent(tmp_path / "agent", ingest_server.port, token) as agent:
            run = agent.exec("starved", argv)
        throttled = system.throttled_periods(cap)
    assert run.rc == 0, run.describe()
    # The premise: the cap really bit, and steps took ≥ 5× the worker's own CPU per batch.
    assert throttled > 10, throttled
    iter_ms = [
        float(r["parsed"]["iter_ms"])
        for r in agent.records()
        if r.get("type") == "log" and (r.get("parsed") or {}).get("iter_ms")
    ]
    assert iter_ms and statistics.median(iter_ms) >= 100.0, iter_ms
    host_cpu = series(agent.records(), signals.HOST_CPU_UTIL)
    assert len(host_cpu) >= 5, "the agent reported no host CPU"
    live = evaluate_live(op)
    _report(live)
    job = _one_job(live, agent)
    assert set(job.families) <= {"input_starvation"}, job.said()
    assert _offline_families(agent) == {job.job_id: job.families}
