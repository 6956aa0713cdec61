"""Ingest's periodic tasks (scheduled in proof_web/schedule.py): rollups, partitions, retention."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import connections

from ingest import services, storage

log = logging.getLogger(__name__)


@shared_task(name="ingest.rollup_recent_hours")
def rollup_recent_hours() -> int:
    """Hourly rollups of the last 3 hours (the current one included) for every operator."""
    return services.rollup_recent_hours(hours=3)


@shared_task(name="ingest.maintain_partitions")
def maintain_partitions() -> dict[str, list[str]]:
    """Create the sample partitions for the coming week and drop those past retention.

    Needs the schema owner (DATABASE_OWNER_URL) — only the owner may create or drop tables.
    Where the worker runs without it, `manage.py ingest_maintain` does the same from wherever
    migrations run (and every `migrate` extends the partitions); until then new rows land in
    the default partition, so nothing is refused.
    """
    if "owner" not in connections.settings or connections["owner"].vendor != "postgresql":
        if connections["default"].vendor == "postgresql":
            log.warning(
                "ingest.maintain_partitions: no DATABASE_OWNER_URL in this worker; run "
                "`manage.py ingest_maintain` where the owner's credentials are"
            )
        else:
            storage.drop_expired_partitions(settings.INGEST_RETENTION_DAYS)
        return {"created": [], "dropped": []}
    return maintain(connections["owner"].alias)


def maintain(using: str) -> dict[str, list[str]]:
    connection = connections[using]
    created = storage.ensure_partitions(connection, days_back=1, days_ahead=7)
    dropped = storage.drop_expired_partitions(settings.INGEST_RETENTION_DAYS, connection)
    return {"created": created, "dropped": dropped}


@shared_task(name="ingest.delete_expired_rows")
def delete_expired_rows() -> int:
    """Retention for logs, events, receipts (and rollups, kept 10× longer)."""
    return services.delete_expired_rows(settings.INGEST_RETENTION_DAYS)
