"""What people do to an incident through the API: acknowledge, resolve, reopen, assign, comment,
link an external ticket — each one an `IncidentEvent` in the incident's history (who, when,
what it carried) and an entry in the audit log, written in the action's own transaction.

Who may do what (docs/api.md):
- operator roles with write access: everything;
- a customer's admin with write access, on its own jobs' incidents: comment and link a ticket
  (the customer's support works the ticket on its side and says so in the history);
  acknowledging, resolving, reopening and assigning stay the operator's, whose on-call owns the
  incident;
- read-only tokens and customer viewers: nothing (the API refuses them before any service).
An incident the principal may not see (another operator's, another customer's, a fleet-health
incident for a customer) is Http404, never 403: its id is not confirmed to exist.

Invalid transitions (resolve a resolved incident, acknowledge a resolved one, reopen an open
one) raise `IncidentConflict` naming the incident's state (HTTP 409).

A person's resolve is the pipeline's resolve (`services.resolve_incident`): the resolved
revision, and the in-transaction announcement notify answers with the PagerDuty resolve outbox
row. Should the finding still be there, the next evaluation opens a new incident for it (the
resolved one is history). A reopen pages nobody again; the pipeline resolves a reopened incident
again when its finding stays absent for the grace period.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q
from django.http import Http404
from django.utils import timezone

from investigations import services
from investigations.models import (
    Incident,
    IncidentEvent,
    IncidentEventKind,
    IncidentState,
    IncidentTicket,
    ResolveReason,
    TicketSystem,
)
from tenants.access import Principal
from tenants.audit import actor_label, record_audit
from tenants.context import tenant_context
from tenants.models import OPERATOR_ROLES, Membership
from tenants.services import NotAllowed, TenancyError

REASON_MAX = 500
NOTE_MAX = 10_000
COMMENT_MAX = 10_000
TICKET_ID_MAX = 200


class ActionInputError(TenancyError):
    """Bad input to an action, naming the field (HTTP 400 with that field)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class IncidentConflict(Exception):
    """The action does not apply to the incident in its current state (HTTP 409)."""

    def __init__(self, message: str, *, state: str) -> None:
        super().__init__(message)
        self.state = state


def _locked(
    principal: Principal, public_id: uuid.UUID | str, action: str, *, customers: bool = False
) -> Incident:
    """The incident, row-locked for the action, among those the principal may see; then
    whether this principal may do `action` to it (`customers`: customer admins may too). The
    lookup comes before the role check, so another customer's incident is 404 for everyone."""
    if not principal.can_write:
        raise NotAllowed(f"a read-only principal may not {action}")
    try:
        key = uuid.UUID(str(public_id))
    except ValueError:
        raise Http404("No such incident.") from None
    incident = (
        Incident.objects.for_tenant(principal)
        .select_for_update(of=("self",))
        .select_related("job", "assignee")
        .filter(public_id=key)
        .first()
    )
    if incident is None:
        raise Http404("No such incident.")
    if not (principal.is_operator or (customers and principal.is_admin)):
        who = "operator roles and customer admins" if customers else "operator roles"
        raise NotAllowed(f"only {who} may {action}")
    return incident


def _record(
    principal: Principal,
    incident: Incident,
    kind: IncidentEventKind,
    payload: dict[str, Any],
    actor: str,
) -> IncidentEvent:
    event = IncidentEvent.objects.create(
        operator_id=incident.operator_id,
        incident=incident,
        kind=kind,
        actor=actor,
        actor_user_id=principal.user_id if principal.api_token_id is None else None,
        payload=payload,
    )
    record_audit(
        principal,
        f"incident.{kind.value}",
        "incident",
        incident.public_id,
        customer_id=incident.job.customer_id if incident.job is not None else None,
        detail=payload,
        actor=actor,
    )
    return event


def _text(value: object, field: str, limit: int, *, required: bool) -> str:
    text = "" if value is None else str(value).strip()
    if required and not text:
        raise ActionInputError(field, "may not be blank")
    if len(text) > limit:
        raise ActionInputError(field, f"at most {limit} characters, got {len(text)}")
    return text


def acknowledge(principal: Principal, public_id: uuid.UUID | str) -> Incident:
    """Someone is on it: an open, unacknowledged incident becomes acknowledged."""
    with tenant_context(principal.operator_id):
        incident = _locked(principal, public_id, "acknowledge incidents")
        if incident.state != IncidentState.OPEN:
            raise IncidentConflict(
                f"incident {incident.public_id} is {incident.state}: only an open incident "
                "can be acknowledged (reopen it first)",
                state=incident.state,
            )
        if incident.acknowledged_at is not None:
            raise IncidentConflict(
                f"incident {incident.public_id} is open and already acknowledged by "
                f"{incident.acknowledged_by} at {incident.acknowledged_at.isoformat()}",
                state="acknowledged",
            )
        actor = actor_label(principal)
        incident.acknowledged_at = timezone.now()
        incident.acknowledged_by = actor
        incident.save(update_fields=["acknowledged_at", "acknowledged_by", "updated_at"])
        _record(principal, incident, IncidentEventKind.ACKNOWLEDGED, {}, actor)
    return incident


def resolve(
    principal: Principal,
    public_id: uuid.UUID | str,
    *,
    reason: str | None = None,
    note: str | None = None,
) -> Incident:
    """Resolve an open incident by hand, announcing it as the pipeline's resolve does."""
    reason_text = _text(reason, "reason", REASON_MAX, required=False)
    note_text = _text(note, "note", NOTE_MAX, required=False)
    with tenant_context(principal.operator_id):
        incident = _locked(principal, public_id, "resolve incidents")
        if incident.state != IncidentState.OPEN:
            raise IncidentConflict(
                f"incident {incident.public_id} is already {incident.state} "
                f"({incident.resolve_reason or 'no reason'})",
                state=incident.state,
            )
        actor = actor_label(principal)
        services.resolve_incident(incident, ResolveReason.MANUAL, time.time())
        payload = {"reason": reason_text, "note": note_text}
        _record(principal, incident, IncidentEventKind.RESOLVED, payload, actor)
    return incident


def reopen(principal: Principal, public_id: uuid.UUID | str) -> Incident:
    """A resolved incident is open again (unacknowledged), unless the pipeline has since opened
    another incident for the same job (or GPU) and family."""
    with tenant_context(principal.operator_id):
        incident = _locked(principal, public_id, "reopen incidents")
        if incident.state != IncidentState.RESOLVED:
            raise IncidentConflict(
                f"incident {incident.public_id} is {incident.state}: only a resolved incident "
                "can be reopened",
                state=incident.state,
            )
        same_subject = (
            Q(job_id=incident.job_id)
            if incident.job_id is not None
            else Q(job__isnull=True, subject_gpu=incident.subject_gpu)
        )
        newer = (
            Incident.objects.for_tenant(incident.operator_id)
            .filter(same_subject, family=incident.family, state=IncidentState.OPEN)
            .values_list("public_id", flat=True)
            .first()
        )
        if newer is not None:
            raise IncidentConflict(
                f"incident {incident.public_id} cannot be reopened: incident {newer} is open "
                f"for the same {'job' if incident.job_id is not None else 'GPU'} and family",
                state=incident.state,
            )
        actor = actor_label(principal)
        previous = {
            "resolve_reason": incident.resolve_reason,
            "resolved_at": incident.resolved_at.isoformat() if incident.resolved_at else None,
        }
        incident.state = IncidentState.OPEN
        incident.resolved_at = None
        incident.resolve_reason = ""
        incident.acknowledged_at = None
        incident.acknowledged_by = ""
        incident.save(
            update_fields=[
                "state",
                "resolved_at",
                "resolve_reason",
                "acknowledged_at",
                "acknowledged_by",
                "updated_at",
            ]
        )
        _record(principal, incident, IncidentEventKind.REOPENED, previous, actor)
    return incident


def _operator_member(operator_id: int, who: str) -> AbstractBaseUser:
    """The operator-role user named by username or e-mail (case-insensitive)."""
    members = Membership.objects.for_tenant(operator_id).filter(role__in=sorted(OPERATOR_ROLES))
    user_model = get_user_model()
    users = list(
        user_model.objects.filter(
            Q(username=who) | Q(email__iexact=who),
            pk__in=members.values("user_id"),
            is_active=True,
        )[:2]
    )
    exact = [u for u in users if u.get_username() == who]
    if exact:
        return exact[0]
    if len(users) == 1:
        return users[0]
    if users:
        raise ActionInputError("user", f"{who!r} is the e-mail of several members; give a username")
    raise ActionInputError("user", f"no active operator member has the username or e-mail {who!r}")


def assign(principal: Principal, public_id: uuid.UUID | str, *, user: str | None) -> Incident:
    """Give the incident to an operator member (a username or e-mail), or to nobody (None)."""
    who = None if user is None else _text(user, "user", 254, required=True)
    with tenant_context(principal.operator_id):
        incident = _locked(principal, public_id, "assign incidents")
        assignee = _operator_member(principal.operator_id, who) if who is not None else None
        previous = incident.assignee.get_username() if incident.assignee is not None else None
        actor = actor_label(principal)
        incident.assignee = assignee  # type: ignore[assignment]
        incident.save(update_fields=["assignee", "updated_at"])
        payload = {
            "assignee": assignee.get_username() if assignee is not None else None,
            "previous": previous,
        }
        _record(principal, incident, IncidentEventKind.ASSIGNED, payload, actor)
    return incident


def comment(principal: Principal, public_id: uuid.UUID | str, *, body: str) -> IncidentEvent:
    """A comment in the incident's history (open or resolved)."""
    text = _text(body, "body", COMMENT_MAX, required=True)
    with tenant_context(principal.operator_id):
        incident = _locked(principal, public_id, "comment on incidents", customers=True)
        return _record(
            principal, incident, IncidentEventKind.COMMENTED, {"body": text}, actor_label(principal)
        )


def link_ticket(
    principal: Principal,
    public_id: uuid.UUID | str,
    *,
    system: str,
    ticket_id: str,
    url: str = "",
) -> tuple[IncidentTicket, bool]:
    """Link an external ticket; (the ticket, whether it is new). The same system and ticket id
    linked again returns the existing link and records nothing."""
    if system not in TicketSystem.values:
        raise ActionInputError(
            "system", f"{system!r} is not one of {', '.join(TicketSystem.values)}"
        )
    ticket_key = _text(ticket_id, "ticket_id", TICKET_ID_MAX, required=True)
    with tenant_context(principal.operator_id):
        incident = _locked(principal, public_id, "link tickets to incidents", customers=True)
        existing = incident.tickets.filter(system=system, ticket_id=ticket_key).first()
        if existing is not None:
            return existing, False
        actor = actor_label(principal)
        ticket = IncidentTicket.objects.create(
            operator_id=incident.operator_id,
            incident=incident,
            system=system,
            ticket_id=ticket_key,
            url=url,
            linked_by=actor,
        )
        payload = {"system": system, "ticket_id": ticket_key, "url": url}
        _record(principal, incident, IncidentEventKind.TICKET_LINKED, payload, actor)
    return ticket, True
