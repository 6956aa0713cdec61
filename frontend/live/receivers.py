"""What the console's live updates do when the apps below announce something.

Connected once in FrontendConfig.ready(); nothing below imports this. Each receiver works
after the commit of what it announces (a verdict's evaluation, a batch), reads nothing from
the database, and never raises into the pipeline (frontend.live.publish logs and goes on).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import receiver

from frontend.live import groups
from frontend.live.points import PointsThrottle, newest_points
from frontend.live.publish import publish
from ingest.signals import batch_stored, job_state_changed
from investigations.notifications import Notification, verdict_notification

POINTS = PointsThrottle()


def verdict_message(note: Notification) -> dict[str, Any]:
    return {
        "type": "verdict",
        "incident": note.incident_public_id,
        "job": note.job,
        "family": note.family,
        "category": note.category,
        "title": str(note.verdict.get("title") or note.family),
        "revision": note.revision,
        "kind": note.kind,
        "url": f"/incidents/{note.incident_public_id}/",
    }


@receiver(verdict_notification, dispatch_uid="frontend.live.verdict")
def send_verdict(sender: Any, *, notification: Notification, **kwargs: Any) -> None:
    """Sent after the evaluation committed (investigations.notifications), in its thread."""
    note = notification
    publish(
        groups.verdict_groups(note.operator_id, note.incident_id, note.job, note.customer_id),
        verdict_message(note),
    )


@receiver(job_state_changed, dispatch_uid="frontend.live.job_state")
def send_job_state(
    sender: Any,
    *,
    operator_id: int,
    job_id: str,
    customer_id: int | None,
    state: str,
    **kwargs: Any,
) -> None:
    """Sent inside the batch's transaction: published once it commits."""
    message = {"type": "job", "job": job_id, "state": state}
    targets = groups.job_state_groups(operator_id, job_id, customer_id)
    transaction.on_commit(lambda: publish(targets, message))


@receiver(batch_stored, dispatch_uid="frontend.live.points")
def send_points(sender: Any, *, operator_id: int, batch: Any = None, **kwargs: Any) -> None:
    """The newest charted values of the batch's jobs, to the jobs' open pages, at most one
    message per job every POINTS_INTERVAL_S (frontend/live/points.py); after commit."""
    if batch is None or not len(batch.series):
        return
    try:
        per_job = newest_points(batch)
    except Exception:  # a malformed batch must not roll the batch back over a chart
        return
    messages = [
        message
        for job_id, (t, charts) in per_job.items()
        if (message := POINTS.offer(operator_id, job_id, t, charts)) is not None
    ]
    if messages:
        transaction.on_commit(lambda: _send_points(operator_id, messages))


def _send_points(operator_id: int, messages: list[dict[str, Any]]) -> None:
    for message in messages:
        publish({groups.job_group(operator_id, str(message["job"]))}, message)
