"""The simulated fleet: nodes with GPUs, host CPU/memory, InfiniBand ports and two mounts.

`Fleet` owns the per-sample arrays every job adds into (GPU activity, host CPU, IB traffic,
storage I/O) and the GPU faults; `emit()` turns them into trace samples once all jobs ran.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import signals
from simulator.hardware import (
    A100_SXM,
    H100_SXM,
    H200_SXM,
    GpuActivity,
    GpuFaults,
    GpuSpec,
    gpu_uuid,
    round_ratio,
    simulate_gpus,
)
from simulator.run import SimRun

_HOST_PATTERNS = ("gpu-node-{:03d}", "dgx-h100-{:03d}", "hgx{:04d}", "gpu{:03d}")
_SHARED_MOUNTS = ("/mnt/shared", "/shared", "/mnt/nfs/home", "/data")
_LOCAL_MOUNTS = (("/raid", "ext4"), ("/local_nvme", "xfs"), ("/scratch", "xfs"))
_IB_PORTS_PER_NODE = 8


@dataclass
class Node:
    hostname: str
    index: int
    gpu_uuids: list[str]
    cpu_cores: int
    mem_total_bytes: int
    ib_devices: list[str]


@dataclass
class Mount:
    path: str
    fstype: str
    shared: bool
    healthy_write_bw: float  # bytes/s one node can write when nothing is wrong
    healthy_latency_ms: float


@dataclass
class Fleet:
    seed: int
    n_samples: int
    interval_s: float
    start_ts: float
    nodes: list[Node]
    gpus_per_node: int
    shared: Mount
    local: Mount
    spec: GpuSpec = H100_SXM
    activity: GpuActivity = field(init=False)
    faults: GpuFaults = field(init=False)
    # Node-level accumulators, (n_nodes, n_samples) unless noted.
    host_cores_used: np.ndarray = field(init=False)
    host_mem_used: np.ndarray = field(init=False)
    ib_xmit: np.ndarray = field(init=False)  # (n_nodes, ports, n) bytes per sample
    ib_rcv: np.ndarray = field(init=False)
    ib_wait: np.ndarray = field(init=False)
    ib_errors: dict[str, np.ndarray] = field(init=False)  # name -> (nodes, ports, n) per sample
    storage_write: dict[str, np.ndarray] = field(init=False)  # mount path -> bytes per sample
    storage_read: dict[str, np.ndarray] = field(init=False)
    storage_write_ms: dict[str, np.ndarray] = field(init=False)  # latency while writing
    # Identity join for GPU samples: gpu global index -> list of (start, end, identity).
    gpu_owner: dict[int, list[tuple[int, int, dict[str, Any]]]] = field(init=False)

    def __post_init__(self) -> None:
        n_nodes, n = len(self.nodes), self.n_samples
        self.activity = GpuActivity.idle(self.n_gpus, n)
        self.faults = GpuFaults(self.n_gpus, n)
        self.host_cores_used = np.zeros((n_nodes, n))
        self.host_mem_used = np.zeros((n_nodes, n))
        shape = (n_nodes, _IB_PORTS_PER_NODE, n)
        self.ib_xmit = np.zeros(shape)
        self.ib_rcv = np.zeros(shape)
        self.ib_wait = np.zeros(shape)
        self.ib_errors = {
            name: np.zeros(shape)
            for name in (
                signals.IB_SYMBOL_ERROR,
                signals.IB_LINK_DOWNED,
                signals.IB_LINK_ERROR_RECOVERY,
                signals.IB_PORT_RCV_ERRORS,
            )
        }
        self.storage_write = {m.path: np.zeros((n_nodes, n)) for m in (self.shared, self.local)}
        self.storage_read = {m.path: np.zeros((n_nodes, n)) for m in (self.shared, self.local)}
        self.storage_write_ms = {
            m.path: np.full((n_nodes, n), np.nan) for m in (self.shared, self.local)
        }
        self.gpu_owner = {}

    @property
    def n_gpus(self) -> int:
        return len(self.nodes) * self.gpus_per_node

    def gpu(self, node: int, local: int) -> int:
        return node * self.gpus_per_node + local

    def index_at(self, t: float) -> int:
        """Sample index whose interval [ts_i, ts_i + dt) contains absolute time t."""
        return int(np.clip(np.floor((t - self.start_ts) / self.interval_s), 0, self.n_samples - 1))

    # --- emission ---------------------------------------------------------------------------

    def emit(self, run: SimRun, rng: np.random.Generator) -> None:
        self._emit_gpus(run, rng)
        self._emit_nodes(run, rng)

    def _gpu_segments(self) -> list[tuple[int, int, list[dict[str, Any]]]]:
        """Split time where any GPU's owner changes; rows carry the job identity then."""
        cuts = {0, self.n_samples}
        for spans in self.gpu_owner.values():
            for s, e, _ in spans:
                cuts.update((min(max(s, 0), self.n_samples), min(max(e, 0), self.n_samples)))
        bounds = sorted(cuts)
        segments = []
        for a, b in itertools.pairwise(bounds):
            rows = []
            for ni, node in enumerate(self.nodes):
                for li, uuid in enumerate(node.gpu_uuids):
                    row: dict[str, Any] = {"node": node.hostname, "gpu": uuid, "gpu_index": li}
                    for s, e, ident in self.gpu_owner.get(self.gpu(ni, li), []):
                        if s <= a and b <= e:
                            row.update(ident)
                    rows.append(row)
            segments.append((a, b, rows))
        return segments

    def _emit_gpus(self, run: SimRun, rng: np.random.Generator) -> None:
        out = simulate_gpus(
            self.activity, self.faults, rng, spec=self.spec, interval_s=self.interval_s
        )
        lost = np.arange(self.n_samples)[None, :] >= self.faults.lost_from[:, None]
        valid = None if not lost.any() else ~lost
        for a, b, rows in self._gpu_segments():
            for name, arr in out.items():
                vals = arr[:, a:b]
                if vals.dtype.kind == "f":
                    vals = (
                        round_ratio(vals)
                        if name != signals.DCGM_FI_DEV_POWER_USAGE
                        else np.round(vals, 3)
                    )
                run.add_samples(
                    name, vals, rows, start=a, valid=None if valid is None else valid[:, a:b]
                )

    def _emit_nodes(self, run: SimRun, rng: np.random.Generator) -> None:
        n_nodes, n = len(self.nodes), self.n_samples
        host_rows = [{"node": nd.hostname} for nd in self.nodes]
        cores = np.array([nd.cpu_cores for nd in self.nodes], dtype=float)[:, None]
        background = rng.uniform(1.5, 4.0, (n_nodes, 1)) + rng.gamma(2.0, 0.4, (n_nodes, n))
        cpu = np.clip((self.host_cores_used + background) / cores, 0, 1)
        run.add_samples(signals.HOST_CPU_UTIL, np.round(cpu, 4), host_rows)
        mem_base = rng.uniform(35e9, 80e9, (n_nodes, 1))
        mem = mem_base + self.host_mem_used + rng.normal(0, 2e8, (n_nodes, n)).cumsum(axis=1) * 0.05
        mem = np.clip(mem, 8e9, np.array([nd.mem_total_bytes for nd in self.nodes])[:, None])
        run.add_samples(signals.HOST_MEM_USED_BYTES, mem.astype(np.int64), host_rows)

        # InfiniBand: cumulative counters per device/port; a little management traffic always.
        ib_rows = [
            {"node": nd.hostname, "labels": {"device": dev, "port": "1"}}
            for nd in self.nodes
            for dev in nd.ib_devices
        ]
        n_ports = n_nodes * _IB_PORTS_PER_NODE
        bg = rng.gamma(2.0, 2.0e5, (n_nodes, _IB_PORTS_PER_NODE, n))
        start = rng.integers(10**11, 10**14, (n_nodes, _IB_PORTS_PER_NODE, 1)).astype(float)
        for name, per in (
            (signals.IB_PORT_XMIT_DATA, self.ib_xmit + bg),
            (signals.IB_PORT_RCV_DATA, self.ib_rcv + bg * rng.uniform(0.9, 1.1)),
        ):
            total = start + np.cumsum(np.round(per), axis=2)
            run.add_samples(name, total.reshape(n_ports, n).astype(np.int64), ib_rows)
        wait = rng.poisson(np.clip(self.ib_wait, 0, None) + 50.0)
        wait_start = rng.integers(10**6, 10**9, (n_nodes, _IB_PORTS_PER_NODE, 1))
        run.add_samples(
            signals.IB_PORT_XMIT_WAIT,
            (wait_start + np.cumsum(wait, axis=2)).reshape(n_ports, n).astype(np.int64),
            ib_rows,
        )
        for name, per in self.ib_errors.items():
            pre = np.zeros((n_nodes, _IB_PORTS_PER_NODE, 1), dtype=np.int64)
            if name == signals.IB_SYMBOL_ERROR:
                # Old, flat symbol errors on some ports: pre-existing, not a live problem.
                pre = rng.choice([0, 0, 0, 0, 1, 3, 12], (n_nodes, _IB_PORTS_PER_NODE, 1))
            total = pre + np.cumsum(np.round(per).astype(np.int64), axis=2)
            run.add_samples(name, total.reshape(n_ports, n), ib_rows)

        # Storage per mount: cumulative bytes; mean write latency per interval.
        for mount in (self.shared, self.local):
            rows = [
                {"node": nd.hostname, "labels": {"mount": mount.path, "fstype": mount.fstype}}
                for nd in self.nodes
            ]
            # Logs, metrics and small files keep a trickle of writes on the shared mount.
            trickle = rng.gamma(1.5, 6e4 if mount.shared else 1e4, (n_nodes, n))
            writes = self.storage_write[mount.path] + trickle
            reads = self.storage_read[mount.path] + rng.gamma(1.2, 2e4, (n_nodes, n))
            w0 = rng.integers(10**10, 10**13, (n_nodes, 1)).astype(float)
            r0 = rng.integers(10**10, 10**13, (n_nodes, 1)).astype(float)
            run.add_samples(
                signals.STORAGE_WRITE_BYTES,
                (w0 + np.cumsum(np.round(writes), axis=1)).astype(np.int64),
                rows,
            )
            run.add_samples(
                signals.STORAGE_READ_BYTES,
                (r0 + np.cumsum(np.round(reads), axis=1)).astype(np.int64),
                rows,
            )
            lat = self.storage_write_ms[mount.path]
            base = mount.healthy_latency_ms * rng.lognormal(0.0, 0.25, (n_nodes, n))
            lat = np.where(np.isnan(lat), base, lat)
            run.add_samples(signals.STORAGE_WRITE_MS, np.round(lat, 3), rows)


def make_fleet(
    rng: np.random.Generator,
    *,
    seed: int,
    n_nodes: int,
    gpus_per_node: int,
    n_samples: int,
    start_ts: float,
    interval_s: float = 1.0,
) -> Fleet:
    pattern = _HOST_PATTERNS[int(rng.integers(len(_HOST_PATTERNS)))]
    numbers = rng.choice(np.arange(1, 512), size=n_nodes, replace=False)
    numbers.sort()
    cores = int(rng.choice([112, 128, 192, 224]))
    mem = int(rng.choice([1, 2])) * 1024**4
    nodes = []
    for i, num in enumerate(numbers):
        host = pattern.format(int(num))
        nodes.append(
            Node(
                hostname=host,
                index=i,
                gpu_uuids=[gpu_uuid(seed, host, g) for g in range(gpus_per_node)],
                cpu_cores=cores,
                mem_total_bytes=mem,
                ib_devices=[f"mlx5_{p}" for p in range(_IB_PORTS_PER_NODE)],
            )
        )
    local_path, local_fs = _LOCAL_MOUNTS[int(rng.integers(len(_LOCAL_MOUNTS)))]
    # Mostly H100s; some fleets are H200 or A100: no detector may rely on one GPU's numbers.
    spec = (H100_SXM, H200_SXM, A100_SXM)[int(rng.choice(3, p=[0.7, 0.15, 0.15]))]
    return Fleet(
        spec=spec,
        seed=seed,
        n_samples=n_samples,
        interval_s=interval_s,
        start_ts=start_ts,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        shared=Mount(
            path=_SHARED_MOUNTS[int(rng.integers(len(_SHARED_MOUNTS)))],
            fstype="nfs4",
            shared=True,
            healthy_write_bw=float(rng.uniform(1.2e9, 2.5e9)),
            healthy_latency_ms=float(rng.uniform(2.0, 12.0)),
        ),
        local=Mount(
            path=local_path,
            fstype=local_fs,
            shared=False,
            healthy_write_bw=float(rng.uniform(5e9, 12e9)),
            healthy_latency_ms=float(rng.uniform(0.05, 0.4)),
        ),
    )
