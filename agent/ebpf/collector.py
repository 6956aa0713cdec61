"""The eBPF collector: uprobes on libcuda/libnccl, aggregated in the kernel, read per interval.

`collect(now)` does, once per agent interval:
1. every `rescan_interval_s`, looks through /proc/<pid>/maps for libcuda/libnccl files not yet
   probed and attaches to them by symbol name (agent.ebpf.calls.PROBES); a file that no process
   maps any more is detached;
2. flips the `control` slot, so the probes start writing the other half of the `stats` map,
   then reads and deletes the half they wrote during the interval — a read-and-clear that
   never races the probes' own increments;
3. turns the per-process aggregates into trace-v1 samples keyed by `pid` (and `node`): the
   docs/design.md §4 process series `cuda.launches`, `cuda.launch_gap_max_ms`, `cuda.sync_ms`,
   `nccl.calls`, `nccl.bytes` (`labels.op`), plus the extensions documented in docs/ebpf.md.
   The identity join (pid → job, rank, gpu) happens downstream.

A process that launched kernels before is reported every interval while it lives, with
`cuda.launches` 0 and `cuda.launch_gap_max_ms` growing, when it stops launching: that is how a
hung rank looks. The collector never raises out of `collect()`: if BPF cannot be loaded it logs
the reason once and returns nothing (see `unavailable_reason`).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent.collectors._common import Record, WarnOnce
from agent.ebpf import bpfsys, discovery
from agent.ebpf.calls import (
    API_LABELS,
    CUDA,
    CUDA_CALLS,
    MEMCPY_KINDS,
    NCCL_COLLECTIVES,
    NCCL_OP_LABELS,
    PROBE_GROUPS,
    PROBES,
    SYNC_CALLS,
    Call,
)
from agent.ebpf.loader import LoadedProgram, LoadsOnce, load_in_child
from contract import signals

log = logging.getLogger(__name__)

NS_PER_MS = 1_000_000.0


# Layouts of probes.c's map keys and values (struct stat_key, stat_val, inflight_*).
_STAT_KEY = struct.Struct("<IHH")  # pid, what, slot
_STAT_VAL = struct.Struct("<QQQQ")  # calls, total_ns, max_ns, bytes
_INFLIGHT_KEY = struct.Struct("<II")  # tid, what
_INFLIGHT_VAL = struct.Struct("<QQII")  # ts, bytes, pid, unused
_HIST_KEY = struct.Struct("<IHBB")  # pid, what, slot, bucket
_COLL_KEY = struct.Struct("<IHBBB3x")  # pid, what, slot, dtype, size bucket
_COLL_VAL = struct.Struct("<QQ")  # calls, total_ns
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(slots=True)
class Aggregate:
    """One call class of one process over one interval, summed over CPUs."""

    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0
    bytes: int = 0

    def add(self, calls: int, total_ns: int, max_ns: int, nbytes: int) -> None:
        self.calls += calls
        self.total_ns += total_ns
        self.max_ns = max(self.max_ns, max_ns)
        self.bytes += nbytes


@dataclass(slots=True)
class _Attached:
    path: str
    kind: str
    symbols: list[str] = field(default_factory=list)
    events: list[int] = field(default_factory=list)  # perf event fds, one per probe
    probes_attached: int = 0  # len(events) when attached; fewer once detaching has begun


class EbpfCollector(LoadsOnce[LoadedProgram]):
    """Per-process CUDA/NCCL call aggregates from kernel-side uprobes."""

    name = "ebpf"
    what = "ebpf collector"

    def __init__(
        self,
        *,
        proc_root: str = "/proc",
        node: str | None = None,
        pid_source: Callable[[], Iterable[int]] | None = None,
        rescan_interval_s: float = 5.0,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        bpf_loader: Callable[[], LoadedProgram] = load_in_child,
        settle_s: float = 0.001,
        probe_groups: Iterable[str] = PROBE_GROUPS,
        detach_grace_s: float = 60.0,
        detach_budget_s: float = 0.1,
        young_s: float = 60.0,
        idle_recheck_s: float = 60.0,
        histogram_every_s: float = 10.0,
    ) -> None:
        """`pid_source`, when given, limits library discovery to those processes (e.g. the
        GPU processes NVML lists); by default every process under `proc_root` is looked at.
        `monotonic_ns` must be CLOCK_MONOTONIC, the clock bpf_ktime_get_ns() reads.
        `settle_s` is how long a probe that read the slot number just before the flip may
        still be writing the old slot (a probe runs for ~1 µs; the margin is generous).
        `probe_groups` selects what is probed (calls.PROBE_GROUPS: launch, sync, memcpy, nccl,
        graph, mem):
        a site where the launch uprobe's per-call cost matters can leave "launch" out.
        A library file no process maps any more is detached after `detach_grace_s` (a job
        restarting at once keeps its probes), spread over intervals: the kernel takes ~0.1 s
        per probe removed, so each `collect()` spends at most about `detach_budget_s` on it.
        Discovery reads the maps of processes younger than `young_s` (by their start time in
        /proc/<pid>/stat) at every rescan, the others every `idle_recheck_s` (those that
        mapped a probed library included: their libraries are remembered in between).
        The latency and collective histograms sum in the kernel on a slot of their own and
        are read and sent every `histogram_every_s`: per process they are tens of series,
        which read and sent at 1 Hz would cost more than everything else the probes report
        (0 reads them at every collect)."""
        self.proc_root = proc_root
        self.node = node or socket.gethostname()
        self.pid_source = pid_source
        self.rescan_interval_s = rescan_interval_s
        self.monotonic_ns = monotonic_ns
        self.bpf_loader = bpf_loader
        self.settle_s = settle_s
        self.detach_grace_s = detach_grace_s
        self.young_s = young_s
        self.idle_recheck_s = idle_recheck_s
        self.detach_budget_s = detach_budget_s
        self.probe_groups = frozenset(probe_groups)
        unknown = self.probe_groups - set(PROBE_GROUPS)
        if unknown:
            raise ValueError(
                f"unknown eBPF probe group(s) {sorted(unknown)}; known: {', '.join(PROBE_GROUPS)}"
            )
        super().__init__()
        self._cpus = bpfsys.possible_cpus()
        self._slot = 0
        self._next_scan_ns = 0
        self._attached: dict[tuple[str, int], _Attached] = {}
        self._failed: set[tuple[str, int]] = set()  # library files that refused probes
        self._cuda_pids: set[int] = set()
        self._pid_libraries: dict[int, list[discovery.LibraryFile]] = {}
        self._scan_state: dict[int, tuple[int, int | None]] = {}  # pid -> first seen, last read
        self._unused_since: dict[tuple[str, int], int] = {}  # attached, mapped by no process
        self._detach_queue: dict[tuple[str, int], _Attached] = {}
        self._warn = WarnOnce(log)
        # What the last drain_histograms() read of the `hist` and `colls` maps (probes.c):
        # pid -> {(call, bucket): calls}; pid -> {(call, dtype, size bucket): [calls, ns]}
        self.last_hist: dict[int, dict[tuple[Call, int], int]] = {}
        self.last_colls: dict[int, dict[tuple[Call, int, int], list[int]]] = {}
        self.histogram_every_s = histogram_every_s
        self._next_hist_ns = 0
        self._hist_slot = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def _load(self) -> LoadedProgram:
        """The program, its control map set to the slot this collector reads next."""
        bpf = self.bpf_loader()
        try:
            bpfsys.update(bpf.maps["control"], _U32.pack(0), _U32.pack(self._slot))
        except BaseException:
            bpf.close()
            raise
        return bpf

    def close(self) -> None:
        """Detach every probe and free the maps."""
        for attached in [*self._attached.values(), *self._detach_queue.values()]:
            self._detach_events(attached.events)
            attached.events.clear()
        super().close()
        self._attached.clear()
        self._detach_queue.clear()
        self._unused_since.clear()

    def _map(self, name: str) -> int:
        if self._bpf is None:
            raise RuntimeError("the BPF programs are not loaded")
        return self._bpf.maps[name]

    @property
    def probe_fds(self) -> set[int]:
        """The perf event fds of every probe attached now (queued for removal included)."""
        return {
            fd
            for attached in [*self._attached.values(), *self._detach_queue.values()]
            for fd in attached.events
        }

    def probes_of(self, path: str) -> list[int]:
        """The perf event fds of the probes on the attached library at `path`."""
        return [fd for a in self._attached.values() if a.path == path for fd in a.events]

    @property
    def pending_detach(self) -> int:
        """Probes queued for removal (their library file is no longer mapped)."""
        return sum(len(a.events) for a in self._detach_queue.values())

    @property
    def cuda_pids(self) -> set[int]:
        """The processes that mapped libcuda at the last rescan (the GPU processes)."""
        return set(self._cuda_pids)

    @property
    def attached_libraries(self) -> dict[str, list[str]]:
        """path → symbols probed, for `proof-agent doctor` and the tests."""
        return {a.path: list(a.symbols) for a in self._attached.values()}

    # --- the interval ------------------------------------------------------------------------

    def collect(self, now: float) -> list[Record]:
        if not self.start():
            return []
        try:
            now_ns = self.monotonic_ns()
            if now_ns >= self._next_scan_ns:
                self.rescan()
                self._next_scan_ns = now_ns + int(self.rescan_interval_s * 1e9)
            self._detach_some()
            per_pid = self.drain()
            records = self._records(now, per_pid, self.monotonic_ns())
            self._warn.ok("collect")
            return records
        except Exception as error:
            self._warn.fail("collect", "ebpf collector: reading the maps failed: %s", error)
            return []

    def rescan(self) -> None:
        """Attach to probed libraries that processes map and we have not probed yet; queue
        for detaching those no process has mapped for `detach_grace_s`."""
        pids = self.pid_source() if self.pid_source else discovery.list_pids(self.proc_root)
        found: dict[tuple[str, int], tuple[int, discovery.LibraryFile]] = {}
        cuda_pids: set[int] = set()
        chosen = self._pids_to_scan(pids)
        scanned = discovery.scan(self.proc_root, chosen)
        # Live processes not read this time keep the libraries their last read found.
        skipped = set(self._scan_state).difference(chosen)
        libraries_by_pid = {p: lib for p, lib in self._pid_libraries.items() if p in skipped}
        libraries_by_pid.update(scanned)
        self._pid_libraries = libraries_by_pid
        for pid, libraries in libraries_by_pid.items():
            for library in libraries:
                found.setdefault(library.identity, (pid, library))
                if library.kind == CUDA:
                    cuda_pids.add(pid)
        in_use = set(found)
        for identity in in_use & set(self._detach_queue):
            # Mapped again before its probes were all removed: keep them if none was yet,
            # otherwise finish removing them now and attach afresh below.
            queued = self._detach_queue.pop(identity)
            if len(queued.events) == queued.probes_attached:
                self._attached[identity] = queued
            else:
                self._detach_events(queued.events)
        for identity, (pid, library) in found.items():
            if identity not in self._attached and identity not in self._failed:
                self._attach(library, discovery.host_path(self.proc_root, pid, library))
        now_ns = self.monotonic_ns()
        for identity in list(self._attached):
            if identity in in_use:
                self._unused_since.pop(identity, None)
                continue
            since = self._unused_since.setdefault(identity, now_ns)
            if now_ns - since >= self.detach_grace_s * 1e9:
                del self._unused_since[identity]
                queued = self._detach_queue[identity] = self._attached.pop(identity)
                log.info("ebpf: no process maps %s any more; detaching", queued.path)
        self._failed &= in_use
        self._cuda_pids = cuda_pids

    def _pids_to_scan(self, pids: Iterable[int]) -> list[int]:
        """Reading a process's maps costs ~0.1 ms of CPU (a large PyTorch process's is
        ~1.5 MB), so not every process every rescan: those started less than `young_s` ago
        (CUDA is initialised seconds after start) are read each rescan, the others every
        `idle_recheck_s`. A process's age comes from its start time, so the processes that
        were already old when the agent started are not all read at every rescan of its first
        `young_s`; where /proc/<pid>/stat cannot be read, it is first seen now."""
        now_ns = self.monotonic_ns()
        young_ns = int(self.young_s * 1e9)
        recheck_ns = int(self.idle_recheck_s * 1e9)
        state = self._scan_state
        chosen = []
        live = set()
        for pid in pids:
            live.add(pid)
            seen = state.get(pid)
            first_seen, last_read = seen if seen else (self._started_ns(pid, now_ns), None)
            if (
                last_read is None
                or now_ns - first_seen < young_ns
                or now_ns - last_read >= recheck_ns
            ):
                chosen.append(pid)
                last_read = now_ns
            state[pid] = (first_seen, last_read)
        for pid in [p for p in state if p not in live]:
            del state[pid]
        return chosen

    def _started_ns(self, pid: int, now_ns: int) -> int:
        """When `pid` started, on the `monotonic_ns` clock (`now_ns` if unknown)."""
        age_ns = discovery.process_age_ns(self.proc_root, pid)
        return now_ns if age_ns is None else now_ns - age_ns

    def _attach(self, library: discovery.LibraryFile, path: str) -> None:
        if self._bpf is None:
            return  # discovery without the program loaded (not started, or refused)
        wanted = [p for p in PROBES[library.kind] if p.group in self.probe_groups]
        if not wanted:
            return
        try:
            offsets = bpfsys.function_offsets(path, {p.symbol for p in wanted})
        except (OSError, ValueError, IndexError, struct.error) as error:
            self._failed.add(library.identity)
            log.warning("ebpf: cannot read the symbols of %s: %s", path, error)
            return
        attached = _Attached(path=path, kind=library.kind)
        probed_offsets: set[int] = set()
        for probe in wanted:
            offset = offsets.get(probe.symbol)
            # Aliases (two exported names, one function) would count each call twice.
            if offset is None or offset in probed_offsets:
                continue
            fds: list[int] = []
            try:
                if probe.entry:
                    program = self._bpf.programs[probe.entry]
                    fds.append(bpfsys.attach_uprobe(program, path, offset))
                if probe.exit:
                    program = self._bpf.programs[probe.exit]
                    fds.append(bpfsys.attach_uprobe(program, path, offset, retprobe=True))
            except OSError as error:
                log.warning("ebpf: cannot probe %s in %s: %s", probe.symbol, path, error)
                self._detach_events(fds)
                continue
            attached.events.extend(fds)
            probed_offsets.add(offset)
            attached.symbols.append(probe.symbol)
        attached.probes_attached = len(attached.events)
        if not attached.symbols:
            self._failed.add(library.identity)
            log.warning("ebpf: no probed symbol could be attached in %s", path)
            return
        self._attached[library.identity] = attached
        log.info("ebpf: probing %d symbols in %s", len(attached.symbols), path)

    def _detach_some(self) -> None:
        """Remove queued probes for about `detach_budget_s` (at least one per call)."""
        deadline = time.perf_counter() + self.detach_budget_s
        for identity in list(self._detach_queue):
            attached = self._detach_queue[identity]
            while attached.events:
                self._detach_events([attached.events.pop()])
                if time.perf_counter() >= deadline:
                    break
            if not attached.events:
                del self._detach_queue[identity]
            if time.perf_counter() >= deadline:
                return

    def _detach_events(self, events: list[int]) -> None:
        for fd in events:
            try:
                os.close(fd)  # the kernel removes the probe (~0.1 s each)
            except OSError as error:
                log.warning("ebpf: closing probe fd %d failed: %s", fd, error)

    def drain(self) -> dict[int, dict[Call, Aggregate]]:
        """Flip the slot, then read and delete what the probes wrote into the old one."""
        old = self._slot
        self._slot = 1 - old
        bpfsys.update(self._map("control"), _U32.pack(0), _U32.pack(self._slot))
        time.sleep(self.settle_s)
        stats = self._map("stats")
        value_size = _STAT_VAL.size * self._cpus
        per_pid: dict[int, dict[Call, Aggregate]] = {}
        keys: list[bytes] = []
        # One BPF_MAP_LOOKUP_BATCH for the whole map, one DELETE_BATCH for the old slot's keys.
        for key, raw in bpfsys.items(stats, _STAT_KEY.size, value_size):
            pid, what, slot = _STAT_KEY.unpack(key)
            if slot != old:
                continue
            keys.append(key)
            try:
                call = Call(what)
            except ValueError:
                continue
            aggregate = per_pid.setdefault(pid, {}).setdefault(call, Aggregate())
            for calls, total_ns, max_ns, nbytes in _STAT_VAL.iter_unpack(raw):
                aggregate.add(calls, total_ns, max_ns, nbytes)
        bpfsys.delete_many(stats, keys, _STAT_KEY.size)
        return per_pid

    def drain_histograms(self) -> None:
        """Flip the histograms' own slot (`hist_control`), then read and delete what the
        probes wrote into the old one, into `last_hist` / `last_colls`."""
        maps = self._bpf.maps if self._bpf is not None else {}
        if "hist_control" not in maps:
            self.last_hist, self.last_colls = {}, {}
            return
        old = self._hist_slot
        self._hist_slot = 1 - old
        bpfsys.update(maps["hist_control"], _U32.pack(0), _U32.pack(self._hist_slot))
        time.sleep(self.settle_s)
        self.last_hist = self._drain_hist(old)
        self.last_colls = self._drain_colls(old)

    def _drain_hist(self, old: int) -> dict[int, dict[tuple[Call, int], int]]:
        maps = self._bpf.maps if self._bpf is not None else {}
        if "hist" not in maps:
            return {}
        table = maps["hist"]
        out: dict[int, dict[tuple[Call, int], int]] = {}
        keys: list[bytes] = []
        for key, raw in bpfsys.items(table, _HIST_KEY.size, _U64.size * self._cpus):
            pid, what, slot, bucket = _HIST_KEY.unpack(key)
            if slot != old:
                continue
            keys.append(key)
            try:
                call = Call(what)
            except ValueError:
                continue
            count = sum(v for (v,) in _U64.iter_unpack(raw))
            per = out.setdefault(pid, {})
            per[(call, bucket)] = per.get((call, bucket), 0) + count
        bpfsys.delete_many(table, keys, _HIST_KEY.size)
        return out

    def _drain_colls(self, old: int) -> dict[int, dict[tuple[Call, int, int], list[int]]]:
        maps = self._bpf.maps if self._bpf is not None else {}
        if "colls" not in maps:
            return {}
        table = maps["colls"]
        out: dict[int, dict[tuple[Call, int, int], list[int]]] = {}
        keys: list[bytes] = []
        for key, raw in bpfsys.items(table, _COLL_KEY.size, _COLL_VAL.size * self._cpus):
            pid, what, slot, dtype, size_bucket = _COLL_KEY.unpack(key)
            if slot != old:
                continue
            keys.append(key)
            try:
                call = Call(what)
            except ValueError:
                continue
            acc = out.setdefault(pid, {}).setdefault((call, dtype, size_bucket), [0, 0])
            for calls, total_ns in _COLL_VAL.iter_unpack(raw):
                acc[0] += calls
                acc[1] += total_ns
        bpfsys.delete_many(table, keys, _COLL_KEY.size)
        return out

    def open_syncs(self, now_ns: int) -> dict[int, int]:
        """pid → ns its longest synchronize call still in progress has been blocked so far."""
        table = self._map("inflight")
        open_ns: dict[int, int] = {}
        for key, raw in bpfsys.items(table, _INFLIGHT_KEY.size, _INFLIGHT_VAL.size):
            tid, what = _INFLIGHT_KEY.unpack(key)
            if what not in SYNC_CALLS:
                continue
            ts, _bytes, pid, _unused = _INFLIGHT_VAL.unpack(raw)
            # A thread that died inside the call leaves its entry until the LRU evicts it.
            if not os.path.exists(os.path.join(self.proc_root, str(pid), "task", str(tid))):
                continue
            open_ns[pid] = max(open_ns.get(pid, 0), max(0, now_ns - ts))
        return open_ns

    def last_launches(self) -> dict[int, int]:
        """pid → ktime of its latest launch, for live processes; forgets exited ones."""
        table = self._map("last_launch")
        live: dict[int, int] = {}
        gone: list[bytes] = []
        for key, raw in bpfsys.items(table, _U32.size, _U64.size):
            (pid,) = _U32.unpack(key)
            if not discovery.process_alive(self.proc_root, pid):
                gone.append(key)
                continue
            live[pid] = _U64.unpack(raw)[0]
        bpfsys.delete_many(table, gone, _U32.size)
        return live

    # --- records -----------------------------------------------------------------------------

    def _records(
        self, now: float, per_pid: dict[int, dict[Call, Aggregate]], now_ns: int
    ) -> list[Record]:
        last = self.last_launches()
        blocked = self.open_syncs(now_ns) if "sync" in self.probe_groups else {}
        records: list[Record] = []
        for pid in sorted(set(per_pid) | set(last) | set(blocked)):
            calls = per_pid.get(pid, {})
            emit = _Emitter(records, now, self.node, pid)
            launches = calls.get(Call.LAUNCH, Aggregate())
            cuda_active = pid in last or pid in blocked or any(c in CUDA_CALLS for c in calls)
            if cuda_active:
                # The gap still open at `now` counts too: a process that stopped launching
                # shows a growing gap rather than nothing.
                open_gap_ns = max(0, now_ns - last[pid]) if pid in last else 0
                gap_ns = max(launches.max_ns, open_gap_ns)
                syncs = Aggregate()
                for call in SYNC_CALLS:
                    if call in calls:
                        s = calls[call]
                        syncs.add(s.calls, s.total_ns, s.max_ns, s.bytes)
                # A group not probed reports nothing, rather than a misleading zero.
                if "launch" in self.probe_groups:
                    emit(signals.CUDA_LAUNCHES, launches.calls)
                    emit(signals.CUDA_LAUNCH_GAP_MAX_MS, gap_ns / NS_PER_MS)
                if "sync" in self.probe_groups:
                    emit(signals.CUDA_SYNC_MS, syncs.total_ns / NS_PER_MS)
                if syncs.calls:
                    emit(signals.CUDA_SYNCS, syncs.calls)
                    emit(signals.CUDA_SYNC_MAX_MS, syncs.max_ns / NS_PER_MS)
                if pid in blocked:
                    # Counted in cuda.sync_ms only when it returns; visible here while it hangs.
                    emit(signals.CUDA_SYNC_OPEN_MS, blocked[pid] / NS_PER_MS)
            for call, call_labels, (n_calls, n_bytes, ms) in _LABELLED_CALLS:
                agg = calls.get(call)
                if agg is None or not agg.calls:
                    continue
                labels = dict(call_labels)  # a fresh dict per process, as records are mutable
                emit(n_calls, agg.calls, labels)
                emit(n_bytes, agg.bytes, labels)
                emit(ms, agg.total_ns / NS_PER_MS, labels)
            group = calls.get(Call.NCCL_GROUP)
            if group is not None and group.calls:
                emit(signals.NCCL_GROUPS, group.calls)
                emit(signals.NCCL_GROUP_MS, group.total_ns / NS_PER_MS)
            for call, (calls_name, bytes_name, ms_name) in _PLAIN_CALLS:
                agg = calls.get(call)
                if agg is None or not agg.calls:
                    continue
                emit(calls_name, agg.calls)
                if bytes_name is not None:
                    emit(bytes_name, agg.bytes)
                if ms_name is not None:
                    emit(ms_name, agg.total_ns / NS_PER_MS)
        if now_ns >= self._next_hist_ns:
            self._next_hist_ns = now_ns + int(self.histogram_every_s * 1e9)
            self.drain_histograms()
            for pid in sorted(set(self.last_hist) | set(self.last_colls)):
                emit = _Emitter(records, now, self.node, pid)
                _emit_histograms(emit, self.last_hist.get(pid), self.last_colls.get(pid))
        return records


# Copies by kind and NCCL collectives by op: (call, labels, (calls, bytes, ms signals)), in the
# order they are emitted.
_MEMCPY_SIGNALS = (signals.CUDA_MEMCPY_CALLS, signals.CUDA_MEMCPY_BYTES, signals.CUDA_MEMCPY_MS)
_NCCL_SIGNALS = (signals.NCCL_CALLS, signals.NCCL_BYTES, signals.NCCL_MS)
_LABELLED_CALLS: tuple[tuple[Call, dict[str, str], tuple[str, str, str]], ...] = (
    *((call, {"kind": kind}, _MEMCPY_SIGNALS) for call, kind in MEMCPY_KINDS.items()),
    *((call, {"op": op}, _NCCL_SIGNALS) for call, op in NCCL_OP_LABELS.items()),
)


# Calls with series of their own and no labels: (call, (calls, bytes or None, ms or None)).
_PLAIN_CALLS: tuple[tuple[Call, tuple[str, str | None, str | None]], ...] = (
    (Call.GRAPH_LAUNCH, (signals.CUDA_GRAPH_LAUNCHES, None, signals.CUDA_GRAPH_LAUNCH_MS)),
    (
        Call.MEM_ALLOC,
        (signals.CUDA_MEM_ALLOCS, signals.CUDA_MEM_ALLOC_BYTES, signals.CUDA_MEM_ALLOC_MS),
    ),
    (Call.MEM_FREE, (signals.CUDA_MEM_FREES, None, signals.CUDA_MEM_FREE_MS)),
    (Call.NCCL_COMM_INIT, (signals.NCCL_COMM_INITS, None, signals.NCCL_COMM_INIT_MS)),
    (Call.NCCL_COMM_ABORT, (signals.NCCL_COMM_ABORTS, None, None)),
)
_NCCL_API_CALLS = frozenset(
    {*NCCL_COLLECTIVES, Call.NCCL_GROUP, Call.NCCL_COMM_INIT, Call.NCCL_COMM_ABORT}
)


def _dtype_label(dtype: int) -> str:
    return signals.NCCL_DTYPES[dtype] if dtype < len(signals.NCCL_DTYPES) else str(dtype)


def _emit_histograms(
    emit: _Emitter,
    hist: dict[tuple[Call, int], int] | None,
    colls: dict[tuple[Call, int, int], list[int]] | None,
) -> None:
    """The in-kernel histograms of one process: latency per API (labels api, le_us) and NCCL
    collectives by op, dtype and message size (labels op, dtype, size_le)."""
    for (call, bucket), count in sorted((hist or {}).items()):
        label = API_LABELS.get(call)
        if label is None or not count:
            continue
        name = (
            signals.NCCL_API_LATENCY_CALLS
            if call in _NCCL_API_CALLS
            else signals.CUDA_API_LATENCY_CALLS
        )
        emit(name, count, {"api": label, "le_us": str(1 << bucket)})
    for (call, dtype, size_bucket), (n, total_ns) in sorted((colls or {}).items()):
        op = NCCL_OP_LABELS.get(call)
        if op is None or not n:
            continue
        labels = {"op": op, "dtype": _dtype_label(dtype), "size_le": str(1 << size_bucket)}
        emit(signals.NCCL_COLLECTIVE_CALLS, n, labels)
        emit(signals.NCCL_COLLECTIVE_MS, total_ns / NS_PER_MS, dict(labels))


class _Emitter:
    """Appends samples for one process; integral counts stay ints in the JSON."""

    __slots__ = ("node", "now", "pid", "records")

    def __init__(self, records: list[Record], now: float, node: str, pid: int) -> None:
        self.records = records
        self.now = now
        self.node = node
        self.pid = pid

    def __call__(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        record: Record = {
            "type": "sample",
            "ts": self.now,
            "name": name,
            "value": value,
            signals.NODE: self.node,
            signals.PID: self.pid,
        }
        if labels:
            record["labels"] = labels
        self.records.append(record)
