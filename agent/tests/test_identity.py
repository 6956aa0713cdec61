"""Identity at collection time: environ/cgroup parsing on a fake proc tree, real /proc for a
real child process, Slurm job records from the real captured scontrol/sacct output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.identity import (
    IdentityCollector,
    identity_from_env,
    parse_environ,
    pod_uid_from_cgroup,
)
from agent.collectors.nvml import GpuRef
from agent.collectors.slurm import SlurmJobs
from agent.runtime import IdentityJoin
from contract import signals
from contract.trace.records import check_record

NODE = "gpu-node-07"
DATA = Path(__file__).parent / "data" / "slurm"
G0 = GpuRef("GPU-aaaa", 0)
G1 = GpuRef("GPU-bbbb", 1)


def make_proc(
    root: Path,
    pid: int,
    env: dict[str, str],
    *,
    start: int = 1000,
    state: str = "S",
    cmd: tuple[str, ...] = ("python", "train.py"),
    cgroup: str = "0::/user.slice/user-1000.slice/session-1.scope\n",
    exit_status: int = 0,
    ppid: int = 1,
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    d.joinpath("environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    d.joinpath("cmdline").write_bytes(b"\0".join(c.encode() for c in cmd) + b"\0")
    d.joinpath("cgroup").write_text(cgroup)
    # 52 fields; the comm contains a space and a ')' to exercise the parser
    fields = [state, str(ppid), str(pid), str(pid)] + ["0"] * 15 + [str(start)] + ["0"] * 29
    fields += [str(exit_status)]
    d.joinpath("stat").write_text(f"{pid} (py thon)) " + " ".join(fields) + "\n")


SLURM_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "16",
    "SLURM_JOB_ACCOUNT": "project-a",
    "SLURM_JOB_PARTITION": "gc3-h100",
    "SLURM_JOB_USER": "alice",
}


def test_parse_environ_handles_nul_separation_and_bad_bytes() -> None:
    env = parse_environ(b"A=1\0B=x=y\0\xffC=\xfe\0NOEQUALS\0\0")
    assert env["A"] == "1" and env["B"] == "x=y"
    assert "NOEQUALS" not in env
    assert "\ufffdC" in env


def test_rank_precedence_torchrun_under_srun() -> None:
    env = {**SLURM_ENV, "RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16"}
    ident = identity_from_env(7, env)
    assert (ident.job, ident.rank, ident.local_rank, ident.world_size) == ("4242", 11, 3, 16)
    assert ident.scheduler == "slurm"
    assert ident.labels["slurm_account"] == "project-a"


def test_open_mpi_and_torchelastic() -> None:
    ident = identity_from_env(
        8,
        {
            "TORCHELASTIC_RUN_ID": "run-77",
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "8",
        },
    )
    assert (ident.job, ident.rank, ident.local_rank, ident.world_size) == (
        "torchelastic-run-77",
        5,
        1,
        8,
    )
    assert ident.scheduler == "torchelastic"
    assert identity_from_env(9, {"PMI_RANK": "2"}).rank == 2
    assert identity_from_env(9, {"RANK": "not-a-number", "PMI_RANK": "4"}).rank == 4


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f2e1c2d_7a1b_4c3d_9e8f_0123456789ab.slice/cri-containerd-abc.scope\n",
        "11:memory:/kubepods/burstable/pod3f2e1c2d-7a1b-4c3d-9e8f-0123456789ab/abcdef\n",
    ],
)
def test_pod_uid_from_cgroup(cgroup: str) -> None:
    assert pod_uid_from_cgroup(cgroup) == "3f2e1c2d-7a1b-4c3d-9e8f-0123456789ab"


def test_no_pod_outside_kubernetes() -> None:
    assert pod_uid_from_cgroup("0::/user.slice/user-1000.slice\n") is None


def test_process_records_exit_and_cache(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, {**SLURM_ENV, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "16"})
    make_proc(
        tmp_path,
        200,
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0", "RANK": "0"},
        cgroup="0::/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/c\n",
    )
    gpu_map = {100: [G0], 200: [G1]}
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpu_map)
    first = col.collect(10.0)
    procs = {r["pid"]: r for r in first if r["type"] == "process"}
    for r in first:
        assert check_record(r) is None, r
    p = procs[100]
    assert (p["job"], p["rank"], p["local_rank"], p["world_size"]) == ("4242", 3, 1, 16)
    assert (p["gpu"], p["gpu_index"], p["node"]) == ("GPU-aaaa", 0, NODE)
    assert p["cmd"] == ["python", "train.py"]
    assert p["labels"]["scheduler"] == "slurm"
    k = procs[200]
    assert k["job"] == "11111111-2222-3333-4444-555555555555"
    assert k["labels"]["k8s_pod"] == "trainer-0"
    assert (ident := col.identity_of(100)) is not None and ident.rank == 3

    # unchanged → nothing new; environ is not read again (we delete it to prove it)
    (tmp_path / "100" / "environ").unlink()
    assert col.collect(11.0) == []

    # GPUs of a process change → a new process record
    gpu_map[100] = [G0, G1]
    changed = [r for r in col.collect(12.0) if r["type"] == "process"]
    assert len(changed) == 1 and changed[0]["labels"]["gpus"] == "GPU-aaaa,GPU-bbbb"

    # process 200 disappears → process_gone (exit code unknown), with its identity
    del gpu_map[200]
    for f in (tmp_path / "200").iterdir():
        f.unlink()
    (tmp_path / "200").rmdir()
    gone = col.collect(13.0)
    assert [(r["type"], r["name"], r["pid"]) for r in gone] == [
        ("event", signals.EVENT_PROCESS_GONE, 200)
    ]
    assert gone[0]["job"] == "11111111-2222-3333-4444-555555555555"

    # a zombie's wait status is readable → a real exit record with exit code
    make_proc(tmp_path, 100, SLURM_ENV, state="Z", exit_status=3 << 8)
    ended = col.collect(14.0)
    exits = [r for r in ended if r["type"] == "exit"]
    assert exits and exits[0]["pid"] == 100 and exits[0]["exit_code"] == 3
    assert check_record(exits[0]) is None


def test_pid_reuse_is_a_new_process(tmp_path: Path) -> None:
    make_proc(tmp_path, 300, {"RANK": "1"}, start=5000)
    gpu_map = {300: [G0]}
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpu_map)
    first = col.collect(1.0)
    make_proc(tmp_path, 300, {"RANK": "9"}, start=9000)
    records = col.collect(2.0)
    assert [r["type"] for r in records] == ["event", "process", "job"]
    assert records[1]["rank"] == 9
    # no scheduler: each process is its own job, and a reused pid is another one
    assert first[0]["job"] == f"proc-{NODE}-300-5000"
    assert records[1]["job"] == records[2]["job"] == f"proc-{NODE}-300-9000"


def test_real_child_process_exit_code_from_proc() -> None:
    """A real child on the real /proc: seen while running, exit code read from its zombie."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(0.4); raise SystemExit(7)"],
        env={"SLURM_JOB_ID": "777", "RANK": "2", "PATH": "/usr/bin:/bin"},
    )
    try:
        col = IdentityCollector(node=NODE, gpu_pids=lambda: {child.pid: [G0]})
        seen = col.collect(1.0)
        assert seen[0]["type"] == "process"
        assert (seen[0]["job"], seen[0]["rank"]) == ("777", 2)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                break
            time.sleep(0.05)
        ended = col.collect(2.0)
        assert [(r["type"], r.get("exit_code")) for r in ended] == [("exit", 7)]
    finally:
        child.wait()


# --- Slurm -------------------------------------------------------------------------------------


class FixtureRunner:
    """Answers scontrol/sacct with real captured output; records what was asked."""

    def __init__(self, scontrol: str | None, sacct: str | None) -> None:
        self.scontrol, self.sacct = scontrol, sacct
        self.asked: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str:
        self.asked.append(argv)
        text = self.scontrol if argv[0] == "scontrol" else self.sacct
        if text is None:
            raise RuntimeError(f"{argv[0]}: Invalid job id specified")
        return text


def test_slurm_job_records_when_job_appears_and_ends(tmp_path: Path) -> None:
    runner = FixtureRunner(
        (DATA / "scontrol_show_job_8xH100_gaia_redacted.txt").read_text(),
        (DATA / "sacct_parsable_gpu_jobs_mn5.txt").read_text(),
    )
    slurm = SlurmJobs(runner, which=lambda cmd: f"/usr/bin/{cmd}")
    make_proc(tmp_path, 100, {**SLURM_ENV, "SLURM_JOB_ID": "45985946"})
    make_proc(tmp_path, 101, {**SLURM_ENV, "SLURM_JOB_ID": "45985946"})
    gpu_map = {100: [G0], 101: [G1]}
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpu_map, slurm=slurm)
    first = col.collect(1.0)
    jobs = [r for r in first if r["type"] == "job"]
    assert len(jobs) == 1  # once per job, not per process
    job = jobs[0]
    assert check_record(job) is None
    assert (job["job"], job["state"], job["world_size"], job["nodes"]) == (
        "45985946",
        "running",
        8,
        1,
    )
    assert job["config"]["partition"] == "gc3-h100" and job["config"]["gpus"] == 8
    assert runner.asked == [["scontrol", "show", "job", "-o", "45985946"]]

    # last process gone → Slurm asked again; scontrol has forgotten it → sacct's final state
    runner.scontrol = None
    for pid in (100, 101):
        for f in (tmp_path / str(pid)).iterdir():
            f.unlink()
    gpu_map.clear()
    final = [r for r in col.collect(2.0) if r["type"] == "job"]
    assert [(r["job"], r["state"], r["nodes"]) for r in final] == [("45985946", "failed", 2)]
    assert runner.asked[-1][0] == "sacct"


def test_no_slurm_on_node_asks_nothing(tmp_path: Path) -> None:
    runner = FixtureRunner(None, None)
    slurm = SlurmJobs(runner, which=lambda cmd: None)
    make_proc(tmp_path, 100, SLURM_ENV)
    col = IdentityCollector(
        node=NODE, proc_root=tmp_path, gpu_pids=lambda: {100: [G0]}, slurm=slurm
    )
    assert [r["type"] for r in col.collect(1.0)] == ["process"]
    assert runner.asked == []


def test_runtime_join_forgets_a_process_that_is_gone(tmp_path: Path) -> None:
    """process_gone ends a pid in the agent's identity join like an exit record, so a reused
    pid never inherits the old process's job and rank."""
    make_proc(tmp_path, 400, {"SLURM_JOB_ID": "1", "RANK": "7"}, start=100)
    gpu_map = {400: [G0]}
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpu_map)
    join = IdentityJoin(NODE, exit_grace_s=5.0)
    join.apply(col.collect(10.0), now=10.0)
    assert (joined := join.identity_of(400)) is not None and joined["rank"] == 7
    for f in (tmp_path / "400").iterdir():
        f.unlink()
    gpu_map.clear()
    join.apply(col.collect(11.0), now=11.0)
    join.apply([], now=17.0)  # past the grace period
    assert join.identity_of(400) is None


# --- jobs without a scheduler ------------------------------------------------------------------

BOOT = "4ff70477-cac0-414a-ac47-3982013c47c2"


def _with_boot_id(root: Path) -> None:
    d = root / "sys/kernel/random"
    d.mkdir(parents=True, exist_ok=True)
    (d / "boot_id").write_text(BOOT + "\n")


def _jobs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == "job"]


def test_torchrun_ranks_share_the_run_id_job(tmp_path: Path) -> None:
    run = "9e1ed018-c8c8-45b4-a92f-b0e99d9e38de"  # torchrun --standalone: a uuid per run
    for pid, rank in ((100, 0), (101, 1)):
        env = {"TORCHELASTIC_RUN_ID": run, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        make_proc(tmp_path, pid, {**env, "WORLD_SIZE": "2"}, ppid=50)
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: {100: [G0], 101: [G1]})
    records = col.collect(1.0)
    procs = [r for r in records if r["type"] == "process"]
    assert [(p["job"], p["rank"], p["world_size"]) for p in procs] == [
        (f"torchelastic-{run}", 0, 2),
        (f"torchelastic-{run}", 1, 2),
    ]
    assert procs[0]["labels"]["scheduler"] == "torchelastic"
    # one job record for the run, no state (the agent cannot know how it ends), no node list
    assert _jobs(records) == [
        {
            "type": "job",
            "ts": 1.0,
            "job": f"torchelastic-{run}",
            "scheduler": "torchelastic",
            "world_size": 2,
        }
    ]
    for r in records:
        assert check_record(r) is None


def test_torchrun_without_a_run_id_is_its_launchers_job(tmp_path: Path) -> None:
    """A static rendezvous leaves TORCHELASTIC_RUN_ID=none for every run: the job is the
    launcher's (the ranks' parent, torchrun's agent) pid and start time, stable across agent
    restarts and different for the next run."""
    _with_boot_id(tmp_path)
    make_proc(tmp_path, 50, {}, start=777, cmd=("torchrun",))
    for pid, rank in ((100, 0), (101, 1)):
        make_proc(
            tmp_path, pid, {"TORCHELASTIC_RUN_ID": "none", "RANK": str(rank)}, ppid=50, start=800
        )
    gpus = {100: [G0], 101: [G1]}
    want = f"torchelastic-{NODE}-50-777-4ff70477"
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpus)
    procs = [r for r in col.collect(1.0) if r["type"] == "process"]
    assert [(p["job"], p["rank"]) for p in procs] == [(want, 0), (want, 1)]
    restarted = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpus)
    assert {r["job"] for r in restarted.collect(5.0)} == {want}
    # the next run: another torchrun process (same pid even), another start → another job
    make_proc(tmp_path, 50, {}, start=99_000, cmd=("torchrun",))
    again = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpus)
    assert {r["job"] for r in again.collect(9.0)} == {f"torchelastic-{NODE}-50-99000-4ff70477"}


def test_open_mpi_ranks_without_a_scheduler_share_their_launchers_job(tmp_path: Path) -> None:
    make_proc(tmp_path, 60, {}, start=5, cmd=("prted",))
    for pid, rank in ((100, 0), (101, 1)):
        make_proc(tmp_path, pid, {"OMPI_COMM_WORLD_RANK": str(rank)}, ppid=60)
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: {100: [G0], 101: [G1]})
    procs = [r for r in col.collect(1.0) if r["type"] == "process"]
    assert {p["job"] for p in procs} == {f"proc-{NODE}-60-5"}
    assert [p["rank"] for p in procs] == [0, 1]


def test_plain_gpu_process_is_rank_0_of_its_own_job(tmp_path: Path) -> None:
    _with_boot_id(tmp_path)
    make_proc(tmp_path, 300, {"HOME": "/root"}, start=4242)
    make_proc(tmp_path, 301, {}, start=4243, cmd=("python", "-m", "vllm.entrypoints.openai"))
    gpus = {300: [G0], 301: [G1]}
    col = IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpus)
    records = col.collect(1.0)
    procs = {r["pid"]: r for r in records if r["type"] == "process"}
    p = procs[300]
    assert p["job"] == f"proc-{NODE}-300-4242-4ff70477"
    assert (p["rank"], p["local_rank"], p["world_size"]) == (0, 0, 1)
    assert "scheduler" not in p.get("labels", {})
    jobs = {j["job"]: j for j in _jobs(records)}
    assert "kind" not in jobs[p["job"]]  # nothing says what it is
    assert jobs[procs[301]["job"]]["kind"] == "inference"  # the command line says
    # the id is the process's own: another collector (an agent restart) derives the same
    assert (
        IdentityCollector(node=NODE, proc_root=tmp_path, gpu_pids=lambda: gpus).collect(2.0)[0][
            "job"
        ]
        == p["job"]
    )


def test_proof_job_id_from_exec_wins_over_torchrun_but_not_slurm() -> None:
    exec_env = {"PROOF_JOB_ID": "exec-n1-10-20", "PROOF_JOB_SCHEDULER": "proof-exec"}
    under_exec = identity_from_env(5, {**exec_env, "TORCHELASTIC_RUN_ID": "abc", "RANK": "1"})
    assert (under_exec.job, under_exec.scheduler, under_exec.rank) == (
        "exec-n1-10-20",
        "proof-exec",
        1,
    )
    in_slurm = identity_from_env(5, {**exec_env, "SLURM_JOB_ID": "77"})
    assert (in_slurm.job, in_slurm.scheduler) == ("77", "slurm")
    # exec run under torchrun passes the torchrun id on, with its scheduler
    passed = identity_from_env(
        5, {"PROOF_JOB_ID": "torchelastic-abc", "PROOF_JOB_SCHEDULER": "torchelastic"}
    )
    assert (passed.job, passed.scheduler) == ("torchelastic-abc", "torchelastic")
    # without /proc facts (no node, no start time) nothing is made up
    assert identity_from_env(5, {"TORCHELASTIC_RUN_ID": "none"}).job is None
    assert identity_from_env(5, {}).job is None


def test_a_long_run_id_is_kept_within_what_ingest_accepts() -> None:
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    a = identity_from_env(1, {"TORCHELASTIC_RUN_ID": long_a}).job
    b = identity_from_env(1, {"TORCHELASTIC_RUN_ID": long_b}).job
    assert a is not None and b is not None
    assert len(a) == len(b) == 200 and a != b and a.startswith("torchelastic-aaa")
    # exec passes the bounded id on; the agent keeps it as it is
    assert identity_from_env(1, {"PROOF_JOB_ID": a}).job == a


def _stat_fields(pid: int | str) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def test_real_child_with_a_torchelastic_environment() -> None:
    """Real /proc: a torchrun-style worker (its environment as torchrun's agent sets it) and a
    static-rendezvous one, whose job is its parent's — this test process's — pid and start."""
    base = {"PATH": "/usr/bin:/bin", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    sleep = [sys.executable, "-c", "import time; time.sleep(5)"]
    named = subprocess.Popen(sleep, env={**base, "TORCHELASTIC_RUN_ID": "r-8c1f"})
    static = subprocess.Popen(sleep, env={**base, "TORCHELASTIC_RUN_ID": "none"})
    try:
        col = IdentityCollector(node=NODE, gpu_pids=lambda: {named.pid: [G0], static.pid: [G1]})
        procs = {r["pid"]: r for r in col.collect(1.0) if r["type"] == "process"}
        assert (procs[named.pid]["job"], procs[named.pid]["rank"]) == ("torchelastic-r-8c1f", 1)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
        me = os.getpid()
        want = f"torchelastic-{NODE}-{me}-{_stat_fields(me)[19]}-{boot}"
        assert procs[static.pid]["job"] == want
        assert procs[static.pid]["world_size"] == 2
    finally:
        for child in (named, static):
            child.kill()
            child.wait()


def test_real_plain_process_id_from_its_proc_start_time() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(5)"], env={"PATH": "/usr/bin:/bin"}
    )
    try:
        col = IdentityCollector(node=NODE, gpu_pids=lambda: {child.pid: [G0]})
        proc = next(r for r in col.collect(1.0) if r["type"] == "process")
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
        start = _stat_fields(child.pid)[19]
        assert proc["job"] == f"proc-{NODE}-{child.pid}-{start}-{boot}"
        assert (proc["rank"], proc["world_size"]) == (0, 1)
    finally:
        child.kill()
        child.wait()
