""" "Ask about this incident" (docs/investigations.md): questions stored, answered by a task.

- `do_ask(principal, incident public id, question)`: the question checked (non-blank, at most
  `investigator.ask.MAX_QUESTION_CHARS`), the incident looked up among those the principal
  may see (another tenant's, another customer's, a fleet-health incident for a customer:
  Http404), the `IncidentQuestion` row (state pending) and its audit entry written in one
  transaction; `question_asked` is announced after the commit, and investigations.tasks
  answers it with the `investigations.answer_question` task (the model takes 10–30 s on a
  2-core host: the request never waits for it).
- `answer_question(operator_id, question pk)`: what the task runs. It re-reads the row, builds
  the job's window as the explanation does (explain_services.job_window), runs
  `investigator.ask.ask` outside any transaction, and stores the answer — validated model text
  or a refusal saying why — only if the row is still pending (a second delivery of the task
  changes nothing).
- `expire_stale_questions()`: a question still pending after `STALE_S` (its task lost with a
  worker) is refused as not answered in time, never retried forever.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from django.db import transaction
from django.dispatch import Signal
from django.http import Http404
from django.utils import timezone

from investigations import explain_services
from investigations.incident_actions import ActionInputError
from investigations.models import Incident, IncidentQuestion, QuestionState
from investigator.ask import ask, question_error
from investigator.model import EndpointRefused, ExplainUnavailable, Writer
from tenants.access import Principal
from tenants.audit import actor_label, record_audit
from tenants.context import system_context, tenant_context

log = logging.getLogger(__name__)

# Announced after the commit of a new question: keyword arguments operator_id, question_pk.
question_asked = Signal()
# A question pending this long is refused (its task was lost): the model answers in ~10–30 s.
STALE_S = 15 * 60


def _incident(principal: Principal, public_id: uuid.UUID | str) -> Incident:
    try:
        key = uuid.UUID(str(public_id))
    except ValueError:
        raise Http404("No such incident.") from None
    incident = (
        Incident.objects.for_tenant(principal).select_related("job").filter(public_id=key).first()
    )
    if incident is None:
        raise Http404("No such incident.")
    return incident


def do_ask(principal: Principal, public_id: uuid.UUID | str, question: str) -> IncidentQuestion:
    """Store the question (pending) with its audit entry; its answer comes from the task."""
    problem = question_error(str(question or ""))
    if problem:
        raise ActionInputError("question", problem)
    text = str(question).strip()
    with tenant_context(principal.operator_id):
        incident = _incident(principal, public_id)
        actor = actor_label(principal)
        row = IncidentQuestion.objects.create(
            operator_id=incident.operator_id,
            incident=incident,
            revision=incident.revision,
            asked_by=actor,
            asked_by_user_id=principal.user_id if principal.api_token_id is None else None,
            question=text,
        )
        record_audit(
            principal,
            "incident.question_asked",
            "incident",
            incident.public_id,
            customer_id=incident.job.customer_id if incident.job is not None else None,
            detail={"question": str(row.public_id), "text": text},
            actor=actor,
        )
        operator_id, pk = incident.operator_id, row.pk
        transaction.on_commit(
            lambda: question_asked.send(
                sender=IncidentQuestion, operator_id=operator_id, question_pk=pk
            )
        )
    return row


def answer_question(operator_id: int, question_pk: int, writer: Writer | None = None) -> str:
    """Answer one stored question; returns its state afterwards ("answered", "refused"), or
    "missing" (no such row for this operator) or "done" (answered before)."""
    with tenant_context(operator_id):
        row = (
            IncidentQuestion.objects.for_tenant(operator_id)
            .select_related("incident")
            .filter(pk=question_pk)
            .first()
        )
        if row is None:
            return "missing"
        if row.state != QuestionState.PENDING:
            return "done"
        verdict = dict(row.incident.verdict) if isinstance(row.incident.verdict, dict) else {}
        window = explain_services.job_window(operator_id, row.incident)
    unavailable = ""
    if writer is None:
        try:
            writer = explain_services.configured_writer()
        except (ExplainUnavailable, EndpointRefused) as exc:
            unavailable = str(exc)
    result = ask(row.question, verdict, window, writer)
    if unavailable:
        result.error = unavailable
        result.reason = f"no model is available: {unavailable}"[:500]
    state = QuestionState.REFUSED if result.refused else QuestionState.ANSWERED
    with tenant_context(operator_id):
        explain_services.write_first()
        IncidentQuestion.objects.for_tenant(operator_id).filter(
            pk=row.pk, state=QuestionState.PENDING
        ).update(
            state=state,
            answer=result.text,
            cited=result.cited,
            validated=result.validated,
            refused=result.refused,
            reason=result.reason,
            detail=result.as_dict(),
            duration_s=round(result.duration_s, 2),
            answered_at=timezone.now(),
        )
    return str(state)


def expire_stale_questions() -> int:
    """Refuse every question of every operator pending for over STALE_S; returns how many."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=STALE_S)
    with system_context():
        return IncidentQuestion.objects.filter(
            state=QuestionState.PENDING, created_at__lt=cutoff
        ).update(
            state=QuestionState.REFUSED,
            refused=True,
            answer="The question was not answered in time: ask it again.",
            reason=f"not answered within {STALE_S // 60} minutes",
            answered_at=now,
        )
