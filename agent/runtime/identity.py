"""Identity at collection time (docs/design.md §3): key every record before it leaves the agent.

Collectors know only what their source knows: eBPF knows a pid, NVML a GPU, a log tail a pid.
`process` records (from NVML's running-process list joined with /proc/<pid>/environ, or the
simulator) say which job, rank, local rank, world size and GPU a pid belongs to; the join keeps
that map and fills the missing keys on every record that carries a pid or a GPU:

- a record with a `pid` gets the pid's `job`, `rank`, `local_rank`, `gpu`, `gpu_index`;
- a GPU record (`gpu` or `gpu_index`, no pid) gets the `job`, `rank`, `local_rank` of the
  processes on that GPU, for each key only when they all agree (two jobs sharing a GPU leave it
  unkeyed rather than wrongly keyed), and its missing `gpu`/`gpu_index` twin;
- every record without a `node` gets the agent's node.

A GPU no process is using yet takes its job from the scheduler's allocation: a `job` record
with the local `allocation` key (`{"gpus": [uuid, …], "gpu_indices": [index, …]}`, from the
Slurm prolog through the inbox or the Kubernetes collector) gives that job's GPUs on the
record's node, replacing what it said before; empty lists end it (the epilog, the pod gone).
So an idle or stuck job's GPUs are keyed before its first process or log line. Processes on a
GPU take precedence over its allocation.

Keys a record already has are never overwritten. `step` is not filled: it belongs to the log
line or sample that reported it. A pid's entry outlives its `exit` record by `exit_grace_s`,
because the last interval's eBPF readings for it may still be on their way.

Pids and GPU indices are per node, so the maps are keyed by (node, pid) and (node, index): one
join can serve records of several nodes (the simulated cluster played through one agent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent.runtime.base import Record
from contract import signals
from contract.trace.records import TYPE_EXIT, TYPE_JOB, TYPE_PROCESS

_PID_KEYS: tuple[str, ...] = (
    signals.JOB,
    signals.RANK,
    signals.LOCAL_RANK,
    signals.GPU,
    signals.GPU_INDEX,
)
_GPU_KEYS: tuple[str, ...] = (signals.JOB, signals.RANK, signals.LOCAL_RANK)
_PROCESS_FACTS: tuple[str, ...] = (*_PID_KEYS, "world_size")
_UNSET = object()


class IdentityJoin:
    def __init__(self, node: str | None = None, *, exit_grace_s: float = 30.0) -> None:
        self.node = node
        self.exit_grace_s = exit_grace_s
        self._pids: dict[tuple[str | None, int], dict[str, Any]] = {}
        self._gpu_index: dict[str, int] = {}  # uuid -> index (UUIDs are globally unique)
        self._gpu_uuid: dict[tuple[str | None, int], str] = {}  # (node, index) -> uuid
        self._gpu_ident: dict[str, dict[str, Any]] | None = None  # uuid -> agreed keys
        self._expiry: dict[tuple[str | None, int], float] = {}  # (node, pid) -> forget at
        # (node, job) -> its allocated GPUs there, as UUIDs and as indices
        self._allocations: dict[tuple[str | None, str], tuple[list[str], list[int]]] = {}
        self.filled = 0  # keys filled in, for the agent's stats

    # --- what the join knows ----------------------------------------------------------------

    def identity_of(self, pid: int, node: str | None = None) -> dict[str, Any] | None:
        """What is known about `pid` (job, rank, local_rank, world_size, gpu, gpu_index)."""
        ident = self._pids.get((node if node is not None else self.node, pid))
        return dict(ident) if ident is not None else None

    def known_pids(self) -> list[int]:
        return sorted(pid for _node, pid in self._pids)

    def learn_gpu(self, uuid: str, index: int, node: str | None = None) -> None:
        """Tell the join a GPU's index (collectors learn it from NVML before any sample)."""
        node = node if node is not None else self.node
        if self._gpu_index.get(uuid) != index or self._gpu_uuid.get((node, index)) != uuid:
            self._gpu_index[uuid] = index
            self._gpu_uuid[(node, index)] = uuid
            self._gpu_ident = None

    def _observe_process(self, rec: Record) -> None:
        pid = rec[signals.PID]
        key = (rec.get(signals.NODE), pid)
        ident = self._pids.setdefault(key, {})
        for fact in _PROCESS_FACTS:
            value = rec.get(fact)
            if value is not None:
                ident[fact] = value
        self._expiry.pop(key, None)
        self._gpu_ident = None

    def _observe_allocation(self, rec: Record) -> None:
        alloc = rec.get("allocation")
        job = rec.get(signals.JOB)
        if not isinstance(alloc, dict) or not isinstance(job, str):
            return
        uuids = [u for u in alloc.get("gpus") or () if isinstance(u, str)]
        indices = [i for i in alloc.get("gpu_indices") or () if type(i) is int and i >= 0]
        key = (rec.get(signals.NODE), job)
        if uuids or indices:
            self._allocations[key] = (uuids, indices)
        else:
            self._allocations.pop(key, None)
        self._gpu_ident = None

    def allocations(self) -> dict[tuple[str | None, str], tuple[list[str], list[int]]]:
        """(node, job) → the GPUs (UUIDs, indices) its scheduler allocated there."""
        return dict(self._allocations)

    def _allocated(self) -> dict[str, dict[str, Any]]:
        """GPU UUID → {job}, from the allocations (a GPU two jobs claim is left out)."""
        out: dict[str, dict[str, Any]] = {}
        claimed: dict[str, set[str]] = {}
        for (node, job), (uuids, indices) in self._allocations.items():
            found = list(uuids)
            for index in indices:
                uuid = self._gpu_uuid.get((node, index))
                if uuid is not None:
                    found.append(uuid)
            for uuid in found:
                claimed.setdefault(uuid, set()).add(job)
        for uuid, jobs in claimed.items():
            if len(jobs) == 1:
                out[uuid] = {signals.JOB: next(iter(jobs))}
        return out

    def _gpu_agreement(self) -> dict[str, dict[str, Any]]:
        if self._gpu_ident is None:
            by_gpu: dict[str, dict[str, Any]] = {}
            for (node, _pid), ident in self._pids.items():
                uuid = ident.get(signals.GPU)
                if uuid is None:
                    index = ident.get(signals.GPU_INDEX)
                    uuid = self._gpu_uuid.get((node, index)) if index is not None else None
                if uuid is None:
                    continue
                agreed = by_gpu.setdefault(uuid, {})
                for key in _GPU_KEYS:
                    value = ident.get(key, _UNSET)
                    if key not in agreed:
                        agreed[key] = value
                    elif agreed[key] != value:
                        agreed[key] = _UNSET
            self._gpu_ident = {
                uuid: {k: v for k, v in agreed.items() if v is not _UNSET and v is not None}
                for uuid, agreed in by_gpu.items()
            }
            if self._allocations:
                for uuid, keys in self._allocated().items():
                    self._gpu_ident.setdefault(uuid, keys)
        return self._gpu_ident

    # --- the join ----------------------------------------------------------------------------

    def apply(self, records: Iterable[Record], now: float | None = None) -> None:
        """Fill identity keys on `records` in place (process records first teach the map)."""
        node = self.node
        filled = 0
        for rec in records:
            rtype = rec.get("type")
            if node is not None and signals.NODE not in rec:
                rec[signals.NODE] = node
            if rtype == TYPE_PROCESS:
                self._observe_process(rec)
            elif rtype == TYPE_JOB and "allocation" in rec:
                self._observe_allocation(rec)
            pid = rec.get(signals.PID)
            rnode = rec.get(signals.NODE)
            if pid is not None:
                pkey = (rnode, pid)
                ident = self._pids.get(pkey)
                if ident is not None:
                    filled += _fill_missing(rec, ident, _PID_KEYS)
                # A process seen gone without an exit code (identity collector) ends too.
                ended = rtype == TYPE_EXIT or (
                    rtype == "event" and rec.get("name") == signals.EVENT_PROCESS_GONE
                )
                if ended and ident is not None:
                    self._expiry[pkey] = float(rec.get("ts", now or 0.0)) + self.exit_grace_s
            gpu = rec.get(signals.GPU)
            index = rec.get(signals.GPU_INDEX)
            if gpu is not None:
                if index is None:
                    index = self._gpu_index.get(gpu)
                    if index is not None:
                        rec[signals.GPU_INDEX] = index
                        filled += 1
                elif self._gpu_index.get(gpu) != index:
                    self.learn_gpu(gpu, index, rnode)
            elif index is not None:
                gpu = self._gpu_uuid.get((rnode, index))
                if gpu is not None:
                    rec[signals.GPU] = gpu
                    filled += 1
            if gpu is not None and pid is None:
                agreed = self._gpu_agreement().get(gpu)
                if agreed:
                    filled += _fill_missing(rec, agreed, agreed)
        self.filled += filled
        if self._expiry and now is not None:
            self._forget_exited(now)

    def _forget_exited(self, now: float) -> None:
        gone = [key for key, when in self._expiry.items() if when <= now]
        for key in gone:
            del self._expiry[key]
            self._pids.pop(key, None)
        if gone:
            self._gpu_ident = None


def _fill_missing(rec: Record, source: Mapping[str, Any], keys: Iterable[str]) -> int:
    """Copy `keys` the record lacks from `source` (None values are not copied); how many."""
    filled = 0
    for key in keys:
        if key not in rec:
            value = source.get(key)
            if value is not None:
                rec[key] = value
                filled += 1
    return filled
