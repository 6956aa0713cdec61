"""The `sim` backend: a simulated run played to the agent as its collectors would have read it.

The simulator (`simulator.simulate`) produces a whole run's records in ts order. `SimBackend`
releases them as the agent's clock passes their `ts`, routed to one collector per source the
real agent has (NVML, DCGM profiling, eBPF, process table, scheduler, job logs, node counters,
inference servers), so they flow through the real `Agent` loop, `IdentityJoin` and sink.

To make the join do its real work, identity a collector could not have known is taken off
before release (`strip_identity=True`): an eBPF or log record knows only its pid, so its job,
rank, local rank and GPU are removed when the process table already says the same, and a GPU
reading loses the job/rank of the single process on that GPU. The join must put them back;
records whose identity the join could not restore are left as the simulator wrote them.

`dcgm_fields=True` replaces the recorded DCGM profiling samples with the real `DcgmCollector`
reading a simulated host engine (agent.collectors.dcgm_sim) built from the node's simulated
hardware arrays: the whole contract.dcgm_fields table (docs/dcgm-fields.md), per-link NVLink,
field groups and the NOT_SUPPORTED skip path included, in the shape a GPU node produces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

import simulator
from agent.collectors.dcgm import DcgmCollector
from agent.collectors.dcgm_sim import SimulatedDcgm
from agent.runtime.base import Record
from contract import signals
from contract.names import prefixed
from contract.trace.records import (
    TYPE_EVENT,
    TYPE_EXIT,
    TYPE_JOB,
    TYPE_LOG,
    TYPE_PROCESS,
    TYPE_SAMPLE,
)
from simulator.dcgm_fields import SimDcgmGpu
from simulator.hardware import H100_SXM, spec_named

# One per collector the real agent has, declared in the order the agent polls them: SOURCES is
# collected from these lines.
SOURCE_PROCESSES = "sim.processes"
SOURCE_SCHEDULER = "sim.scheduler"
SOURCE_NVML = "sim.nvml"
SOURCE_DCGM = "sim.dcgm"
SOURCE_EBPF = "sim.ebpf"
SOURCE_LOGS = "sim.logs"
SOURCE_NODE = "sim.node"
SOURCE_INFERENCE = "sim.inference"
SOURCES: tuple[str, ...] = prefixed(globals(), "SOURCE_")
_GPU_EVENTS = frozenset(
    (signals.EVENT_XID, signals.EVENT_ECC_DBE, signals.EVENT_THROTTLE, signals.EVENT_GPU_LOST)
)
_PID_STRIP: tuple[str, ...] = (
    signals.JOB,
    signals.RANK,
    signals.LOCAL_RANK,
    signals.GPU,
    signals.GPU_INDEX,
)
_GPU_STRIP: tuple[str, ...] = (signals.JOB, signals.RANK, signals.LOCAL_RANK)
_AMBIGUOUS: dict[str, Any] = {}


class SimRunLike(Protocol):
    """What the backend needs of `simulator.SimRun`."""

    meta: dict[str, Any]

    def records(self) -> Iterator[dict[str, Any]]: ...


SimulateFn = Callable[..., SimRunLike]


def source_of(rec: Record) -> str:
    """Which of the agent's collectors would have read this record."""
    rtype = rec.get("type")
    if rtype == TYPE_SAMPLE:
        name: str = rec["name"]
        if name.startswith(signals.DCGM_PROF_PREFIX):
            return SOURCE_DCGM
        if name.startswith(signals.DCGM_PREFIX):
            return SOURCE_NVML
        if name.startswith(signals.INFERENCE_PREFIXES):
            return SOURCE_INFERENCE
        if signals.PID in rec:
            return SOURCE_EBPF
        return SOURCE_NODE
    if rtype == TYPE_LOG:
        return SOURCE_LOGS
    if rtype in (TYPE_PROCESS, TYPE_EXIT):
        return SOURCE_PROCESSES
    if rtype == TYPE_JOB:
        return SOURCE_SCHEDULER
    if rtype == TYPE_EVENT and rec.get("name") in _GPU_EVENTS:
        return SOURCE_NVML
    return SOURCE_NODE


class SimFeed:
    """Pulls a run's records in ts order and hands each source its share as time passes."""

    def __init__(
        self,
        records: Iterable[Record],
        *,
        nodes: Iterable[str] | None = None,
        strip_identity: bool = True,
    ) -> None:
        self._it = iter(records)
        self._next: Record | None = None
        self._done = False
        self.nodes = frozenset(nodes) if nodes is not None else None
        self.strip_identity = strip_identity
        self._queues: dict[str, list[Record]] = {s: [] for s in SOURCES}
        self._pids: dict[tuple[str | None, int], dict[str, Any]] = {}
        self._gpus: dict[tuple[str | None, str], dict[str, Any]] = {}
        self.released = 0
        self.last_ts: float | None = None

    @property
    def exhausted(self) -> bool:
        return self._done and self._next is None

    def _pull(self) -> Record | None:
        if self._next is None and not self._done:
            self._next = next(self._it, None)
            if self._next is None:
                self._done = True
        return self._next

    def release(self, now: float) -> None:
        """Route every record stamped at or before `now` to its source's queue."""
        nodes = self.nodes
        while True:
            rec = self._pull()
            if rec is None or rec["ts"] > now:
                return
            self._next = None
            self.last_ts = rec["ts"]
            node = rec.get(signals.NODE)
            if nodes is not None and node is not None and node not in nodes:
                continue
            rec = dict(rec)  # the run's records may be shared; the agent mutates its own
            if rec.get("type") == TYPE_PROCESS:
                self._observe_process(rec)
            self._queues[source_of(rec)].append(rec)
            self.released += 1

    def _observe_process(self, rec: Record) -> None:
        node = rec.get(signals.NODE)
        ident = {k: rec[k] for k in _PID_STRIP if k in rec}
        self._pids[(node, rec[signals.PID])] = ident
        gpu = ident.get(signals.GPU)
        if gpu is not None:
            gkey = (node, gpu)
            known = self._gpus.get(gkey)
            mine = {k: ident[k] for k in _GPU_STRIP if k in ident}
            if known is None:
                self._gpus[gkey] = mine
            elif known is not _AMBIGUOUS and known != mine:
                self._gpus[gkey] = _AMBIGUOUS  # shared GPU: the join will not guess

    def _strip(self, rec: Record) -> None:
        """Take off the identity the record's collector could not have known (see module doc).

        Runs when a collector takes its records, after everything up to `now` was released,
        so a process record stamped at the same instant as the first readings is known."""
        rtype = rec.get("type")
        if rtype in (TYPE_PROCESS, TYPE_EXIT, TYPE_JOB):
            return
        node = rec.get(signals.NODE)
        pid = rec.get(signals.PID)
        if pid is not None:
            _drop_known(rec, _PID_STRIP, self._pids.get((node, pid)))
            return
        gpu = rec.get(signals.GPU)
        if gpu is not None:
            _drop_known(rec, _GPU_STRIP, self._gpus.get((node, gpu)))

    def take(self, source: str) -> list[Record]:
        queue = self._queues[source]
        if not queue:
            return []
        self._queues[source] = []
        if self.strip_identity:
            for rec in queue:
                self._strip(rec)
        return queue


def _drop_known(rec: Record, keys: tuple[str, ...], known: Mapping[str, Any] | None) -> None:
    """Delete the `keys` of `rec` whose value is the one `known` has (the identity the join
    would add back); none when nothing is known."""
    if not known:
        return
    for key in keys:
        if key in rec and rec[key] == known.get(key):
            del rec[key]


class SimCollector:
    """One simulated source: what its real collector would have returned this interval."""

    def __init__(self, feed: SimFeed, source: str) -> None:
        self.feed = feed
        self.name = source

    def collect(self, now: float) -> list[Record]:
        self.feed.release(now)
        return self.feed.take(self.name)


class SimDcgmSource:
    """The `sim.dcgm` source played by the real DcgmCollector on a simulated host engine: the
    recorded profiling samples are drained and dropped (the collector reads the same
    quantities), the engine's clock follows the agent's."""

    def __init__(self, feed: SimFeed, run: SimRunLike, node: str) -> None:
        self.feed = feed
        self.name = SOURCE_DCGM
        ts = getattr(run, "ts", None)
        self._ts = np.asarray(ts if ts is not None else [], dtype=float)
        model = run.meta.get("gpu_model")
        try:
            spec = spec_named(str(model)) if model else H100_SXM
        except KeyError:
            spec = H100_SXM
        series = getattr(run, "series", None)
        per_gpu: dict[int, dict[str, Any]] = {}
        uuids: dict[int, str] = {}
        for name in signals.GPU_SIGNALS:
            for ident, values in series(name, node=node) if series is not None else ():
                index = ident.get(signals.GPU_INDEX)
                if index is None:
                    continue
                per_gpu.setdefault(int(index), {})[name] = values
                if ident.get(signals.GPU):
                    uuids[int(index)] = str(ident[signals.GPU])
        indices = sorted(per_gpu)
        gpus = [SimDcgmGpu(i, per_gpu[i], spec) for i in indices]
        self.engine = SimulatedDcgm(gpus, [uuids.get(i, f"GPU-sim-{i}") for i in indices])
        self.collector = DcgmCollector(
            node=node, bindings=self.engine.bindings(), gpu_uuid=lambda i: uuids.get(i)
        )

    def set_time(self, now: float) -> None:
        """Point the simulated host engine at the run's sample for agent time `now`."""
        n = len(self._ts)
        t = int(np.searchsorted(self._ts, now, side="right")) - 1 if n else 0
        self.engine.set_time(min(t, n - 1) if n else 0)

    def collect(self, now: float) -> list[Record]:
        self.feed.release(now)
        self.feed.take(SOURCE_DCGM)  # recorded profiling samples: the collector reads them
        self.set_time(now)
        return self.collector.collect(now)

    def close(self) -> None:
        self.collector.close()


class SimBackend:
    """A simulated run as the agent's collectors.

    `node` limits it to one node's records (an agent runs per node); None plays every node
    through one agent (the demo, `proof-agent record` of a whole simulated cluster).
    """

    def __init__(
        self,
        run: SimRunLike,
        *,
        node: str | None = None,
        start_ts: float,
        duration_s: float,
        strip_identity: bool = True,
        dcgm_fields: bool = False,
    ) -> None:
        self.run = run
        self.node = node
        self.start_ts = start_ts
        self.duration_s = duration_s
        self.feed = SimFeed(
            run.records(),
            nodes=None if node is None else (node,),
            strip_identity=strip_identity,
        )
        self._collectors: list[SimCollector | SimDcgmSource] = [
            SimCollector(self.feed, source) for source in SOURCES
        ]
        if dcgm_fields:
            if node is None:
                raise ValueError("dcgm_fields=True plays one node: give `node`")
            at = SOURCES.index(SOURCE_DCGM)
            self._collectors[at] = SimDcgmSource(self.feed, run, node)

    @classmethod
    def from_scenario(
        cls,
        scenario: str,
        *,
        seed: int,
        duration_s: float,
        start_ts: float,
        node: str | None = None,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        simulate: SimulateFn | None = None,
    ) -> SimBackend:
        if simulate is None:
            simulate = simulator.simulate
        run = simulate(
            scenario,
            seed=seed,
            duration_s=duration_s,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            start_ts=start_ts,
        )
        return cls(run, node=node, start_ts=start_ts, duration_s=duration_s)

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.duration_s

    def collectors(self) -> list[SimCollector | SimDcgmSource]:
        return list(self._collectors)

    def trace_meta(self) -> tuple[dict[str, Any], Any]:
        """(meta without truth, truth) for a trace of what this backend plays."""
        meta = {
            k: v
            for k, v in self.run.meta.items()
            if k not in ("type", "format", "version", "truth")
        }
        meta["backend"] = "sim"
        nodes = [self.node] if self.node is not None else list(self.run.meta.get("nodes") or [])
        if len(nodes) == 1:
            # One simulated node: the agent registers it with ingest as the node backend
            # registers a real one (hostname, GPUs and their model, as NVML names it).
            meta["node"] = nodes[0]
            meta["gpus"] = self.node_gpus(nodes[0])
        return meta, self.run.meta.get("truth")

    def node_gpus(self, node: str) -> list[dict[str, Any]]:
        """The simulated node's GPUs as the NVML collector reports them (uuid, index, model):
        those with a power reading in the run."""
        series = getattr(self.run, "series", None)
        if series is None:
            return []
        model = self.run.meta.get("gpu_model")
        found = {
            str(ident[signals.GPU]): ident.get(signals.GPU_INDEX)
            for ident, _ in series(signals.DCGM_FI_DEV_POWER_USAGE, node=node)
            if ident.get(signals.GPU)
        }
        return [
            {"uuid": uuid, "index": index, **({"model": model} if model else {})}
            for uuid, index in sorted(found.items(), key=lambda kv: (kv[1] is None, kv[1], kv[0]))
        ]
