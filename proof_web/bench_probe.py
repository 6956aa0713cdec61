"""What `proof bench live` measures inside whatever runs the tasks: a `celery worker` process
(loaded with `--include proof_web.bench_probe`) or the bench's own in-process runner.

Active only where `PROOF_BENCH_PROBE` names a file (or after `install(path)`); it appends one
JSON line per event, so several worker processes (prefork children included) can share it:

- `{"event": "task", "task", "cpu_s", "wall_s", "args", "pid", "pool_cpu_s", "evictions", "t"}` for every
  `evaluate_job` / `evaluate_fleet_health` run: CPU time of the thread that ran the task body
  (`time.thread_time()` at Celery's task_prerun and task_postrun, same thread), wall time, and
  the process's decode pool CPU so far (`ingest.selectors.pool_decode_cpu_s()`: reads of more
  than a few blocks decode on a thread pool, which the task thread's time leaves out; the bench
  adds each process's growth over the run), and per job in the worker's window cache its full,
  delta and added-series reads so far (`reads`);
- `{"event": "verdict", "kind", "operator", "incident", "job_pk", "family", "data_ts",
  "evaluated_through_ts", "t"}` for every notification of the hook
  (investigations.notifications), right after the evaluation that produced it committed:
  `data_ts` is the job's `JobActivity.last_data_ts` at that moment (data time: how far the
  job's data had reached when the verdict first existed), for a job-less (fleet-health)
  incident the latest of the operator's jobs.
"""

from __future__ import annotations

import cProfile
import json
import os
import threading
import time
from typing import Any

from celery import signals

ENV = "PROOF_BENCH_PROBE"
# A folder: every measured task runs under cProfile (its thread only), and those that took
# more than PROFILE_MIN_CPU_S of CPU leave their stats there (`python -m pstats`). A diagnosis
# aid: the profiler inflates the CPU it measures, so a profiled run's figures are not costs.
PROFILE_ENV = "PROOF_BENCH_PROFILE"
PROFILE_MIN_CPU_S = 1.0
MEASURED_TASKS = frozenset(
    {
        "investigations.evaluate_job",
        "investigations.evaluate_fleet_health",
        "investigations.evaluate_node_health",  # the fan-out's: one node's GPUs at a time
    }
)

_lock = threading.Lock()
_state: dict[str, Any] = {"path": None, "started": {}, "receiver": None}


def _write(event: dict[str, Any]) -> None:
    path = _state["path"]
    if path is None:
        return
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    with _lock:
        # One write of an O_APPEND file per event: lines of concurrent processes never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _prerun(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
    if getattr(sender, "name", None) in MEASURED_TASKS and task_id:
        profile = None
        if os.environ.get(PROFILE_ENV):
            profile = cProfile.Profile()
            profile.enable()
        _state["started"][task_id] = (time.thread_time(), time.perf_counter(), profile)


def _postrun(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
    began = _state["started"].pop(task_id, None)
    if began is None:
        return
    cpu0, wall0, profile = began
    cpu = time.thread_time() - cpu0
    if profile is not None:
        profile.disable()
        if cpu >= PROFILE_MIN_CPU_S:
            args = "-".join(map(str, kwargs.get("args") or ()))
            profile.dump_stats(
                os.path.join(os.environ[PROFILE_ENV], f"{sender.name}-{args}-{task_id}.prof")
            )
    # Imported here for the reason _on_verdict gives: ingest's selectors import its models.
    from ingest.selectors import pool_decode_cpu_s
    from investigations.window_cache import CACHE

    _write(
        {
            "event": "task",
            "task": sender.name,
            "cpu_s": cpu,
            "wall_s": time.perf_counter() - wall0,
            "args": list(kwargs.get("args") or ()),
            "pid": os.getpid(),
            "pool_cpu_s": pool_decode_cpu_s(),
            # The worker's window cache: entries dropped for its bound so far (each costs
            # its job's next evaluation a read of the whole window).
            "evictions": CACHE.evictions,
            # Per job held: [full reads, delta reads, reads of series new to the catalogs] so
            # far, so the bench can tell which evaluations read more than their delta.
            "reads": CACHE.read_counts(),
            "t": time.time(),
        }
    )


def _on_verdict(note: Any) -> None:
    # Imported when a verdict arrives, not at the top: a worker imports this module
    # (`--include`) before Django's app registry is ready, and models need it.
    from django.db.models import Max

    from investigations.models import Incident, JobActivity
    from tenants.context import tenant_context

    with tenant_context(note.operator_id):
        job_pk = (
            Incident.objects.for_tenant(note.operator_id)
            .filter(pk=note.incident_id)
            .values_list("job_id", flat=True)
            .first()
        )
        activity = JobActivity.objects.for_tenant(note.operator_id)
        if job_pk is not None:
            row = activity.filter(job_id=job_pk).first()
            data_ts = row.last_data_ts if row is not None else None
            through = row.evaluated_through_ts if row is not None else None
        else:
            data_ts = activity.aggregate(m=Max("last_data_ts"))["m"]
            through = None
    _write(
        {
            "event": "verdict",
            "kind": note.kind,
            "operator": note.operator_id,
            "incident": note.incident_id,
            "job_pk": job_pk,
            "family": note.family,
            "data_ts": data_ts,
            "evaluated_through_ts": through,
            "t": time.time(),
        }
    )


def install(path: str) -> None:
    """Start recording into `path` in this process (idempotent)."""
    from investigations import notifications

    _state["path"] = path
    if _state["receiver"] is None:
        signals.task_prerun.connect(_prerun, weak=False)
        signals.task_postrun.connect(_postrun, weak=False)
        _state["receiver"] = notifications.subscribe(_on_verdict)


def uninstall() -> None:
    from investigations import notifications

    if _state["receiver"] is not None:
        signals.task_prerun.disconnect(_prerun)
        signals.task_postrun.disconnect(_postrun)
        notifications.unsubscribe(_state["receiver"])
        _state["receiver"] = None
    _state["path"] = None
    _state["started"].clear()


def read(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _in_worker(**kwargs: Any) -> None:
    """A `celery worker` started with this module included (and each of its prefork
    children): record there when PROOF_BENCH_PROBE names the file."""
    if os.environ.get(ENV):
        install(os.environ[ENV])


signals.worker_init.connect(_in_worker, weak=False)
signals.worker_process_init.connect(_in_worker, weak=False)
