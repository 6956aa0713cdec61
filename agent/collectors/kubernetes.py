"""Kubernetes identity: which pod, namespace and container hold each GPU, and the pod's job.

Source: the kubelet's PodResources API v1 on its unix socket
(`/var/lib/kubelet/pod-resources/kubelet.sock`, the source dcgm-exporter uses): `List` gives
each container's devices by resource name (`nvidia.com/gpu`, MIG profiles `nvidia.com/mig-…`),
`GetAllocatableResources` the node's allocatable GPUs. The NVIDIA device plugin names devices
by UUID (`GPU-…`, `MIG-…`), or by index with `DEVICE_ID_STRATEGY=index` (mapped to the UUID
through NVML here). Pod labels and owners come from a `PodDirectory`
(agent/collectors/kubernetes_pods.py), so each pod's job id is its owner's.

Records: a `job` record (scheduler `kubernetes`, state `running`, the namespace as the
`k8s_namespace` attribute) when a job's GPUs on this node change, carrying the local
`allocation` key — `{"gpus": [uuid, …], "gpu_indices": [...]}`, empty when the job's last pod
here is gone — which the identity join (agent/runtime/identity.py) uses to key the samples of
allocated GPUs that no process is using yet (a job stuck before its first CUDA call is still
that job's). The identity collector asks `lookup(pod_uid, gpus)` for a process in a pod.

Every OS touchpoint is an argument (socket path, pod sources, the GPU index → UUID map); a
socket that is missing or does not answer is logged once and the collector returns nothing
until it answers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.collectors.kubernetes_pods import PodDirectory, PodInfo

log = logging.getLogger(__name__)
Record = dict[str, Any]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
SCHEDULER = "kubernetes"


@dataclass(frozen=True)
class ContainerGpus:
    namespace: str
    pod: str
    container: str
    devices: tuple[str, ...]  # device ids as the kubelet gives them (UUIDs or indices)


@dataclass(frozen=True)
class PodIdentity:
    """What identity stamps on a pod's processes."""

    job: str
    labels: dict[str, str] = field(default_factory=dict)


def is_gpu_resource(name: str, prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES) -> bool:
    return any(name.startswith(p) for p in prefixes)


class PodResourcesClient:
    """The two PodResources calls over the kubelet's unix socket (a real gRPC channel)."""

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET, *, timeout_s: float = 2.0):
        self.socket_path = str(socket_path)
        self.timeout_s = timeout_s
        self._channel: Any = None  # grpc.Channel, once connected
        self._stub: Any = None

    def _lister(self) -> tuple[Any, Any]:
        """The stub and the message module. gRPC and protobuf are imported here, on first use:
        every process importing agent.collectors (each `proof-agent exec` of a job) would
        otherwise load them (~0.1 s, ~20 MiB) for a node that may not even run Kubernetes."""
        import grpc

        from agent.collectors import kubernetes_podresources_pb2 as pb
        from agent.collectors import kubernetes_podresources_pb2_grpc as pb_grpc

        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub, pb

    def list_gpus(self, prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES) -> list[ContainerGpus]:
        """Every container holding GPUs; raises grpc.RpcError when the kubelet does not answer."""
        prefixes = tuple(prefixes)
        stub, pb = self._lister()
        resp = stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        out = []
        for pod in resp.pod_resources:
            for container in pod.containers:
                devices = [
                    d
                    for dev in container.devices
                    if is_gpu_resource(dev.resource_name, prefixes)
                    for d in dev.device_ids
                ]
                if devices:
                    out.append(
                        ContainerGpus(pod.namespace, pod.name, container.name, tuple(devices))
                    )
        return out

    def allocatable_gpus(self, prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES) -> list[str]:
        """The node's allocatable GPU device ids (GetAllocatableResources)."""
        prefixes = tuple(prefixes)
        stub, pb = self._lister()
        resp = stub.GetAllocatableResources(
            pb.AllocatableResourcesRequest(), timeout=self.timeout_s
        )
        return [
            d
            for dev in resp.devices
            if is_gpu_resource(dev.resource_name, prefixes)
            for d in dev.device_ids
        ]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None


class KubernetesCollector:
    """GPU → pod/namespace/container → job, from PodResources and a PodDirectory."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        socket_path: str | Path = DEFAULT_SOCKET,
        pods: PodDirectory | None = None,
        gpu_uuid: Callable[[int], str | None] | None = None,
        resource_prefixes: Iterable[str] = GPU_RESOURCE_PREFIXES,
        refresh_s: float = 10.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.client = PodResourcesClient(socket_path, timeout_s=timeout_s)
        self.pods = pods or PodDirectory([])
        self.gpu_uuid = gpu_uuid or (lambda _index: None)
        self.prefixes = tuple(resource_prefixes)
        self.refresh_s = refresh_s
        self.allocatable: list[str] | None = None
        self.containers: list[ContainerGpus] = []
        self._last: float | None = None
        self._warned = False
        self._jobs: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}  # job -> gpus here
        self._by_device: dict[str, tuple[ContainerGpus, str]] = {}  # gpu uuid -> (container, job)

    @property
    def available(self) -> bool:
        return self.allocatable is not None

    # --- lookups for identity ----------------------------------------------------------------

    def pod_info(self, namespace: str, pod: str) -> PodInfo | None:
        return self.pods.by_name(namespace, pod)

    def lookup(self, pod_uid: str, gpus: Iterable[str] = ()) -> PodIdentity | None:
        """The job and labels of a process in pod `pod_uid` using `gpus` (UUIDs); None when
        the pod is not known (identity then keys it by the pod uid alone)."""
        info = self.pods.by_uid(pod_uid)
        if info is None:
            self.pods.refresh(self._last or 0.0, force=True)  # a pod newer than the last refresh
            info = self.pods.by_uid(pod_uid)
        if info is None:
            return None
        container = None
        for uuid in gpus:
            held = self._by_device.get(uuid)
            if held is not None and (held[0].namespace, held[0].pod) == (info.namespace, info.name):
                container = held[0].container
                break
        return PodIdentity(info.job_id(), info.process_labels(container))

    def gpu_jobs(self) -> dict[str, str]:
        """GPU UUID → the job its pod belongs to (allocated GPUs only)."""
        return {uuid: job for uuid, (_c, job) in self._by_device.items()}

    # --- collection --------------------------------------------------------------------------

    def _unavailable(self, why: str, *, expected: bool = False) -> list[Record]:
        """Logged once: at info when there is simply no kubelet (a Slurm or bare node), as a
        warning when one is there and does not answer."""
        if not self._warned:
            self._warned = True
            log.log(
                logging.INFO if expected else logging.WARNING,
                "kubernetes identity unavailable: %s",
                why,
            )
        self.allocatable = None
        return []

    def collect(self, now: float) -> list[Record]:
        if self._last is not None and now - self._last < self.refresh_s:
            return []
        self._last = now
        if not self.socket_path.exists():
            return self._unavailable(
                f"no kubelet PodResources socket at {self.socket_path} (not a Kubernetes node, "
                "or the host path is not mounted)",
                expected=True,
            )
        try:
            if self.allocatable is None:
                self.allocatable = self.client.allocatable_gpus(self.prefixes)
            containers = self.client.list_gpus(self.prefixes)
        except Exception as exc:  # grpc.RpcError (imported lazily, see _lister)
            code_of = getattr(exc, "code", None)
            code = code_of() if callable(code_of) else exc
            return self._unavailable(f"PodResources at {self.socket_path}: {code}")
        if self._warned:
            self._warned = False
            log.info("kubernetes identity: PodResources at %s answers", self.socket_path)
        self.containers = containers
        self.pods.refresh(now)
        return self._update(containers, now)

    def _device_uuid(self, device: str) -> tuple[str | None, int | None]:
        if device.isdigit():
            index = int(device)
            return self.gpu_uuid(index), index
        return device, None

    def _update(self, containers: list[ContainerGpus], now: float) -> list[Record]:
        jobs: dict[str, tuple[list[str], list[int]]] = {}
        by_device: dict[str, tuple[ContainerGpus, str]] = {}
        described: dict[str, PodInfo | None] = {}
        namespaces: dict[str, str] = {}
        for held in containers:
            info = self.pods.by_name(held.namespace, held.pod)
            job = info.job_id() if info is not None else f"k8s-{held.namespace}-pod-{held.pod}"
            described.setdefault(job, info)
            namespaces[job] = held.namespace
            uuids, indices = jobs.setdefault(job, ([], []))
            for device in held.devices:
                uuid, index = self._device_uuid(device)
                if uuid is not None:
                    uuids.append(uuid)
                    by_device[uuid] = (held, job)
                elif index is not None:
                    indices.append(index)
        self._by_device = by_device
        out: list[Record] = []
        current = {job: (tuple(sorted(u)), tuple(sorted(i))) for job, (u, i) in jobs.items()}
        for job, gpus in current.items():
            if self._jobs.get(job) != gpus:
                out.append(self._job_record(job, now, namespaces[job], described[job], gpus))
        for job in self._jobs.keys() - current.keys():
            out.append(
                {
                    "type": "job",
                    "ts": now,
                    "job": job,
                    "scheduler": SCHEDULER,
                    "allocation": {"gpus": [], "gpu_indices": []},
                }
            )
        self._jobs = current
        return out

    def _job_record(
        self,
        job: str,
        now: float,
        namespace: str,
        info: PodInfo | None,
        gpus: tuple[tuple[str, ...], tuple[int, ...]],
    ) -> Record:
        rec: Record = {
            "type": "job",
            "ts": now,
            "job": job,
            "scheduler": SCHEDULER,
            "state": "running",
            "k8s_namespace": namespace,
            "allocation": {"gpus": list(gpus[0]), "gpu_indices": list(gpus[1])},
        }
        if info is not None:
            owner = info.owner()
            rec["name"] = owner.name
            # Job-level facts only: every node's agent sends this record, and a job's config
            # is replaced by the last one ingest receives.
            rec["config"] = {"k8s_namespace": namespace, "k8s_owner": f"{owner.kind}/{owner.name}"}
        return rec

    def close(self) -> None:
        self.client.close()


def socket_readable(path: str | Path) -> tuple[bool, str]:
    """For doctor: is the PodResources socket there and ours to open?"""
    p = Path(path)
    if not p.exists():
        return False, f"no socket at {p}"
    if not os.access(p, os.R_OK | os.W_OK):
        return False, f"{p} is not readable and writable by this user (run as root)"
    return True, str(p)
