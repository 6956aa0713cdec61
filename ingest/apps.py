from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"

    def ready(self) -> None:
        from ingest.storage import BLOCK_TABLE
        from tenants.rls import register_rls_table

        # The parent table; each partition gets the same policy when it is created
        # (ingest/storage.py), since direct access to a partition skips the parent's policy.
        register_rls_table(BLOCK_TABLE)
