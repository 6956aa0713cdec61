"""The detectors on live data: a `SignalStore` over ingest's storage, for one tenant.

`IngestStore` answers the questions `engine.window` asks (the same interface as the
offline `TraceStore`) from `ingest.selectors`, converting ingest's rows to the detectors'
dataclasses; process and job metadata, which ingest has no selector for, are read from
ingest's inventory tables as the tenant (reads only). `detect_job()` / `detect_gpu()` run the
detectors engineer's window builders, detectors and verdict builder, exactly as
`proof analyze` does, so a verdict is the same live and offline.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from engine.store import EventRow, JobMeta, LogRow, ProcessInfo, SeriesData, SeriesInfo
from ingest import selectors as ingest_selectors
from ingest.models import Gpu, Job, Process, Series
from tenants.context import tenant_context

# Enough log lines for 30 min of a large job's progress lines; beyond it the oldest are kept.
LOG_LIMIT = 200_000
EVENT_LIMIT = 20_000


def _series(items: Iterable[Any]) -> list[SeriesData]:
    out = []
    for s in items:
        i = s.info
        info = SeriesInfo(
            i.name,
            i.node,
            i.gpu,
            i.gpu_index,
            i.pid,
            i.job,
            i.rank,
            tuple(sorted((str(k), str(v)) for k, v in (i.labels or {}).items())),
        )
        out.append(SeriesData(info, s.ts, s.values))
    return out


class IngestStore:
    """One tenant's stored signals, for the window builders. `spans` gives each job's data
    span (first, last sample ts), which ingest's job rows (wall-clock) cannot."""

    def __init__(self, operator_id: int, spans: dict[str, tuple[float, float]] | None = None):
        self.operator_id = operator_id
        self.spans = dict(spans or {})
        self._jobs: dict[str, JobMeta] | None = None
        self._gpu_index: dict[str, tuple[str, int | None]] | None = None

    def _meta(self, job: Job) -> JobMeta:
        first, last = self.spans.get(job.job_id, (float("inf"), float("-inf")))
        return JobMeta(
            job=job.job_id,
            kind=job.kind or "training",
            name=job.name,
            nodes=[str(n) for n in (job.nodes or [])],
            world_size=job.world_size,
            state=job.state if job.state != "unknown" else "running",
            exit_code=job.exit_code,
            rerun_of=job.rerun_of or None,
            config=dict(job.config or {}),
            first_ts=first,
            last_ts=last,
            end_ts=job.ended_at.timestamp() if job.ended_at else None,
        )

    def jobs(self) -> dict[str, JobMeta]:
        """The jobs asked about (the spans) and their reruns/originals, not the whole fleet."""
        if self._jobs is None:
            names = set(self.spans)
            with tenant_context(self.operator_id):
                qs = Job.objects.for_tenant(self.operator_id)
                rows = list(qs.filter(job_id__in=names))
                related = {j.rerun_of for j in rows if j.rerun_of}
                rows += list(qs.filter(job_id__in=related - names))
                rows += list(qs.filter(rerun_of__in=names).exclude(job_id__in=names | related))
            self._jobs = {j.job_id: self._meta(j) for j in rows}
        return dict(self._jobs)

    def _gpus(self) -> dict[str, tuple[str, int | None]]:
        if self._gpu_index is None:
            with tenant_context(self.operator_id):
                self._gpu_index = {
                    uuid: (node or "", index)
                    for uuid, node, index in Gpu.objects.for_tenant(self.operator_id).values_list(
                        "uuid", "node__hostname", "index"
                    )
                }
        return self._gpu_index

    def processes(self, job: str) -> list[ProcessInfo]:
        gpus = self._gpus()
        with tenant_context(self.operator_id):
            rows = list(
                Process.objects.for_tenant(self.operator_id)
                .filter(job__job_id=job)
                .values_list(
                    "node__hostname",
                    "pid",
                    "rank",
                    "local_rank",
                    "gpu",
                    "cmd",
                    "first_seen_at",
                    "exit_code",
                    "exited_at",
                )
            )
        first = self.spans.get(job, (None, None))[0]
        out = []
        for node, pid, rank, local_rank, gpu, cmd, seen, exit_code, exited in rows:
            out.append(
                ProcessInfo(
                    node=node or "",
                    pid=int(pid),
                    job=job,
                    rank=rank,
                    local_rank=local_rank,
                    gpu=gpu or "",
                    gpu_index=gpus.get(gpu, ("", None))[1] if gpu else None,
                    cmd=cmd or "",
                    # Data time where known: the wall clock of ingest says nothing of a replay.
                    first_ts=first if first is not None else seen.timestamp(),
                    exit_code=exit_code,
                    exit_ts=exited.timestamp() if exited else None,
                )
            )
        return out

    def job_series(self, job: str, t0: float, t1: float) -> list[SeriesData]:
        return _series(ingest_selectors.job_series(self.operator_id, job, t0, t1))

    def node_series(
        self, node: str, t0: float, t1: float, names: Iterable[str] | None = None
    ) -> list[SeriesData]:
        return _series(ingest_selectors.node_series(self.operator_id, node, t0, t1, names))

    def gpu_series(self, gpu: str, t0: float, t1: float) -> list[SeriesData]:
        with tenant_context(self.operator_id):
            qs = Series.objects.for_tenant(self.operator_id).filter(gpu=gpu)
            infos = {}
            node_ids = set()
            for sid, name, node, node_id, gidx, pid, jid, rank, lrank, labels in qs.values_list(
                "id",
                "name",
                "node__hostname",
                "node_id",
                "gpu_index",
                "pid",
                "job__job_id",
                "rank",
                "local_rank",
                "labels",
            ):
                infos[sid] = ingest_selectors.SeriesInfo(
                    sid, name, node or "", gpu, gidx, pid, jid or "", rank, lrank, labels or {}
                )
                node_ids.add(node_id)
            data = ingest_selectors.read_samples(self.operator_id, infos, node_ids, t0, t1)
        return _series(data)

    def events(self, *, node: str, t0: float, t1: float) -> list[EventRow]:
        rows = ingest_selectors.events(self.operator_id, node=node, t0=t0, t1=t1, limit=EVENT_LIMIT)
        return [
            EventRow(e.ts, e.name, e.node, e.gpu, e.gpu_index, e.job, e.value, e.text, e.labels)
            for e in rows
        ]

    def job_logs(self, job: str, t0: float, t1: float) -> list[LogRow]:
        half = max(0.0, (t1 - t0) / 2)
        rows = ingest_selectors.job_logs(
            self.operator_id, job, t0 + half, before_s=half, after_s=half, limit=LOG_LIMIT
        )
        return [LogRow(r.ts, r.node, r.pid, r.rank, r.stream, r.line) for r in rows]

    def gpus(self) -> list[tuple[str, str, int | None]]:
        return [(uuid, node, index) for uuid, (node, index) in sorted(self._gpus().items())]

    def time_range(self) -> tuple[float, float]:
        if not self.spans:
            return (0.0, 0.0)
        return (min(a for a, _ in self.spans.values()), max(b for _, b in self.spans.values()))


def _spans(operator_id: int, job_ids: Iterable[str]) -> dict[str, tuple[float, float]]:
    from investigations.models import JobActivity

    with tenant_context(operator_id):
        rows = (
            JobActivity.objects.for_tenant(operator_id)
            .filter(job__job_id__in=list(job_ids))
            .values_list("job__job_id", "first_data_ts", "last_data_ts")
        )
        return {j: (a, b) for j, a, b in rows}


def detect_job(
    operator_id: int, job: str, t0: float, t1: float
) -> tuple[Any, list[dict[str, Any]]]:
    """(the job's window over [t0, t1], its verdicts as DESIGN §7 dicts)."""
    from engine.detectors import run_detectors
    from engine.verdicts import build_verdicts
    from engine.window import build_job_window

    store = IngestStore(operator_id, _spans(operator_id, [job]))
    related = store.jobs()
    if len(related) > 1:  # reruns: their spans too, so the window can read their logs
        store = IngestStore(operator_id, _spans(operator_id, related))
    window = build_job_window(store, job, t0, t1)
    return window, build_verdicts(run_detectors(window), window)


def detect_gpu(
    operator_id: int, gpu: str, window_s: float
) -> tuple[tuple[float, float], list[dict[str, Any]]] | None:
    """Fleet health of one GPU over the last `window_s` seconds, or None for an unknown GPU."""
    from engine.detectors import run_fleet_health
    from engine.verdicts import build_verdicts
    from engine.window import build_gpu_window

    store = IngestStore(operator_id)
    where = store._gpus().get(gpu)
    if where is None:
        return None
    node, index = where
    # Fleet health runs on live data: the window ends now.
    t1 = time.time()
    t0 = t1 - window_s
    window = build_gpu_window(store, gpu, node, index, t0, t1)
    return (t0, t1), build_verdicts(run_fleet_health(window), None)
