"""`migrate` that runs as the schema owner when one is configured.

On PostgreSQL the application role may not own tables (row-level security would not bind an
owner without FORCE, and an owner could switch it off), so migrations go through the "owner"
alias unless --database says otherwise.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connections


class Command(DjangoMigrate):
    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("database") in (None, "default"):
            if "owner" in connections.settings:
                options["database"] = "owner"
            elif connections["default"].vendor == "postgresql":
                raise CommandError(
                    "migrate on PostgreSQL runs as the schema owner: set DATABASE_OWNER_URL "
                    "(the application role in DATABASE_URL may not own tables)"
                )
        super().handle(*args, **options)
