"""Which queue a task goes to: each job's evaluations always to the same one of
`PROOF_EVAL_QUEUES` queues (a hash of operator and job), so the worker consuming it keeps the
job's recent data between evaluations (investigations/window_cache.py) instead of every worker
reading the whole window once. Fleet-health evaluations (one GPU each, every 10 min) and the
fan-outs stay on the default queue, which every worker consumes.

Production: start worker k with `-Q proof.eval.<k>,celery` (docs/live-pipeline.md). With one
queue (the default) nothing is routed: every worker takes every task.
"""

from __future__ import annotations

import zlib
from typing import Any

from django.conf import settings

EVAL_QUEUE_PREFIX = "proof.eval."
EVALUATE_JOB = "investigations.evaluate_job"


def eval_queue(operator_id: int, job_pk: int, queues: int) -> str:
    """The queue of a job's evaluations (stable across processes: crc32, not hash())."""
    return f"{EVAL_QUEUE_PREFIX}{zlib.crc32(f'{operator_id}:{job_pk}'.encode()) % queues}"


def route_task(
    name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
) -> dict[str, str] | None:
    """Celery router (settings CELERY_TASK_ROUTES)."""
    queues = int(getattr(settings, "PROOF_EVAL_QUEUES", 1))
    if name != EVALUATE_JOB or queues <= 1:
        return None
    operator_id, job_pk = (args or [None, None])[:2] if args else (None, None)
    if operator_id is None:
        operator_id, job_pk = (kwargs or {}).get("operator_id"), (kwargs or {}).get("job_id")
    if operator_id is None or job_pk is None:
        return None
    return {"queue": eval_queue(int(operator_id), int(job_pk), queues)}
