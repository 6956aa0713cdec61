"""The outbox worker's task: the periodic pass (proof_web/schedule.py) and the kick after each
commit that queued rows (notify/receivers.py) run the same pass (notify/delivery.py)."""

from __future__ import annotations

from celery import shared_task

from notify import delivery


# Celery ships no types (pyproject's mypy overrides): the decorator is untyped.
@shared_task(name="notify.deliver_due", ignore_result=True)  # type: ignore[untyped-decorator]
def deliver_due() -> int:
    return delivery.deliver_due()
