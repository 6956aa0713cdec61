"""notify hears the investigations app's notifications: in the evaluation's transaction it
writes the outbox rows owed (investigations.notifications.notification_in_transaction; for a
forecast that crossed into drain or urgent, investigations.forecast_services.
forecast_crossed_in_transaction, in the forecast pass's transaction), and after that
transaction commits it asks a worker to deliver them at once (the periodic pass in
proof_web/schedule.py catches anything this kick misses)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.dispatch import receiver

from investigations.forecast_services import forecast_crossed_in_transaction
from investigations.models import ComponentForecast
from investigations.notifications import Notification, notification_in_transaction
from notify import services, tasks


def kick_delivery() -> None:
    tasks.deliver_due.delay()


@receiver(notification_in_transaction, dispatch_uid="notify-outbox")
def write_outbox(sender: Any, *, notification: Notification, **kwargs: Any) -> None:
    # All of it in a savepoint: should anything here fail, the signal logs it and the
    # evaluation's transaction is intact (on PostgreSQL a failed statement outside one would
    # abort it). The kick is robust: a broker that is down must not fail the committed
    # evaluation; the periodic pass sends the rows.
    with transaction.atomic():
        queued = services.enqueue_for_notification(notification)
    if queued:
        transaction.on_commit(kick_delivery, robust=True)


@receiver(forecast_crossed_in_transaction, dispatch_uid="notify-forecast-outbox")
def write_forecast_outbox(
    sender: Any, *, operator_id: int, forecast: ComponentForecast, previous: str, **kwargs: Any
) -> None:
    # As write_outbox: in a savepoint of the forecast pass's transaction, so the rows commit
    # with the forecast that crossed, and a failure here leaves the pass intact.
    with transaction.atomic():
        queued = services.enqueue_for_forecast(operator_id, forecast, previous)
    if queued:
        transaction.on_commit(kick_delivery, robust=True)
