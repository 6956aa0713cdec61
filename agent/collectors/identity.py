"""Identity at collection time (docs/design.md §3): PID → job, rank, local rank, world size, GPU.

For each process that uses a GPU (the PID → GPU map comes from NVML), the collector reads
`<proc_root>/<pid>/environ` once — Slurm (`SLURM_JOB_ID`, `SLURM_PROCID`, …), torchrun /
torchelastic (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `TORCHELASTIC_RUN_ID`), Open MPI
(`OMPI_COMM_WORLD_*`), PMI (`PMI_RANK`) — plus `cgroup` (Kubernetes pod uid) and `cmdline`,
and keeps the result keyed by (pid, start time) so a reused PID is a new process.

Records:
- `process` when a process is first seen or its GPUs change;
- `exit` when it ends and its exit code is known (it was caught as a zombie, whose
  `/proc/<pid>/stat` still holds the wait status);
- otherwise the event `process_gone` (signals.EVENT_PROCESS_GONE) with the process's identity:
  the agent is not the process's parent, so it cannot learn an exit code, and the trace
  format requires an integer `exit_code` on `exit` records, which would be a guess;
- `job` records from Slurm (scontrol/sacct) when a new Slurm job appears and again when its
  last process on this node is gone (its final state and exit code), when Slurm is installed.

Which job id (docs/agent.md, "Job ids"), first that applies:
1. Slurm: `SLURM_JOB_ID` as it is.
2. `PROOF_JOB_ID`: set by `proof-agent exec` for everything it starts, computed by these same
   rules from exec's own environment — so the records exec writes and the samples this
   collector keys for the same processes carry the same id.
3. torchrun / torchelastic: `torchelastic-<TORCHELASTIC_RUN_ID>`, unless the run id is `none`
   (torchrun's default for a static rendezvous).
4. Kubernetes: the pod uid from the cgroup path; with the Kubernetes collector, the pod's
   owner's id instead (`k8s-<namespace>-<kind>-<name>-<uid>`, agent/collectors/kubernetes_pods.py).
5. A rank without a run id — torchelastic with run id `none`, Open MPI or PMI ranks: the
   launcher's process id, `torchelastic-…`/`proc-<node>-<parent pid>-<parent start>-<boot>`
   (every rank of the run on this node has the same parent: torchrun's agent, orted, hydra).
6. Any other process: its own, `proc-<node>-<pid>-<start>-<boot>`, as rank 0 of 1.
`<start>` is the process start time in clock ticks since boot (`/proc/<pid>/stat` field 22) and
`<boot>` the first 8 hex digits of the kernel's boot id, so the id survives agent restarts and a
pid reused later — or after a reboot — is another job.
Which rank: `RANK`, else `OMPI_COMM_WORLD_RANK`, else `PMI_RANK`, else
`SLURM_PROCID` (under `srun torchrun …` the torch rank is the meaningful one).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.collectors._common import present
from agent.collectors.nvml import GpuRef
from agent.collectors.slurm import SlurmJobs
from contract import signals
from contract.identity import inference_server

log = logging.getLogger(__name__)

Record = dict[str, Any]


class PodFacts(Protocol):
    @property
    def job(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...


# pod uid, the process's GPU UUIDs → the pod's job and labels (KubernetesCollector.lookup).
PodLookup = Callable[[str, tuple[str, ...]], PodFacts | None]

RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
# Environment variables copied into `labels` (string values) when present.
LABEL_VARS = {
    "SLURM_JOB_ACCOUNT": "slurm_account",
    "SLURM_JOB_PARTITION": "slurm_partition",
    "SLURM_JOB_USER": "slurm_user",
    "SLURM_JOB_NAME": "slurm_job_name",
    "SLURM_STEP_ID": "slurm_step",
    "TORCHELASTIC_RUN_ID": "torchelastic_run_id",
    "KUBERNETES_POD_NAME": "k8s_pod",
    "POD_NAME": "k8s_pod",
    "POD_NAMESPACE": "k8s_namespace",
}
# kubepods cgroup paths: …/kubepods-burstable-pod1234_5678….slice/… (systemd driver, '_' for
# '-') or …/kubepods/burstable/pod1234-5678…/… (cgroupfs driver).
_POD_UID = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)


def parse_environ(data: bytes) -> dict[str, str]:
    """`/proc/<pid>/environ` (NUL-separated `KEY=value`) → dict; undecodable bytes replaced."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def pod_uid_from_cgroup(text: str) -> str | None:
    """The Kubernetes pod uid in a `/proc/<pid>/cgroup` file, or None outside a pod."""
    if "kubepods" not in text:
        return None
    m = _POD_UID.search(text)
    return m.group(1).replace("_", "-") if m else None


def _first_int(env: dict[str, str], names: Iterable[str]) -> int | None:
    for name in names:
        value = env.get(name)
        if value is not None:
            try:
                return int(value.strip())
            except ValueError:
                continue
    return None


@dataclass
class ProcessIdentity:
    """What identity knows about one process."""

    pid: int
    job: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    scheduler: str | None = None
    cmd: list[str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    gpus: tuple[GpuRef, ...] = ()

    def keys(self) -> dict[str, Any]:
        """The identity keys (docs/design.md §3) to stamp on this process's records."""
        out = present(
            {
                signals.PID: self.pid,
                signals.JOB: self.job,
                signals.RANK: self.rank,
                signals.LOCAL_RANK: self.local_rank,
            }
        )
        if len(self.gpus) >= 1:
            first = min(self.gpus, key=lambda g: g.index)
            out[signals.GPU] = first.uuid
            out[signals.GPU_INDEX] = first.index
        return out


# Environment variables `proof-agent exec` sets for what it starts (see the module docstring).
ENV_JOB_ID = "PROOF_JOB_ID"
ENV_JOB_SCHEDULER = "PROOF_JOB_SCHEDULER"
SCHEDULER_EXEC = "proof-exec"
# torchrun's run id when none was given to a static rendezvous: the same for every run.
_NO_RUN_ID = ("", "none")
_HOST_MAX = 64  # node part of a derived id
JOB_ID_MAX = 200  # ingest keeps job ids to 255 characters; derived ids stay well inside


@dataclass(frozen=True)
class ProcStat:
    """What identity needs from `/proc/<pid>/stat`."""

    start: int  # clock ticks since boot (field 22)
    state: str
    ppid: int | None
    exit_status: int | None  # field 52, waitpid format; meaningful for a zombie only


@dataclass(frozen=True)
class ProcOrigin:
    """Where a process comes from, for the ids of jobs without a scheduler: its own start and
    its parent's (the launcher of a rank), and the kernel boot it runs in."""

    start: int | None = None
    ppid: int | None = None
    parent_start: int | None = None
    boot_id: str | None = None


def bounded_job_id(job: str) -> str:
    """`job` when it is at most JOB_ID_MAX characters; else its head and a hash of the whole,
    still one id per run (ingest refuses longer ids, and a user's --rdzv-id can be anything)."""
    if len(job) <= JOB_ID_MAX:
        return job
    digest = hashlib.sha1(job.encode("utf-8", "replace"), usedforsecurity=False).hexdigest()[:12]
    return f"{job[: JOB_ID_MAX - 13]}-{digest}"


def process_job_id(prefix: str, node: str, pid: int, start: int, boot_id: str | None = None) -> str:
    """`<prefix>-<node>-<pid>-<start ticks>[-<boot>]`: one process tree's id, stable for its
    life (whoever computes it, whenever) and unique on the node across pid reuse and reboots."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", node)[:_HOST_MAX] or "node"
    out = f"{prefix}-{host}-{pid}-{start}"
    if boot_id:
        out += "-" + boot_id.replace("-", "")[:8].lower()
    return out


def read_boot_id(proc_root: str | Path = "/proc") -> str | None:
    try:
        text = (Path(proc_root) / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return text or None


def identity_from_env(
    pid: int,
    env: dict[str, str],
    *,
    pod_uid: str | None = None,
    hostname: str | None = None,
    node: str | None = None,
    origin: ProcOrigin | None = None,
    own_prefix: str = "proc",
) -> ProcessIdentity:
    """Job, rank, local rank and world size of a process from its environment (and cgroup).

    `node` and `origin` (its start, its parent's) give a job id to a process no scheduler or
    launcher named (rules 5 and 6 of the module docstring); without them it has none."""
    ident = ProcessIdentity(pid=pid)
    ident.rank = _first_int(env, RANK_VARS)
    ident.local_rank = _first_int(env, LOCAL_RANK_VARS)
    ident.world_size = _first_int(env, WORLD_SIZE_VARS)
    run_id = env.get("TORCHELASTIC_RUN_ID")
    run_id = run_id.strip() if run_id is not None else None
    exec_job = (env.get(ENV_JOB_ID) or "").strip()
    if env.get("SLURM_JOB_ID"):
        ident.job, ident.scheduler = env["SLURM_JOB_ID"].strip(), "slurm"
    elif exec_job:
        ident.job = bounded_job_id(exec_job)
        ident.scheduler = (env.get(ENV_JOB_SCHEDULER) or "").strip() or SCHEDULER_EXEC
    elif run_id is not None and run_id.lower() not in _NO_RUN_ID:
        ident.job, ident.scheduler = bounded_job_id(f"torchelastic-{run_id}"), "torchelastic"
    elif pod_uid:
        ident.job, ident.scheduler = pod_uid, "kubernetes"
    elif node is not None and origin is not None:
        launched = run_id is not None or any(v in env for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"))
        if launched and origin.ppid and origin.parent_start is not None:
            prefix = "torchelastic" if run_id is not None else "proc"
            ident.job = process_job_id(
                prefix, node, origin.ppid, origin.parent_start, origin.boot_id
            )
            ident.scheduler = "torchelastic" if run_id is not None else None
        elif not launched and origin.start is not None:
            ident.job = process_job_id(own_prefix, node, pid, origin.start, origin.boot_id)
            if ident.rank is None and ident.world_size is None:
                # A process on its own is rank 0 of a world of one.
                ident.rank, ident.local_rank, ident.world_size = 0, 0, 1
    for var, label in LABEL_VARS.items():
        if env.get(var):
            ident.labels[label] = env[var]
    if pod_uid:
        ident.labels["k8s_pod_uid"] = pod_uid
        # Inside a pod HOSTNAME is the pod name unless the spec overrides it.
        pod_name = env.get("HOSTNAME") or hostname
        if pod_name and "k8s_pod" not in ident.labels and "KUBERNETES_SERVICE_HOST" in env:
            ident.labels["k8s_pod"] = pod_name
    return ident


def read_origin(proc_root: str | Path, pid: int, boot_id: str | None = None) -> ProcOrigin | None:
    """A process's start, parent and parent's start from `<proc_root>`; None when it is gone."""
    stat = read_stat(proc_root, pid)
    if stat is None:
        return None
    parent = read_stat(proc_root, stat.ppid) if stat.ppid else None
    return ProcOrigin(
        start=stat.start,
        ppid=stat.ppid,
        parent_start=parent.start if parent is not None else None,
        boot_id=boot_id,
    )


def identity_from_own_environment(
    pid: int | None = None, *, node: str | None = None, proc_root: str | Path = "/proc"
) -> ProcessIdentity:
    """The identity of this process (used by `proof-agent exec`, which inherits the
    environment `srun`/`torchrun` give the job). With no scheduler or launcher the job is this
    process's own, `exec-<node>-<pid>-<start>-<boot>` with scheduler `proof-exec`; `pid` is
    the pid the identity is for (exec passes its child's), the id comes from this process."""
    own = os.getpid()
    pod_uid = None
    with contextlib.suppress(OSError):
        pod_uid = pod_uid_from_cgroup((Path(proc_root) / "self/cgroup").read_text())
    origin = read_origin(proc_root, own, read_boot_id(proc_root))
    ident = identity_from_env(
        own,
        dict(os.environ),
        pod_uid=pod_uid,
        node=node or socket.gethostname(),
        origin=origin,
        own_prefix="exec",
    )
    if ident.job is not None and ident.job.startswith("exec-") and ident.scheduler is None:
        ident.scheduler = SCHEDULER_EXEC
    if pid is not None:
        ident.pid = pid
    return ident


@dataclass
class _Tracked:
    ident: ProcessIdentity
    start_time: int


def read_stat(proc_root: str | Path, pid: int) -> ProcStat | None:
    """`/proc/<pid>/stat`'s start time, state, parent and exit status; None when it is gone."""
    try:
        data = (Path(proc_root) / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces and ')'.
    close = data.rfind(b")")
    rest = data[close + 2 :].split()
    try:
        state = rest[0].decode()
        ppid = int(rest[1])  # field 4
        start = int(rest[19])  # field 22
        exit_status = int(rest[49]) if len(rest) > 49 else None  # field 52
    except (IndexError, ValueError):
        return None
    return ProcStat(start, state, ppid or None, exit_status)


def read_start_time(proc_root: Path, pid: int) -> tuple[int, str, int | None] | None:
    """(start time in clock ticks, state letter, exit status) from `/proc/<pid>/stat`; None
    when the process is gone. The exit status (field 52, waitpid format) is only meaningful
    for a zombie."""
    stat = read_stat(proc_root, pid)
    return None if stat is None else (stat.start, stat.state, stat.exit_status)


def wait_status_to_exit_code(status: int) -> tuple[int, int | None]:
    """A waitpid status → (exit code, signal). Killed by a signal → (128 + signal, signal),
    the shell's convention."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    return os.WEXITSTATUS(status), None


class IdentityCollector:
    """Keeps PID → identity for GPU processes and emits process/exit/job records."""

    name = "identity"

    def __init__(
        self,
        *,
        node: str | None = None,
        proc_root: str | Path = "/proc",
        gpu_pids: Callable[[], dict[int, list[GpuRef]]] | None = None,
        extra_pids: Callable[[], Iterable[int]] | None = None,
        slurm: SlurmJobs | None = None,
        pods: PodLookup | None = None,
    ) -> None:
        self.node = node or socket.gethostname()
        self.pods = pods
        self.proc_root = Path(proc_root)
        self.gpu_pids = gpu_pids or dict
        self.extra_pids = extra_pids
        self.slurm = slurm
        self._tracked: dict[int, _Tracked] = {}
        self._jobs_live: dict[str, set[int]] = {}
        self._unreadable_warned = False
        self._boot_id = read_boot_id(self.proc_root)

    # --- lookups for the rest of the agent -----------------------------------------------------

    def identity_of(self, pid: int) -> ProcessIdentity | None:
        tracked = self._tracked.get(pid)
        return tracked.ident if tracked else None

    def identities(self) -> dict[int, ProcessIdentity]:
        return {pid: t.ident for pid, t in self._tracked.items()}

    def gpu_identity(self) -> dict[str, ProcessIdentity]:
        """GPU UUID → the (lowest-pid) process using it, for stamping job/rank on GPU samples."""
        out: dict[str, ProcessIdentity] = {}
        for pid in sorted(self._tracked):
            for ref in self._tracked[pid].ident.gpus:
                out.setdefault(ref.uuid, self._tracked[pid].ident)
        return out

    # --- collection ----------------------------------------------------------------------------

    def collect(self, now: float) -> list[Record]:
        out: list[Record] = []
        gpu_map = self.gpu_pids()
        candidates: dict[int, tuple[GpuRef, ...]] = {
            pid: tuple(refs) for pid, refs in gpu_map.items()
        }
        if self.extra_pids is not None:
            for pid in self.extra_pids():
                candidates.setdefault(pid, ())
        # Processes seen before: still alive (same start time)? GPUs changed?
        for pid in list(self._tracked):
            tracked = self._tracked[pid]
            stat = read_start_time(self.proc_root, pid)
            if stat is None or stat[0] != tracked.start_time or stat[1] in ("Z", "X"):
                self._ended(pid, tracked, stat, now, out)
                continue
            if pid in candidates and candidates[pid] != tracked.ident.gpus:
                tracked.ident.gpus = candidates[pid]
                out.append(self._process_record(tracked.ident, now))
        for pid, gpus in candidates.items():
            if pid in self._tracked:
                continue
            ident_start = self._read_identity(pid)
            if ident_start is None:
                continue
            ident, start = ident_start
            ident.gpus = gpus
            self._pod_job(ident)
            self._tracked[pid] = _Tracked(ident, start)
            out.append(self._process_record(ident, now))
            if ident.job is not None:
                live = self._jobs_live.setdefault(ident.job, set())
                if not live:
                    if ident.scheduler == "slurm":
                        self._job_record(ident.job, now, out)
                    else:
                        out.append(self._unscheduled_job_record(ident, now))
                live.add(pid)
        return out

    def _pod_job(self, ident: ProcessIdentity) -> None:
        """A process keyed by its pod uid (rule 4) takes its pod's job id and labels from the
        Kubernetes collector (its owner's: agent/collectors/kubernetes_pods.py), when known."""
        uid = ident.labels.get("k8s_pod_uid")
        if self.pods is None or uid is None or ident.scheduler != "kubernetes":
            return
        found = self.pods(uid, tuple(g.uuid for g in ident.gpus))
        if found is not None:
            ident.job = found.job
            ident.labels.update(found.labels)

    def _read_identity(self, pid: int) -> tuple[ProcessIdentity, int] | None:
        base = self.proc_root / str(pid)
        stat = read_stat(self.proc_root, pid)
        if stat is None or stat.state in ("Z", "X"):
            return None
        parent = read_stat(self.proc_root, stat.ppid) if stat.ppid else None
        origin = ProcOrigin(
            stat.start, stat.ppid, parent.start if parent is not None else None, self._boot_id
        )
        try:
            env = parse_environ((base / "environ").read_bytes())
        except PermissionError:
            if not self._unreadable_warned:
                self._unreadable_warned = True
                log.warning(
                    "cannot read %s/environ (not root?): job/rank identity unavailable", base
                )
            env = {}
        except OSError:
            return None  # exited between the listing and the read
        try:
            pod_uid = pod_uid_from_cgroup((base / "cgroup").read_text(errors="replace"))
        except OSError:
            pod_uid = None
        ident = identity_from_env(pid, env, pod_uid=pod_uid, node=self.node, origin=origin)
        try:
            argv = (base / "cmdline").read_bytes().split(b"\0")
            ident.cmd = [a.decode("utf-8", "replace") for a in argv if a] or None
        except OSError:
            pass
        return ident, stat.start

    def _ended(
        self,
        pid: int,
        tracked: _Tracked,
        stat: tuple[int, str, int | None] | None,
        now: float,
        out: list[Record],
    ) -> None:
        del self._tracked[pid]
        ident = tracked.ident
        keys = ident.keys()
        zombie = stat is not None and stat[0] == tracked.start_time and stat[1] in ("Z", "X")
        if zombie and stat is not None and stat[2] is not None:
            code, sig = wait_status_to_exit_code(stat[2])
            rec: Record = {"type": "exit", "ts": now, "node": self.node, **keys, "exit_code": code}
            if sig is not None:
                rec["labels"] = {"signal": str(sig)}
            out.append(rec)
        else:
            out.append(
                {
                    "type": "event",
                    "ts": now,
                    "name": signals.EVENT_PROCESS_GONE,
                    "node": self.node,
                    **keys,
                    "text": "process ended; exit code unknown (not the agent's child)",
                }
            )
        if ident.job is not None:
            live = self._jobs_live.get(ident.job)
            if live is not None:
                live.discard(pid)
                if not live:
                    del self._jobs_live[ident.job]
                    if ident.scheduler == "slurm":
                        self._job_record(ident.job, now, out)

    def _unscheduled_job_record(self, ident: ProcessIdentity, now: float) -> Record:
        """A job no scheduler describes (torchrun, exec, a plain process), when first seen:
        who named it, and its kind when the command says (an inference server). No state: the
        agent is not its parent and cannot know how it ends."""
        if ident.job is None:
            raise ValueError("a job record needs the process's job id")
        # No `nodes`: a run over several nodes is seen by each node's agent, and a record's
        # node list replaces the one before.
        rec: Record = {"type": "job", "ts": now, "job": ident.job}
        if ident.scheduler:
            rec["scheduler"] = ident.scheduler
        if ident.world_size is not None:
            rec["world_size"] = ident.world_size
        if inference_server(ident.cmd):
            rec["kind"] = "inference"
        return rec

    def _job_record(self, job: str, now: float, out: list[Record]) -> None:
        if self.slurm is None or not self.slurm.available:
            return
        rec = self.slurm.job_record(job, now)
        if rec is not None:
            out.append(rec)

    def _process_record(self, ident: ProcessIdentity, now: float) -> Record:
        rec: Record = {"type": "process", "ts": now, "node": self.node, **ident.keys()}
        if ident.world_size is not None:
            rec["world_size"] = ident.world_size
        if ident.cmd:
            rec["cmd"] = ident.cmd
        labels = dict(ident.labels)
        if ident.scheduler:
            labels["scheduler"] = ident.scheduler
        if len(ident.gpus) > 1:
            labels["gpus"] = ",".join(g.uuid for g in sorted(ident.gpus, key=lambda g: g.index))
        if labels:
            rec["labels"] = labels
        return rec
