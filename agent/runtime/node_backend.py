"""The real-node backend of `proof-agent run` / `record`: every collector the config enables.

    backend = NodeBackend.from_config(load_config("/etc/proof-agent/proof-agent.toml"))
    Agent(backend.collectors, sink, node=backend.node).run()

Assembled here: the GPU, identity, DCGM-bindings and exec-inbox collectors
(`gpu_node_collectors`), the eBPF uprobes and fd 1/2 output capture (when BPF loads here; else
the doctor's reason is logged once and they are left out), dcgm-exporter (`[dcgm] mode =
"exporter"`), inference servers, InfiniBand, storage, the kernel log (XIDs keyed to a GPU
through NVML's PCI bus ids), host CPU/memory and the log tail (configured globs, plus each
Slurm job's StdOut/StdErr once its job record is seen). Every OS touchpoint comes from the
config (roots, paths, URLs) or is injectable (`nvml`, `fetch`, `ebpf_status`), so tests run it
on fixture trees and the simulated NVML. A source that cannot be read is reported once by its
collector; the others keep going.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.collectors import gpu_node_collectors
from agent.collectors.dcgm_exporter import DcgmExporterCollector
from agent.collectors.host import HostCollector
from agent.collectors.inference import InferenceCollector, InferenceServer
from agent.collectors.infiniband import InfinibandCollector
from agent.collectors.kmsg import KmsgCollector
from agent.collectors.logtail import STDERR, STDOUT, LogTailCollector, TailSpec
from agent.collectors.storage import StorageCollector
from agent.config import DEFAULT_PATHS, AgentConfig
from agent.ebpf.node import build_collectors
from agent.runtime.base import Record
from contract.parsers.kernel import normalize_pci

log = logging.getLogger(__name__)

EbpfStatus = Callable[[], tuple[bool, str]]


class JobOutputFollower:
    """Wraps the identity collector: when a Slurm job record with StdOut/StdErr paths passes
    through, the log tail starts following those files (keyed to the job)."""

    def __init__(self, identity: Any, logtail: Any) -> None:
        self.inner = identity
        self.name = identity.name
        self.logtail = logtail
        self.following: set[tuple[str, str]] = set()

    def collect(self, now: float) -> list[Record]:
        out: list[Record] = self.inner.collect(now)
        for rec in out:
            if rec.get("type") != "job":
                continue
            config = rec.get("config") or {}
            job = str(rec.get("job"))
            for key, stream in (("stdout", STDOUT), ("stderr", STDERR)):
                path = config.get(key)
                if not path or (job, path) in self.following:
                    continue
                if key == "stderr" and path == config.get("stdout"):
                    continue  # one file for both streams: follow it once
                self.following.add((job, path))
                log.info("following job %s %s: %s", job, key, path)
                self.logtail.add(TailSpec(path, stream=stream, job=job))
        return out

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()

    def __getattr__(self, attr: str) -> Any:  # identity lookups (identity_of, …) pass through
        return getattr(self.inner, attr)


def _ebpf_collectors(cfg: AgentConfig, node: str) -> list[Any]:
    return build_collectors(
        node=node,
        proc_root=cfg.paths.proc_root,
        capture_output=cfg.ebpf.capture_output,
        probe_groups=tuple(cfg.ebpf.probe_groups) or None,
    )


def _pci_lookup(nvml: Any, nvml_collector: Any) -> Callable[[str], str | None]:
    """PCI bus id → GPU UUID, from NVML (built on first use, after NVML started)."""
    cache: dict[str, str] = {}
    built = False

    def lookup(bus: str) -> str | None:
        nonlocal built
        if not built and nvml_collector is not None and nvml_collector.available:
            built = True
            for ref in nvml_collector.gpus:
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(ref.index)
                    bus_id = nvml.nvmlDeviceGetPciInfo(handle).busId
                except Exception as exc:  # NVMLError, or a binding without PCI info
                    log.info("no PCI bus id for GPU %s: %s", ref.index, exc)
                    continue
                if isinstance(bus_id, bytes):
                    bus_id = bus_id.decode("ascii", "replace")
                cache[normalize_pci(str(bus_id))] = ref.uuid
        return cache.get(normalize_pci(bus))

    return lookup


@dataclass
class NodeBackend:
    collectors: list[Any]
    node: str
    nvml: Any = None  # the NvmlCollector, when NVML is enabled
    logtail: Any = None
    ebpf_reason: str | None = None  # why the eBPF collectors were left out
    names: list[str] = field(default_factory=list)

    def node_facts(self) -> dict[str, Any]:
        """Registration facts: node, driver/CUDA version, GPUs (uuid, index, model, memory)."""
        if self.nvml is None:
            return {"node": self.node, "gpus": []}
        facts = self.nvml.node_facts()
        gpus = []
        for g in facts.get("gpus") or []:
            gpu = {k: g[k] for k in ("uuid", "index", "model") if g.get(k) is not None}
            if g.get("memory_mib") is not None:
                gpu["memory_mib"] = int(g["memory_mib"])
            for key in ("driver_version", "cuda_version"):
                if facts.get(key):
                    gpu[key] = str(facts[key])
            gpus.append(gpu)
        return {**facts, "node": self.node, "gpus": gpus}

    @classmethod
    def from_config(
        cls,
        cfg: AgentConfig,
        *,
        node: str | None = None,
        nvml: Any = None,
        fetch: Any = None,
        ebpf_status: EbpfStatus | None = None,
    ) -> NodeBackend:
        node = node or cfg.agent.node or socket.gethostname()
        paths = cfg.paths
        proc = paths.proc_root
        http: dict[str, Any] = {} if fetch is None else {"fetch": fetch}
        if nvml is None and cfg.nvml.enabled:
            try:
                import pynvml  # optional hardware library (nvidia-ml-py): absent off GPU nodes

                nvml = pynvml
            except ImportError as exc:
                log.warning("NVML unavailable: nvidia-ml-py is not installed (%s)", exc)
        collectors: list[Any] = []
        nvml_collector = None
        logtail = LogTailCollector([TailSpec(g) for g in cfg.logs.globs])
        for c in gpu_node_collectors(cfg, node, nvml=nvml):
            if c.name == "nvml":
                nvml_collector = c
            if c.name == "identity" and cfg.logs.slurm_output:
                c = JobOutputFollower(c, logtail)
            collectors.append(c)

        ebpf_reason = None
        if not cfg.ebpf.enabled:
            ebpf_reason = "[ebpf] enabled = false"
        elif ebpf_status is not None:  # injected check (tests)
            ok, why = ebpf_status()
            if ok:
                collectors.extend(_ebpf_collectors(cfg, node))
            else:
                ebpf_reason = why
        else:
            # Load the probes now (bcc compiles in a short-lived child process, so the agent
            # does not carry LLVM's memory); a node where BPF cannot load runs without them.
            try:
                probes = _ebpf_collectors(cfg, node)
                ok = bool(probes[0].start())
                why = probes[0].unavailable_reason or "the probes did not load"
            except Exception as exc:  # bcc missing or broken must not stop the agent
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if ok:
                collectors.extend(probes)
            else:
                ebpf_reason = why
        if ebpf_reason is not None and cfg.ebpf.enabled:
            log.warning("eBPF collectors off: %s", ebpf_reason)

        if cfg.dcgm.mode == "exporter":
            collectors.append(DcgmExporterCollector(cfg.dcgm.exporter_url, node=node, **http))
        if cfg.inference.discover or cfg.inference.endpoints:
            collectors.append(
                InferenceCollector(
                    node=node,
                    proc_root=proc,
                    endpoints=[InferenceServer.from_url(u) for u in cfg.inference.endpoints],
                    discover_processes=cfg.inference.discover,
                    **http,
                )
            )
        collectors.append(InfinibandCollector(paths.sys_root))

        def under_proc(value: str, key: str) -> str:
            # The default /proc/... paths follow a relocated proc_root (a container's /host/proc).
            default = DEFAULT_PATHS[key]
            if value == default and proc != "/proc":
                return str(Path(proc) / Path(default).relative_to("/proc"))
            return value

        collectors.append(
            StorageCollector(
                proc,
                mountstats_path=under_proc(paths.mountstats, "mountstats"),
                diskstats_path=under_proc(paths.diskstats, "diskstats"),
            )
        )
        collectors.append(
            KmsgCollector(paths.kmsg, pci_to_gpu=_pci_lookup(nvml, nvml_collector), proc_root=proc)
        )
        collectors.append(HostCollector(proc))
        collectors.append(logtail)
        return cls(
            collectors=collectors,
            node=node,
            nvml=nvml_collector,
            logtail=logtail,
            ebpf_reason=ebpf_reason,
            names=[c.name for c in collectors],
        )
