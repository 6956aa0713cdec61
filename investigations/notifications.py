"""The notification hook: fires exactly once per new verdict and once per change of its
category or family — never for a confidence wiggle or more evidence of the same thing.

Subscribers (the console, chat, webhooks) connect a receiver:

    from investigations.notifications import verdict_notification

    @receiver(verdict_notification)
    def on_verdict(sender, *, notification: Notification, **kwargs): ...

or call `subscribe(fn)` with a function taking one `Notification`.

Exactly-once: `record()` inserts a `NotificationLog` row, unique on (incident, kind, family,
category), in the evaluation's own transaction. Only the transaction that inserted the row
sends the signal, and only after it commits (`on_commit`), so
- a retried task, a second evaluation or a concurrent one that reaches the same
  notification hits the unique key and sends nothing;
- an evaluation that rolls back sends nothing and leaves no row, so its retry sends it.
A category that flips back to one already notified for the incident is not notified again
(the key already exists): flapping between two categories costs two notifications, not one
per flap. Subscribers run in the committing thread; one that raises is logged and does not
stop the others (`send_robust`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.dispatch import Signal

from investigations.models import Incident, NotificationKind, NotificationLog, VerdictRevision

log = logging.getLogger(__name__)

verdict_notification = Signal()
# Sent inside the evaluation's transaction, right after the claim (and for a resolve, right
# after the incident is marked resolved), for subscribers that must write in the same
# transaction (an outbox: notify/receivers.py). Receivers take `notification=Notification`; one
# that raises is logged and the evaluation goes on, so each must write in a savepoint.
notification_in_transaction = Signal()


@dataclass(frozen=True)
class Notification:
    operator_id: int
    incident_id: int
    incident_public_id: str
    revision: int
    kind: str  # NotificationKind: "new" or "changed"
    family: str
    category: str
    previous_family: str | None
    previous_category: str | None
    job: str | None  # the scheduler job id, None for fleet-health incidents
    customer_id: int | None
    verdict: dict[str, Any]


def subscribe(fn: Callable[[Notification], None]) -> Callable[..., None]:
    """Connect a plain function; returns the receiver (keep it to disconnect)."""

    def receiver(sender: Any, *, notification: Notification, **kwargs: Any) -> None:
        fn(notification)

    verdict_notification.connect(receiver, weak=False)
    return receiver


def unsubscribe(receiver: Callable[..., None]) -> None:
    verdict_notification.disconnect(receiver)


def record(
    incident: Incident,
    revision: VerdictRevision,
    kind: NotificationKind,
    *,
    previous_family: str | None = None,
    previous_category: str | None = None,
) -> bool:
    """Claim the notification inside the caller's transaction; send it after commit.

    Returns False (and sends nothing) when this notification was already claimed."""
    try:
        with transaction.atomic():
            NotificationLog.objects.create(
                operator_id=incident.operator_id,
                incident=incident,
                revision=revision,
                kind=kind,
                family=revision.family,
                category=revision.category,
            )
    except IntegrityError:
        return False
    job = incident.job
    note = Notification(
        operator_id=incident.operator_id,
        incident_id=incident.pk,
        incident_public_id=str(incident.public_id),
        revision=revision.number,
        kind=str(kind),
        family=revision.family,
        category=revision.category,
        previous_family=previous_family,
        previous_category=previous_category,
        job=job.job_id if job is not None else None,
        customer_id=job.customer_id if job is not None else None,
        verdict=revision.verdict,
    )
    _send_in_transaction(note)
    transaction.on_commit(lambda: _send(note))
    return True


def _send(note: Notification) -> None:
    for receiver, result in verdict_notification.send_robust(sender=Incident, notification=note):
        if isinstance(result, Exception):
            log.error(
                "notification subscriber %r failed on incident %s: %s",
                receiver,
                note.incident_public_id,
                result,
                exc_info=result,
            )


def record_resolved(incident: Incident) -> None:
    """Announce an incident's resolve inside the caller's transaction (paging resolves its
    alert). No claim row: an incident resolves once, unless a person reopens it
    (investigations/incident_actions.py), and each resolve then closes the alert again."""
    job = incident.job
    verdict = incident.verdict
    _send_in_transaction(
        Notification(
            operator_id=incident.operator_id,
            incident_id=incident.pk,
            incident_public_id=str(incident.public_id),
            revision=incident.revision,
            kind="resolved",
            family=incident.family,
            category=incident.category,
            previous_family=None,
            previous_category=None,
            job=job.job_id if job is not None else None,
            customer_id=job.customer_id if job is not None else None,
            verdict=verdict,
        )
    )


def _send_in_transaction(note: Notification) -> None:
    for receiver, result in notification_in_transaction.send_robust(
        sender=Incident, notification=note
    ):
        if isinstance(result, Exception):
            log.error(
                "in-transaction notification subscriber %r failed on incident %s: %s",
                receiver,
                note.incident_public_id,
                result,
                exc_info=result,
            )
