"""The Celery app. Every periodic task is declared in proof_web/schedule.py with its reason."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")

app = Celery("proof")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _load_schedule() -> None:
    from proof_web.schedule import BEAT_SCHEDULE

    app.conf.beat_schedule = {name: entry.as_celery() for name, entry in BEAT_SCHEDULE.items()}


app.on_after_configure.connect(lambda sender, **kwargs: _load_schedule(), weak=False)
