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
    # evaluate_job(operator_id, job_id), sent positionally by the services and the fan-out.
    ids = list(args or ()) or [(kwargs or {}).get(k) for k in ("operator_id", "job_id")]
    if len(ids) < 2 or ids[0] is None or ids[1] is None:
        return None
    return {"queue": eval_queue(int(ids[0]), int(ids[1]), queues)}
