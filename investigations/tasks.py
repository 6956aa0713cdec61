"""Celery tasks of the live pipeline: ids in, rows re-read, one service call.

The same task objects run everywhere: on the broker's workers in production and on the
in-process runner's workers in the embedded default (proof_web/runner.py, which also sends the
periodic ones of proof_web/schedule.py). Which of the two is the Celery configuration chosen at
startup (proof_web/settings.py), never a switch in the code that enqueues.

`evaluate_job` and `evaluate_fleet_health` take the operator id first (checked to be an int)
and open no transaction around the service: the services scope each read and their one write
in short `tenant_context()` blocks of their own, row-level security on in each. One tenant
transaction around the detectors' whole run would, on the embedded SQLite (whose transactions
take the write lock at BEGIN), lock ingest's writers out for as long as the detectors run.
The fan-out tasks read across tenants (system_context) and only enqueue.

`enqueue_evaluation` answers the services' `investigations.signals.evaluation_due` (sent after
the commit that stored a job's data) with `evaluate_job.apply_async`, so the services never
import this module.

`enqueue_answer` hears `ask_services.question_asked` (sent after the commit of a question asked
about an incident) and enqueues `answer_question`.

`enqueue_explanation` hears each new verdict revision being saved (Django's post_save of
`VerdictRevision`) and, after its commit, enqueues `explain_verdict` for it: the investigation
agent's cited explanation (investigations/explain_services.py, docs/investigations.md). The
verdict never waits for it; a revision superseded before its turn is skipped.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from investigations import (
    ask_services,
    cadence,
    explain_services,
    forecast_services,
    selectors,
    services,
)
from investigations.models import RevisionKind, VerdictRevision
from investigations.signals import evaluation_due

log = logging.getLogger(__name__)


def _operator_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"the first argument must be the operator id (an int), got {value!r}")
    return value


@shared_task(name="investigations.evaluate_job", ignore_result=True)
def evaluate_job(operator_id: int, job_id: int) -> str:
    return services.evaluate_job(_operator_id(operator_id), int(job_id)).status


@shared_task(name="investigations.evaluate_fleet_health", ignore_result=True)
def evaluate_fleet_health(operator_id: int, gpu_id: str) -> str:
    return services.evaluate_fleet_health(_operator_id(operator_id), str(gpu_id)).status


@shared_task(name="investigations.evaluate_node_health", ignore_result=True)
def evaluate_node_health(operator_id: int, hostname: str) -> dict[str, str]:
    """Fleet health of every GPU of one node (GPU uuid → status)."""
    results = services.evaluate_node_health(_operator_id(operator_id), str(hostname))
    return {gpu: r.status for gpu, r in results.items()}


@shared_task(name="investigations.fan_out_job_evaluations", ignore_result=True)
def fan_out_job_evaluations() -> int:
    """Enqueue evaluate_job for every active job, of every operator, with data no evaluation
    saw in the last ROUTINE_S (the routine pass; signs in a batch bring evaluations forward),
    unless its cost holds it longer (cadence.routine_due) or one this fan-out enqueued is
    still waiting (cadence.claim_fan_out). Returns how many it enqueued."""
    due = selectors.jobs_due_for_evaluation(services.ACTIVE_S, cadence.ROUTINE_S)
    queued = [
        (op, pk) for op, pk in due if cadence.routine_due(op, pk) and cadence.claim_fan_out(op, pk)
    ]
    for operator_id, job_pk in queued:
        evaluate_job.delay(operator_id, job_pk)
    return len(queued)


@shared_task(name="investigations.fan_out_fleet_health", ignore_result=True)
def fan_out_fleet_health() -> int:
    """Enqueue evaluate_node_health for every node with a recently reported GPU, of every
    operator: one task per node reads the node's data once for all its GPUs (a task per GPU
    fetched and decoded the node's blocks of the last 6 h once per GPU: 8 times on an 8-GPU
    node). Returns the number of nodes."""
    due = selectors.nodes_due_for_fleet_health()
    for operator_id, hostname in due:
        evaluate_node_health.delay(operator_id, hostname)
    return len(due)


@shared_task(name="investigations.forecast_operator", ignore_result=True)
def forecast_operator(operator_id: int) -> int:
    """One days-ahead forecast pass over the operator's fleet (docs/fleet-health.md)."""
    return forecast_services.run_forecast_pass(_operator_id(operator_id)).flagged


@shared_task(name="investigations.fan_out_forecasts", ignore_result=True)
def fan_out_forecasts() -> int:
    """A forecast pass per operator with a GPU reported in the last day; returns how many."""
    operators = sorted({op for op, _host in selectors.nodes_due_for_fleet_health()})
    for operator_id in operators:
        forecast_operator.delay(operator_id)
    return len(operators)


@receiver(evaluation_due, dispatch_uid="investigations.tasks.enqueue_evaluation")
def enqueue_evaluation(
    sender: Any, *, operator_id: int, job_pk: int, countdown: float, **kwargs: Any
) -> None:
    """A job's new data is due for an evaluation: enqueue the task, `countdown` s from now."""
    evaluate_job.apply_async((operator_id, job_pk), countdown=countdown)


@shared_task(name="investigations.explain_verdict", ignore_result=True)
def explain_verdict(operator_id: int, incident_pk: int, revision: int) -> str:
    """The investigation agent's explanation of one verdict revision."""
    return explain_services.explain_incident(
        _operator_id(operator_id), int(incident_pk), int(revision)
    )


@receiver(
    post_save, sender=VerdictRevision, dispatch_uid="investigations.tasks.enqueue_explanation"
)
def enqueue_explanation(
    sender: Any, *, instance: VerdictRevision, created: bool, **kwargs: Any
) -> None:
    """A new verdict revision (not a resolve): explain it once its transaction commits."""
    if not created or not settings.PROOF_EXPLAIN or instance.kind == RevisionKind.RESOLVED:
        return
    args = (instance.operator_id, instance.incident_id, instance.number)
    transaction.on_commit(lambda: explain_verdict.delay(*args))


@shared_task(name="investigations.answer_question", ignore_result=True)
def answer_question(operator_id: int, question_pk: int) -> str:
    """The answer to one question asked about an incident (investigations/ask_services.py)."""
    return ask_services.answer_question(_operator_id(operator_id), int(question_pk))


@shared_task(name="investigations.expire_stale_questions", ignore_result=True)
def expire_stale_questions() -> int:
    """Questions pending past ask_services.STALE_S are refused as not answered in time."""
    return ask_services.expire_stale_questions()


@receiver(ask_services.question_asked, dispatch_uid="investigations.tasks.enqueue_answer")
def enqueue_answer(sender: Any, *, operator_id: int, question_pk: int, **kwargs: Any) -> None:
    """A question was stored (after its commit): answer it."""
    answer_question.delay(operator_id, question_pk)
