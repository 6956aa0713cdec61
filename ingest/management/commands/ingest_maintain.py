"""`manage.py ingest_maintain`: create the coming week's sample partitions and drop those past
retention, as the schema owner (for deployments whose workers hold no owner credentials)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ingest.tasks import maintain


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: Any, **options: Any) -> None:
        if "owner" not in connections.settings and connections["default"].vendor == "postgresql":
            raise CommandError("ingest_maintain needs DATABASE_OWNER_URL (the schema owner)")
        result = maintain("owner" if "owner" in connections.settings else "default")
        self.stdout.write(
            f"partitions created: {len(result['created'])}, dropped: {len(result['dropped'])}"
        )
