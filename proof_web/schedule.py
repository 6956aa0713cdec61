"""All periodic tasks in one place, each with the reason it runs at that rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Periodic:
    task: str
    every_seconds: float
    reason: str
    kwargs: dict[str, Any] | None = None

    def as_celery(self) -> dict[str, Any]:
        return {"task": self.task, "schedule": self.every_seconds, "kwargs": self.kwargs or {}}


BEAT_SCHEDULE: dict[str, Periodic] = {}
