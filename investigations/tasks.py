"""Celery tasks of the live pipeline: ids in, rows re-read, one service call.

`evaluate_job` and `evaluate_fleet_health` take the operator id first. They check it like
tenants' `tenant_task` but do not wrap the whole body in one tenant transaction: the services
open short tenant_context() transactions of their own around each read and write, because the
detectors run for seconds between them and, on the embedded SQLite, a read transaction that
later writes fails once ingest has committed in between. The fan-out tasks read across
tenants (system_context) and only enqueue.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from investigations import selectors, services

log = logging.getLogger(__name__)


def _operator(operator_id: Any, task: str) -> int:
    if isinstance(operator_id, bool) or not isinstance(operator_id, int):
        raise TypeError(
            f"{task}: the first argument must be the operator id (an int), got {operator_id!r}"
        )
    return operator_id


@shared_task(name="investigations.evaluate_job", ignore_result=True)
def evaluate_job(operator_id: int, job_id: int) -> str:
    result = services.evaluate_job(_operator(operator_id, "evaluate_job"), int(job_id))
    return result.status


@shared_task(name="investigations.evaluate_fleet_health", ignore_result=True)
def evaluate_fleet_health(operator_id: int, gpu_id: str) -> str:
    result = services.evaluate_fleet_health(
        _operator(operator_id, "evaluate_fleet_health"), str(gpu_id)
    )
    return result.status


@shared_task(name="investigations.fan_out_job_evaluations", ignore_result=True)
def fan_out_job_evaluations() -> int:
    """Enqueue evaluate_job for every active job with unevaluated data, of every operator."""
    due = selectors.jobs_due_for_evaluation(services.ACTIVE_S)
    for operator_id, job_pk in due:
        evaluate_job.delay(operator_id, job_pk)
    return len(due)


@shared_task(name="investigations.fan_out_fleet_health", ignore_result=True)
def fan_out_fleet_health() -> int:
    """Enqueue evaluate_fleet_health for every recently reported GPU of every operator."""
    due = selectors.gpus_due_for_fleet_health()
    for operator_id, gpu in due:
        evaluate_fleet_health.delay(operator_id, gpu)
    return len(due)
