"""The read interface detectors are built on, and its two implementations.

Detectors never read a trace or a database directly: `engine.window` builds windows
from a `SignalStore`, which answers the same questions `ingest.selectors` answers (all series of
a job over [t0, t1], a node's series, events of a GPU or node, a job's log lines, job metadata).

- `TraceStore` — an in-memory store loaded from a trace file (`proof analyze`, `proof eval`).
  Loading a trace through ingest's storage (protobuf batches into a temporary SQLite database)
  was not used offline: ingest's writer expects agent batches over gRPC with a tenant, and the
  in-memory store reads a 64-GPU, 30-minute trace in ~12 s of CPU (engine/trace_load.py;
  docs/scaling.md, "proof analyze at 64 GPUs").
- `IngestStore` — the live implementation over `ingest.selectors` (one tenant).

Both return the same plain row types (contract.rows), so the detector code is identical live
and offline.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from contract import signals
from contract.rows import EventRow, JobMeta, LogRow, ProcessInfo, SeriesData, SeriesInfo
from contract.trace import Problem
from engine.trace_load import fast_records


class GpuHealthStore(Protocol):
    """What fleet health's window builder (`build_gpu_window`) asks: a GPU's series, its
    node's events, the jobs and their processes."""

    def jobs(self) -> dict[str, JobMeta]: ...

    def processes(self, job: str) -> list[ProcessInfo]: ...

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]: ...

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]: ...


class SignalStore(Protocol):
    def jobs(self) -> dict[str, JobMeta]: ...

    def processes(self, job: str) -> list[ProcessInfo]: ...

    def job_series(self, job: str, t0: float, t1: float) -> list[SeriesData]: ...

    def node_series(
        self, node: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]: ...

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]: ...

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]: ...

    def job_logs(self, job: str, t0: float, t1: float) -> list[LogRow]: ...

    def gpus(self) -> list[tuple[str, str, int | None]]: ...

    def time_range(self) -> tuple[float, float]: ...


TERMINAL_STATES = ("completed", "failed", "cancelled")


def is_gpu_scope(name: str) -> bool:
    """GPU scope in the vocabulary; a DCGM field outside it is taken as per-GPU too."""
    spec = signals.spec_for(name)
    return (spec is not None and spec.scope is signals.Scope.GPU) or name.startswith(
        signals.DCGM_PREFIX
    )


def _cut(s: SeriesData, t0: float, t1: float) -> SeriesData:
    a, b = np.searchsorted(s.ts, [t0, t1 + 1e-9])
    if a == 0 and b == len(s.ts):
        return s
    return SeriesData(s.info, s.ts[a:b], s.values[a:b])


class TraceStore:
    """Every record of a trace, indexed in memory for the window builders."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.problems: list[Problem] = []
        self.problem_count = 0
        self._series: list[SeriesData] = []
        self._by_job: dict[str, list[int]] = {}
        self._by_gpu: dict[str, list[int]] = {}
        self._by_node: dict[str, list[int]] = {}
        self._jobs: dict[str, JobMeta] = {}
        self._procs: dict[tuple[str, int], ProcessInfo] = {}
        self._logs: dict[str, list[LogRow]] = {}
        self._events: list[EventRow] = []
        self._gpus: dict[str, tuple[str, int | None]] = {}
        self._t_range = (float("inf"), float("-inf"))

    # --- loading ------------------------------------------------------------------------
    @classmethod
    def from_trace(
        cls,
        path: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
        on_problem: Callable[[Problem], None] | None = None,
    ) -> TraceStore:
        """Read a trace file; malformed lines are kept in `problems` (line numbers) and skipped.

        `progress(bytes_read, total_bytes)` is called every ~200k records (compressed bytes for a
        gzip trace, so the fraction is right for both)."""
        return cls.from_traces(
            [path],
            progress=progress,
            on_problem=None if on_problem is None else (lambda _path, p: on_problem(p)),
        )

    @classmethod
    def from_traces(
        cls,
        paths: Sequence[str | os.PathLike[str]],
        *,
        progress: Callable[[int, int], None] | None = None,
        on_problem: Callable[[str, Problem], None] | None = None,
    ) -> TraceStore:
        """Several trace files read as one — the per-rank traces of one run, say: each file
        by `from_trace`'s rules (its own line numbers and ts order; the first file's meta),
        their records indexed together. `on_problem(path, problem)`."""
        store = cls()
        total = sum(os.path.getsize(p) for p in paths)
        cols: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}
        where: dict[str, Any] = {"done": 0, "raw": None}

        def records() -> Iterator[dict[str, Any]]:
            for i, path in enumerate(paths):

                def problem(p: Problem, path: str = str(path)) -> None:
                    store.problem_count += 1
                    if len(store.problems) < 1000:
                        store.problems.append(p)
                    if on_problem is not None:
                        on_problem(path, p)

                meta = store.meta
                with open(path, "rb") as raw:
                    where["raw"] = raw  # the compressed position, for the progress bar
                    yield from fast_records(raw, store.set_meta, problem, cols)
                if i:
                    store.meta = meta
                where["done"] += os.path.getsize(path)

        def tick(_n: int) -> None:
            if progress is not None and where["raw"] is not None:
                with contextlib.suppress(OSError, ValueError):
                    progress(min(total, where["done"] + where["raw"].tell()), total)

        # Millions of short-lived record dicts would trigger the cyclic GC over and over
        # (measured: 3x the parse time); records hold no cycles, so it is off while loading.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            store._load(records(), tick if progress else None, cols, resort=len(paths) > 1)
        finally:
            if was_enabled:
                gc.enable()
        if progress is not None:
            progress(total, total)
        return store

    @classmethod
    def from_records(
        cls, records: Iterable[dict[str, Any]], meta: dict[str, Any] | None = None
    ) -> TraceStore:
        store = cls()
        store._load(records, None)
        store.meta = meta or {}
        return store

    def _load(
        self,
        records: Iterable[dict[str, Any]],
        tick: Callable[[int], None] | None,
        cols: dict[tuple[Any, ...], tuple[list[float], list[float]]] | None = None,
        *,
        resort: bool = False,
    ) -> None:
        """Index records; samples either come through `records` or were already grouped into
        `cols` by the fast trace reader (same key layout, normalised below). `resort`: a
        series may come in pieces out of time order (several files)."""
        cols = {} if cols is None else cols
        lo, hi = float("inf"), float("-inf")
        n = 0
        for rec in records:
            n += 1
            if tick is not None and n % 200_000 == 0:
                tick(n)
            kind = rec.get("type")
            ts: Any = rec.get("ts")
            if kind == "sample":
                labels = rec.get("labels")
                key = (
                    rec["name"],
                    rec.get("node"),
                    rec.get("gpu"),
                    rec.get("gpu_index"),
                    rec.get("pid"),
                    rec.get("job"),
                    rec.get("rank"),
                    tuple(labels.items()) if labels else None,
                )
                col = cols.get(key)
                if col is None:
                    col = cols[key] = ([], [])
                col[0].append(ts)
                col[1].append(rec["value"])
                continue
            if type(ts) in (int, float):
                lo, hi = min(lo, ts), max(hi, ts)
            if kind == "log":
                self._add_log(rec)
            elif kind == "event":
                self._add_event(rec)
            elif kind == "process":
                self._add_process(rec)
            elif kind == "exit":
                proc = self._procs.get((rec.get("node") or "", rec.get("pid") or 0))
                if proc is not None:
                    proc.exit_code = rec.get("exit_code")
                    proc.exit_ts = rec["ts"]
            elif kind == "job":
                self._add_job(rec)
        merged: dict[Any, tuple[list[float], list[float]]] = {}
        for raw_key, (tss, vals) in cols.items():
            name, node, gpu, gidx, pid, job, rank, labels = raw_key
            key = (
                name,
                node or "",
                gpu or "",
                gidx,
                pid,
                str(job) if job not in (None, "") else "",
                rank,
                tuple(sorted((str(k), str(v)) for k, v in labels)) if labels else (),
            )
            have = merged.get(key)
            if have is None:
                merged[key] = (tss, vals)
            else:  # the same series with its labels in another order: merge in time order
                both = sorted(zip(have[0] + tss, have[1] + vals, strict=True))
                merged[key] = ([t for t, _ in both], [v for _, v in both])
        for series_key, (tss, vals) in merged.items():
            name, node, gpu, gidx, pid, job, rank, labels = series_key
            ts_arr = np.asarray(tss, dtype=np.float64)
            val_arr = np.asarray(vals, dtype=np.float64)
            if resort and len(ts_arr) > 1 and bool(np.any(np.diff(ts_arr) < 0)):
                order = np.argsort(ts_arr, kind="stable")
                ts_arr, val_arr = ts_arr[order], val_arr[order]
            if len(ts_arr):
                lo, hi = min(lo, float(ts_arr[0])), max(hi, float(ts_arr[-1]))
            info = SeriesInfo(name, node, gpu, gidx, pid, job, rank, labels=labels)
            idx = len(self._series)
            self._series.append(SeriesData(info, ts_arr, val_arr))
            if job:
                self._by_job.setdefault(job, []).append(idx)
                self._job(job).first_ts = min(self._job(job).first_ts, float(ts_arr[0]))
                self._job(job).last_ts = max(self._job(job).last_ts, float(ts_arr[-1]))
            if gpu:
                self._by_gpu.setdefault(gpu, []).append(idx)
                self._gpus.setdefault(gpu, (node, gidx))
            if node:
                self._by_node.setdefault(node, []).append(idx)
        self._t_range = (lo, hi)
        for rows in self._logs.values():
            rows.sort(key=lambda r: r.ts)

    def _job(self, job: str) -> JobMeta:
        meta = self._jobs.get(job)
        if meta is None:
            meta = self._jobs[job] = JobMeta(job=job)
        return meta

    def _add_job(self, rec: dict[str, Any]) -> None:
        meta = self._job(str(rec["job"]))
        meta.first_ts = min(meta.first_ts, rec["ts"])
        meta.last_ts = max(meta.last_ts, rec["ts"])
        for key in ("kind", "name", "state"):
            if isinstance(rec.get(key), str):
                setattr(meta, key, rec[key])
        if isinstance(rec.get("kind"), str):
            meta.kind_recorded = True
        if isinstance(rec.get("nodes"), list):
            meta.nodes = [str(n) for n in rec["nodes"]]
        if isinstance(rec.get("world_size"), int):
            meta.world_size = rec["world_size"]
        if isinstance(rec.get("exit_code"), int):
            meta.exit_code = rec["exit_code"]
        if rec.get("rerun_of"):
            meta.rerun_of = str(rec["rerun_of"])
        if isinstance(rec.get("config"), dict):
            meta.config.update(rec["config"])
        if meta.state in TERMINAL_STATES:
            meta.end_ts = rec["ts"]

    def _add_process(self, rec: dict[str, Any]) -> None:
        key = (rec.get("node") or "", rec.get("pid") or 0)
        proc = self._procs.get(key)
        if proc is None:
            proc = self._procs[key] = ProcessInfo(
                node=key[0],
                pid=key[1],
                job=str(rec.get("job") or ""),
                rank=rec.get("rank"),
                local_rank=rec.get("local_rank"),
                gpu=rec.get("gpu") or "",
                gpu_index=rec.get("gpu_index"),
                cmd=rec.get("cmd") or "",
                first_ts=rec["ts"],
                world_size=rec.get("world_size"),
            )
        else:
            for attr in ("rank", "local_rank", "gpu", "gpu_index", "cmd", "world_size"):
                if rec.get(attr) not in (None, "") and getattr(proc, attr) in (None, ""):
                    setattr(proc, attr, rec[attr])
            if not proc.job and rec.get("job"):
                proc.job = str(rec["job"])
        if proc.job:
            job = self._job(proc.job)
            job.first_ts = min(job.first_ts, rec["ts"])
            if proc.node and proc.node not in job.nodes:
                job.nodes.append(proc.node)

    def _add_log(self, rec: dict[str, Any]) -> None:
        job = str(rec.get("job") or "")
        self._logs.setdefault(job, []).append(
            LogRow(
                rec["ts"],
                rec.get("node") or "",
                rec.get("pid"),
                rec.get("rank"),
                rec.get("stream") or "stdout",
                rec["line"],
            )
        )
        if job:
            meta = self._job(job)
            meta.last_ts = max(meta.last_ts, rec["ts"])

    def _add_event(self, rec: dict[str, Any]) -> None:
        value = rec.get("value")
        labels = rec.get("labels")
        self._events.append(
            EventRow(
                rec["ts"],
                rec["name"],
                rec.get("node") or "",
                rec.get("gpu") or "",
                rec.get("gpu_index"),
                str(rec.get("job") or ""),
                float(value) if isinstance(value, int | float) else None,
                str(rec.get("text") or ""),
                dict(labels) if isinstance(labels, dict) else {},
            )
        )

    def set_meta(self, meta: dict[str, Any]) -> None:
        self.meta = meta

    # --- reads (the SignalStore interface) --------------------------------------------
    def jobs(self) -> dict[str, JobMeta]:
        return dict(self._jobs)

    def processes(self, job: str) -> list[ProcessInfo]:
        return [p for p in self._procs.values() if p.job == job]

    def job_series(self, job: str, t0: float, t1: float) -> list[SeriesData]:
        """Series carrying the job's id, plus the GPU-scope series of the GPUs its ranks used."""
        idx = list(self._by_job.get(job, []))
        gpus = {p.gpu for p in self.processes(job) if p.gpu}
        gpus |= {self._series[i].info.gpu for i in idx if self._series[i].info.gpu}
        for g in gpus:  # the GPU-scope series of its GPUs, whoever's identity they carry
            idx.extend(
                i for i in self._by_gpu.get(g, []) if is_gpu_scope(self._series[i].info.name)
            )
        return [_cut(self._series[i], t0, t1) for i in sorted(set(idx))]

    def node_series(
        self, node: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        wanted = set(names) if names is not None else None
        return [
            _cut(self._series[i], t0, t1)
            for i in self._by_node.get(node, [])
            if wanted is None or self._series[i].info.name in wanted
        ]

    def gpu_series(
        self, gpu: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        wanted = None if names is None else set(names)
        return [
            _cut(self._series[i], t0, t1)
            for i in self._by_gpu.get(gpu, [])
            if is_gpu_scope(self._series[i].info.name)
            and (wanted is None or self._series[i].info.name in wanted)
        ]

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]:
        return [e for e in self._events if e.node == node and t0 <= e.ts <= t1]

    def job_logs(self, job: str, t0: float, t1: float) -> list[LogRow]:
        return [r for r in self._logs.get(job, []) if t0 <= r.ts <= t1]

    def gpus(self) -> list[tuple[str, str, int | None]]:
        return [(uuid, node, idx) for uuid, (node, idx) in sorted(self._gpus.items())]

    def time_range(self) -> tuple[float, float]:
        return self._t_range


# Names a GPU-window (fleet health) needs; the rest of a GPU's series are not read for it.
FLEET_HEALTH_SIGNALS: tuple[str, ...] = (
    *signals.GPU_COUNTERS,
    signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
    signals.DCGM_FI_DEV_SM_CLOCK,
    signals.DCGM_FI_DEV_GPU_TEMP,
)
