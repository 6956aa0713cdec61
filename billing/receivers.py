"""The licence is checked at start: when a Celery worker (or the embedded runner's) is ready,
once, then daily by the schedule. A site without a licence file does nothing here."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready
from django.conf import settings

from billing import tasks


def check_licence_at_start(sender: Any = None, **kwargs: Any) -> None:
    if settings.LICENCE_FILE:
        tasks.check_licence.delay()


# Connected by call, not as a decorator: Celery's signals are untyped (mypy strict).
worker_ready.connect(check_licence_at_start, weak=False)
