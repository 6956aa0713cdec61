from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _extend_partitions(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """Every migrate (run as the schema owner) also prepares the coming week's partitions."""
    from django.db import connections

    from ingest.storage import BLOCK_TABLE, ensure_partitions
    from tenants.rls import app_role

    connection = connections[using]
    if connection.vendor != "postgresql" or connection.settings_dict["USER"] == app_role():
        return
    if BLOCK_TABLE in connection.introspection.table_names():
        ensure_partitions(connection, days_back=1, days_ahead=7)


class IngestConfig(AppConfig):
    name = "ingest"

    def ready(self) -> None:
        from ingest.storage import BLOCK_TABLE
        from tenants.rls import register_rls_table

        # The parent table; each partition gets the same policy when it is created
        # (ingest/storage.py), since direct access to a partition skips the parent's policy.
        register_rls_table(BLOCK_TABLE)
        post_migrate.connect(_extend_partitions, sender=self)
