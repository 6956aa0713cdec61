"""Billing's tasks (scheduled in proof_web/schedule.py): metering, the meter-event outbox,
reconciliation, dunning, the licence check, the monthly close, and releasing held verdicts."""

from __future__ import annotations

from celery import shared_task

from billing import licence, metering, services, stripe_sync


# Celery ships no types (pyproject's mypy overrides): the decorators are untyped.
@shared_task(name="billing.meter_usage", ignore_result=True)  # type: ignore[untyped-decorator]
def meter_usage() -> int:
    return metering.meter_all()


@shared_task(name="billing.deliver_meter_events", ignore_result=True)  # type: ignore[untyped-decorator]
def deliver_meter_events() -> int:
    return stripe_sync.deliver_due()


@shared_task(name="billing.reconcile", ignore_result=True)  # type: ignore[untyped-decorator]
def reconcile() -> int:
    return stripe_sync.reconcile_all()


@shared_task(name="billing.advance_dunning", ignore_result=True)  # type: ignore[untyped-decorator]
def advance_dunning() -> int:
    return len(services.advance_dunning())


@shared_task(name="billing.check_licence", ignore_result=True)  # type: ignore[untyped-decorator]
def check_licence() -> bool | None:
    status = licence.check()
    return None if status is None else status.valid


@shared_task(name="billing.close_months", ignore_result=True)  # type: ignore[untyped-decorator]
def close_months() -> int:
    return services.close_previous_months()


@shared_task(name="billing.resume_verdicts", ignore_result=True)  # type: ignore[untyped-decorator]
def resume_verdicts(operator_id: int) -> int:
    """Evaluate an operator's paused period and lift the hold (after a payment)."""
    result = services.do_resume_verdicts(operator_id)
    return 0 if result is None else result.windows
