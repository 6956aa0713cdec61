from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.models.signals import post_migrate

# Neither imports a model, so both are safe to import while the app registry loads.
from ingest.storage import BLOCK_TABLE, ensure_partitions
from tenants.rls import app_role, register_rls_table


def _extend_partitions(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """Every migrate (run as the schema owner) also prepares the coming week's partitions."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.settings_dict["USER"] == app_role():
        return
    if BLOCK_TABLE in connection.introspection.table_names():
        ensure_partitions(connection, days_back=1, days_ahead=7)


class IngestConfig(AppConfig):
    name = "ingest"

    def ready(self) -> None:
        # The parent table; each partition gets the same policy when it is created
        # (ingest/storage.py), since direct access to a partition skips the parent's policy.
        register_rls_table(BLOCK_TABLE)
        post_migrate.connect(_extend_partitions, sender=self)
