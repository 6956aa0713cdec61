"""The synthetic part of a seeded operator: nodes and GPUs, jobs with their ranks, processes,
per-GPU usage (what the real price is computed from) and data activity.

Every array is drawn at once with numpy and written column by column (frontend/seeding/bulk.py);
nothing loops a query per row. Shapes follow what ingest and the live pipeline write: a job
holds `nodes × 8` ranks, one per GPU, each rank a process on its GPU; a job's usage rows split
its GPU time into compute / waiting / idle (docs/pricing.md) with the method the agent allowed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np

from frontend.seeding.bulk import ids_of, insert_columns
from ingest.models import Gpu, Job, JobRank, JobState, Node, Process
from investigations.models import GpuListPrice, JobActivity, JobGpuUsage

# What NVML calls the models (docs/pricing.md: list prices are per model, by that name), the
# share of the fleet's racks of each, memory, and a list price per GPU-hour.
GPU_MODELS: tuple[tuple[str, float, int, Decimal], ...] = (
    ("NVIDIA H100 80GB HBM3", 0.60, 81559, Decimal("2.4900")),
    ("NVIDIA H200", 0.25, 143771, Decimal("3.7900")),
    ("NVIDIA A100-SXM4-80GB", 0.15, 81920, Decimal("1.2900")),
)
AGENT_VERSIONS = ("0.1.0", "0.1.1", "0.1.2")
DRIVERS = (("550.90.07", "12.4"), ("560.35.03", "12.6"))
# Nodes per job and how often (training runs from one node to a 32-node pod).
JOB_NODES = np.array([1, 2, 4, 8, 16, 32])
JOB_NODES_P = np.array([0.46, 0.2, 0.15, 0.1, 0.06, 0.03])
DAY_S = 86_400.0
HISTORY_DAYS = 30.0
TRAINING_NAMES = ("llama-3-8b-pretrain", "mistral-7b-sft", "gpt-neox-20b", "vit-h-14", "t5-xl")
INFERENCE_NAMES = ("vllm-llama-70b", "vllm-mixtral", "tgi-qwen-32b")


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


@dataclass
class FleetSeed:
    """What the synthetic fleet holds, by array index, for the incidents and series after it."""

    node_ids: np.ndarray  # int64[nodes]
    hostnames: list[str]
    node_model: np.ndarray  # int[nodes]: index into GPU_MODELS
    gpu_uuids: list[list[str]]  # [node][index]
    job_pks: np.ndarray  # int64[jobs]
    job_ids: list[str]
    job_customer: np.ndarray  # int[jobs]: index into the customers, -1 for none
    job_start: np.ndarray  # float64 seconds
    job_end: np.ndarray  # float64 seconds (now for running jobs)
    job_running: np.ndarray  # bool
    job_nodes: list[np.ndarray]  # node indices of each job
    job_share: np.ndarray  # each job's productive share
    gpu_busy: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (nodes, 8) 0–1 now
    gpu_job: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (nodes, 8) job or -1


def seed_prices(operator_id: int) -> None:
    insert_columns(
        GpuListPrice,
        {
            "operator_id": [operator_id] * len(GPU_MODELS),
            "gpu_model": [m[0] for m in GPU_MODELS],
            "price_per_gpu_hour": [m[3] for m in GPU_MODELS],
            "currency": ["USD"] * len(GPU_MODELS),
        },
    )


def _uuid(rng: np.random.Generator) -> str:
    return f"GPU-{uuid.UUID(bytes=rng.bytes(16))}"


def seed_nodes(
    operator_id: int,
    rng: np.random.Generator,
    *,
    nodes: int,
    gpus_per_node: int,
    prefix: str,
    now: float,
) -> tuple[np.ndarray, list[str], np.ndarray, list[list[str]]]:
    """Nodes named `<prefix>-<rack>-<slot>` (32 a rack), each with its GPUs."""
    hostnames = [f"{prefix}-r{i // 32:03d}-{i % 32:02d}" for i in range(nodes)]
    shares = np.array([m[1] for m in GPU_MODELS])
    # Racks are bought whole: one model a rack.
    racks = (nodes + 31) // 32
    rack_model = np.searchsorted(np.cumsum(shares), (np.arange(racks) + 0.5) / max(racks, 1))
    node_model = np.minimum(rack_model[np.arange(nodes) // 32], len(GPU_MODELS) - 1)
    # Most agents reported within the last seconds; a few nodes are down since hours.
    last_seen = now - rng.uniform(0.0, 5.0, nodes)
    down = rng.random(nodes) < 0.01
    last_seen[down] = now - rng.uniform(3_600.0, 6 * 3_600.0, int(down.sum()))
    versions = rng.choice(len(AGENT_VERSIONS), nodes, p=[0.1, 0.3, 0.6])
    insert_columns(
        Node,
        {
            "operator_id": [operator_id] * nodes,
            "hostname": hostnames,
            "agent_id": [f"agent-{h}" for h in hostnames],
            "agent_version": [AGENT_VERSIONS[v] for v in versions],
            "registered_at": [_dt(now - 20 * DAY_S)] * nodes,
            "last_seen_at": [_dt(t) for t in last_seen],
        },
    )
    by_name = ids_of(Node, "hostname", hostnames)
    node_ids = np.array([by_name[h] for h in hostnames], dtype=np.int64)
    gpu_uuids = [[_uuid(rng) for _ in range(gpus_per_node)] for _ in range(nodes)]
    driver = rng.choice(len(DRIVERS), nodes)
    count = nodes * gpus_per_node
    per_gpu_node = np.repeat(np.arange(nodes), gpus_per_node)
    insert_columns(
        Gpu,
        {
            "operator_id": [operator_id] * count,
            "node_id": node_ids[per_gpu_node],
            "uuid": [u for row in gpu_uuids for u in row],
            "index": np.tile(np.arange(gpus_per_node), nodes),
            "model": [GPU_MODELS[int(node_model[n])][0] for n in per_gpu_node],
            "memory_mib": [GPU_MODELS[int(node_model[n])][2] for n in per_gpu_node],
            "driver_version": [DRIVERS[int(driver[n])][0] for n in per_gpu_node],
            "cuda_version": [DRIVERS[int(driver[n])][1] for n in per_gpu_node],
            "last_seen_at": [_dt(last_seen[n]) for n in per_gpu_node],
        },
    )
    return node_ids, hostnames, node_model, gpu_uuids


def _job_name(rng: np.random.Generator, scheduler: str, k: int, team: str) -> str:
    if scheduler == "slurm":
        return str(4_800_000 + k * 37 + int(rng.integers(0, 37)))
    # Kubernetes: "namespace/name" — an id with a slash, as the console's URLs must carry.
    return f"{team}/train-{k:05d}-{rng.integers(0, 36**4):04x}"


def seed_jobs(
    operator_id: int,
    rng: np.random.Generator,
    *,
    jobs: int,
    customers: int,
    customer_ids: list[int],
    customer_slugs: list[str],
    node_ids: np.ndarray,
    hostnames: list[str],
    node_model: np.ndarray,
    gpu_uuids: list[list[str]],
    now: float,
) -> FleetSeed:
    """`jobs` jobs over the last 30 days; those running now hold ~85% of the nodes."""
    n_nodes = len(node_ids)
    gpus_per_node = len(gpu_uuids[0]) if gpu_uuids else 8
    order = rng.permutation(n_nodes)
    want = rng.choice(JOB_NODES, jobs, p=JOB_NODES_P)
    inference = rng.random(jobs) < 0.2
    want[inference] = 1
    job_nodes: list[np.ndarray] = []
    running = np.zeros(jobs, dtype=bool)
    used = 0
    budget = int(0.85 * n_nodes)
    # Running jobs first (the newest), packed onto distinct nodes until the budget is spent.
    for j in range(jobs):
        k = int(min(want[j], max(n_nodes, 1)))
        if used + k <= budget and running.sum() < max(1, jobs * 0.2):
            job_nodes.append(order[used : used + k])
            used += k
            running[j] = True
        else:
            start = int(rng.integers(0, max(n_nodes - k + 1, 1)))
            job_nodes.append(np.arange(start, start + min(k, n_nodes)))
    sizes = np.array([len(n) for n in job_nodes])
    duration = np.exp(rng.normal(np.log(6 * 3600.0), 1.2, jobs)).clip(600.0, 10 * DAY_S)
    start = np.where(
        running,
        now - np.minimum(duration, rng.uniform(0.05, 1.0, jobs) * 3 * DAY_S),
        now - rng.uniform(0.0, HISTORY_DAYS * DAY_S, jobs) - duration,
    )
    end = np.where(running, now, np.minimum(start + duration, now - 60.0))
    state_draw = rng.random(jobs)
    states = np.where(
        running,
        JobState.RUNNING.value,
        np.where(
            state_draw < 0.75,
            JobState.COMPLETED.value,
            np.where(state_draw < 0.9, JobState.FAILED.value, JobState.CANCELLED.value),
        ),
    )
    # Customers: a few big ones, a long tail; 4% of jobs match no mapping rule.
    weights = 1.0 / np.arange(1, customers + 1) ** 0.9
    customer = rng.choice(customers, jobs, p=weights / weights.sum())
    customer[rng.random(jobs) < 0.04] = -1
    scheduler = np.where(rng.random(jobs) < 0.6, "slurm", "kubernetes")
    job_ids = [
        _job_name(
            rng, str(scheduler[j]), j, customer_slugs[customer[j]] if customer[j] >= 0 else "batch"
        )
        for j in range(jobs)
    ]
    share = np.clip(rng.beta(7.0, 3.0, jobs), 0.15, 0.97)
    names = [
        (INFERENCE_NAMES if inference[j] else TRAINING_NAMES)[int(rng.integers(0, 3))]
        for j in range(jobs)
    ]
    insert_columns(
        Job,
        {
            "operator_id": [operator_id] * jobs,
            "job_id": job_ids,
            "customer_id": [customer_ids[c] if c >= 0 else None for c in customer],
            "kind": np.where(inference, "inference", "training"),
            "name": names,
            "scheduler": scheduler,
            "state": states,
            "world_size": sizes * gpus_per_node,
            "exit_code": [
                None if s == "running" else (0 if s == "completed" else 1) for s in states
            ],
            "nodes": [[hostnames[n] for n in nodes] for nodes in job_nodes],
            "attributes": [
                {"job_id": job_ids[j], "slurm_account": customer_slugs[customer[j]]}
                if customer[j] >= 0
                else {"job_id": job_ids[j]}
                for j in range(jobs)
            ],
            "first_seen_at": [_dt(t) for t in start],
            "last_seen_at": [_dt(t) for t in end],
            "ended_at": [None if r else _dt(t) for r, t in zip(running, end, strict=True)],
        },
    )
    by_id = ids_of(Job, "job_id", job_ids)
    job_pks = np.array([by_id[j] for j in job_ids], dtype=np.int64)
    seed = FleetSeed(
        node_ids=node_ids,
        hostnames=hostnames,
        node_model=node_model,
        gpu_uuids=gpu_uuids,
        job_pks=job_pks,
        job_ids=job_ids,
        job_customer=customer,
        job_start=start,
        job_end=end,
        job_running=running,
        job_nodes=job_nodes,
        job_share=share,
    )
    _seed_ranks(operator_id, rng, seed, gpus_per_node, now)
    _seed_activity(operator_id, seed)
    return seed


def _seed_ranks(
    operator_id: int, rng: np.random.Generator, seed: FleetSeed, gpus_per_node: int, now: float
) -> None:
    """One rank, process and usage row per GPU of every job; the GPUs' current load."""
    job_of = np.concatenate(
        [np.full(len(n) * gpus_per_node, j) for j, n in enumerate(seed.job_nodes)]
    )
    node_of = np.concatenate([np.repeat(n, gpus_per_node) for n in seed.job_nodes])
    rank = np.concatenate([np.arange(len(n) * gpus_per_node) for n in seed.job_nodes])
    local = rank % gpus_per_node
    count = len(job_of)
    uuids = [seed.gpu_uuids[int(n)][int(g)] for n, g in zip(node_of, local, strict=True)]
    pid = rng.integers(10_000, 4_000_000, count)
    ops = [operator_id] * count
    insert_columns(
        JobRank,
        {
            "operator_id": ops,
            "job_id": seed.job_pks[job_of],
            "rank": rank,
            "local_rank": local,
            "node_id": seed.node_ids[node_of],
            "gpu": uuids,
            "pid": pid,
        },
    )
    start, end = seed.job_start[job_of], seed.job_end[job_of]
    running = seed.job_running[job_of]
    # A job that reuses a node in history may repeat (node, pid): processes are unique per
    # node and pid, so ended jobs' pids are offset by their job index.
    pid = np.where(running, pid, 5_000_000 + job_of * 64 + local)
    insert_columns(
        Process,
        {
            "operator_id": ops,
            "node_id": seed.node_ids[node_of],
            "pid": pid,
            "job_id": seed.job_pks[job_of],
            "rank": rank,
            "local_rank": local,
            "world_size": [len(seed.job_nodes[j]) * gpus_per_node for j in job_of],
            "gpu": uuids,
            "cmd": ["torchrun --nproc-per-node 8 train.py"] * count,
            "first_seen_at": [_dt(t) for t in start],
            "last_seen_at": [_dt(t) for t in end],
            "exit_code": [None if r else 0 for r in running],
            "exited_at": [None if r else _dt(t) for r, t in zip(running, end, strict=True)],
        },
    )
    # Usage (docs/pricing.md): per GPU, the job's share ± a few points; a straggler-like GPU
    # now and then; waiting is most of what is not compute, idle the rest.
    gpu_seconds = end - start
    compute = np.clip(seed.job_share[job_of] + rng.normal(0.0, 0.03, count), 0.05, 0.99)
    wait = (1.0 - compute) * rng.uniform(0.4, 0.8, count)
    idle = np.clip(1.0 - compute - wait, 0.0, 1.0)
    method = np.where(rng.random(count) < 0.9, "engine+ebpf", "engine")
    insert_columns(
        JobGpuUsage,
        {
            "operator_id": ops,
            "job_id": seed.job_pks[job_of],
            "gpu": uuids,
            "node": [seed.hostnames[int(n)] for n in node_of],
            "gpu_model": [GPU_MODELS[int(seed.node_model[int(n)])][0] for n in node_of],
            "gpu_seconds": gpu_seconds,
            "compute_seconds": gpu_seconds * compute,
            "wait_seconds": gpu_seconds * wait,
            "idle_seconds": gpu_seconds * idle,
            "first_ts": start,
            "last_ts": end,
            "method": method,
        },
    )
    busy = np.zeros((len(seed.node_ids), gpus_per_node))
    gpu_job = np.full((len(seed.node_ids), gpus_per_node), -1, dtype=np.int64)
    live = running
    busy[node_of[live], local[live]] = np.clip(compute[live] + wait[live], 0.0, 1.0)
    gpu_job[node_of[live], local[live]] = job_of[live]
    seed.gpu_busy, seed.gpu_job = busy, gpu_job
    _ = now


def _seed_activity(operator_id: int, seed: FleetSeed) -> None:
    count = len(seed.job_pks)
    last = seed.job_end
    insert_columns(
        JobActivity,
        {
            "operator_id": [operator_id] * count,
            "job_id": seed.job_pks,
            "first_data_ts": seed.job_start,
            "last_data_ts": last,
            "received_at": [_dt(t) for t in last],
            "evaluated_through_ts": last,
            "evaluated_at": [_dt(t) for t in last],
            "usage_through_ts": last - 30.0,
        },
    )
