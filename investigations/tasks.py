"""Celery tasks of the live pipeline: ids in, rows re-read, one service call.

`evaluate_job` and `evaluate_fleet_health` take the operator id first and run as that tenant
(`tenants.context.tenant_task`: one tenant transaction, row-level security on). The services
open their own short `tenant_context()` blocks too (savepoints here), because the embedded
default's evaluator thread (proof_web/commands/demo_live.py) calls them directly, outside any
task: on SQLite one transaction around the detectors would hold the write lock for their whole
run. The fan-out tasks read across tenants (system_context) and only enqueue.
"""

from __future__ import annotations

import logging

from celery import shared_task

from investigations import selectors, services
from tenants.context import tenant_task

log = logging.getLogger(__name__)


@shared_task(name="investigations.evaluate_job", ignore_result=True)
@tenant_task
def evaluate_job(operator_id: int, job_id: int) -> str:
    return services.evaluate_job(operator_id, int(job_id)).status


@shared_task(name="investigations.evaluate_fleet_health", ignore_result=True)
@tenant_task
def evaluate_fleet_health(operator_id: int, gpu_id: str) -> str:
    return services.evaluate_fleet_health(operator_id, str(gpu_id)).status


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
