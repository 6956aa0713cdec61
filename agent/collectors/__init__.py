"""The agent's collectors: each turns one node source into trace-v1 records (docs/design.md §5).

A collector implements `collect(now: float) -> list[record]`; every OS touchpoint is a
constructor argument, and a source that cannot be read is logged once and yields nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.collectors.dcgm import DcgmCollector
from agent.collectors.identity import IdentityCollector
from agent.collectors.inbox import InboxCollector
from agent.collectors.kubernetes import KubernetesCollector
from agent.collectors.kubernetes_pods import PodDirectory, PodListSource, PodLogDirSource, PodSource
from agent.collectors.nvml import NvmlCollector
from agent.collectors.slurm import SlurmJobs

if TYPE_CHECKING:
    from agent.config import AgentConfig


def gpu_node_collectors(cfg: AgentConfig, node: str, *, nvml: Any = None) -> list[Any]:
    """The GPU, identity and job-output collectors of a real node, from the config.

    NVML (the real `pynvml` unless `nvml` is given, e.g. a `SimulatedNvml`), identity (PID →
    job/rank from /proc, fed by NVML's PID → GPU map; Slurm job records when enabled), DCGM
    through its bindings (`[dcgm] mode = "bindings"`) and the `proof-agent exec` inbox. Each
    collector reports its own unavailability and returns nothing; none raises here. The
    dcgm-exporter, eBPF, kernel-log, InfiniBand, storage, host, log-tail and inference
    collectors are built by their own modules.
    """
    out: list[Any] = []
    nvml_collector: NvmlCollector | None = None
    if cfg.nvml.enabled:
        if nvml is None:
            try:
                import pynvml as real_nvml  # optional hardware library: absent off GPU nodes

                nvml = real_nvml
            except ImportError:
                nvml = None
        if nvml is not None:
            nvml_collector = NvmlCollector(nvml, node=node)
            out.append(nvml_collector)

    def uuid_of(index: int) -> str | None:
        if nvml_collector is None:
            return None
        for ref in nvml_collector.gpus:
            if ref.index == index:
                return ref.uuid
        return None

    kubernetes = kubernetes_collector(cfg, uuid_of) if cfg.kubernetes.enabled else None
    if kubernetes is not None:
        out.append(kubernetes)
    out.append(
        IdentityCollector(
            node=node,
            proc_root=cfg.paths.proc_root,
            gpu_pids=nvml_collector.pid_gpus if nvml_collector is not None else None,
            slurm=SlurmJobs() if cfg.slurm.enabled else None,
            pods=kubernetes.lookup if kubernetes is not None else None,
        )
    )
    if cfg.dcgm.mode == "bindings":
        out.append(
            DcgmCollector(
                node=node,
                host=cfg.dcgm.host,
                bindings_paths=[cfg.dcgm.bindings_path],
                gpu_uuid=uuid_of,
            )
        )
    out.append(InboxCollector(Path(cfg.spool.dir).parent / "inbox"))
    return out


def kubernetes_collector(
    cfg: AgentConfig, gpu_uuid: Callable[[int], str | None]
) -> KubernetesCollector:
    """The Kubernetes identity collector from `[kubernetes]`: the pod list URL when set, then
    the pod log directories (docs/agent.md, "Kubernetes identity")."""
    k = cfg.kubernetes
    sources: list[PodSource] = []
    if k.pods_url:
        sources.append(
            PodListSource(k.pods_url, token_file=k.token_file or None, ca_file=k.ca_file or None)
        )
    sources.append(PodLogDirSource(k.pod_log_dir))
    return KubernetesCollector(
        socket_path=k.pod_resources_socket,
        pods=PodDirectory(sources, refresh_s=k.refresh_s),
        gpu_uuid=gpu_uuid,
        refresh_s=k.refresh_s,
    )
