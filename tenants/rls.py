"""Row-level security for every tenant-owned table, applied in one place.

After each migrate (post_migrate, as the owner role) every table of a `TenantOwned` model,
the operator table itself, and every table registered with `register_rls_table()` (raw-SQL
tables such as ingest's partitioned sample chunks) gets RLS enabled and forced with one
policy, and the application role gets DML grants. Any other table the catalog shows with an
`operator_id` column (partitions included) is covered too. tests/test_rls.py enumerates the
catalog and fails if any table with an operator column lacks RLS.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import connections

POLICY_NAME = "proof_tenant_isolation"

# table name -> tenant column; filled by register_rls_table() from apps' ready().
_EXTRA_TABLES: dict[str, str] = {}


def register_rls_table(table: str, column: str = "operator_id") -> None:
    """Declare a table created outside the ORM models as tenant-owned."""
    _EXTRA_TABLES[table] = column


def tenant_tables() -> dict[str, str]:
    """Every tenant-owned table → the column holding its operator id."""
    # Not at module top: ingest.storage imports this module, and ingest.processing (which
    # imports storage) is used before Django is set up, when models cannot be imported.
    from tenants.models import Operator, TenantOwned

    tables: dict[str, str] = {Operator._meta.db_table: "id"}
    for model in apps.get_models():
        if issubclass(model, TenantOwned) and not model._meta.proxy:
            tables[model._meta.db_table] = "operator_id"
    tables.update(_EXTRA_TABLES)
    return tables


def policy_sql(table: str, column: str) -> list[str]:
    predicate = (
        "(current_setting('proof.system', true) = 'on' "
        f"OR {column} = NULLIF(current_setting('proof.operator_id', true), '')::bigint)"
    )
    quoted = connections["default"].ops.quote_name(table)
    return [
        f"ALTER TABLE {quoted} ENABLE ROW LEVEL SECURITY",
        f"ALTER TABLE {quoted} FORCE ROW LEVEL SECURITY",
        f"DROP POLICY IF EXISTS {POLICY_NAME} ON {quoted}",
        f"CREATE POLICY {POLICY_NAME} ON {quoted} USING {predicate} WITH CHECK {predicate}",
    ]


CATALOG_OPERATOR_TABLES_SQL = """
SELECT c.relname
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid
WHERE n.nspname = current_schema()
  AND c.relkind IN ('r', 'p')
  AND a.attname = 'operator_id'
  AND NOT a.attisdropped
"""


def app_role() -> str | None:
    """The restricted role the application connects as (None on SQLite)."""
    default = settings.DATABASES["default"]
    if "postgresql" not in str(default["ENGINE"]):
        return None
    return str(default["USER"])


def apply_rls(using: str) -> None:
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    role = app_role()
    existing: set[str] = set(connection.introspection.table_names())
    with connection.cursor() as cursor:
        tables = tenant_tables()
        # Any other table with an operator column (a partition, a raw-SQL table someone forgot
        # to register) is tenant-owned too: cover it rather than leave it open.
        cursor.execute(CATALOG_OPERATOR_TABLES_SQL)
        for (table,) in cursor.fetchall():
            tables.setdefault(table, "operator_id")
            existing.add(table)
        for table, column in tables.items():
            if table not in existing:
                continue
            for statement in policy_sql(table, column):
                cursor.execute(statement)
        if role and role != connection.settings_dict["USER"]:
            quoted_role = connection.ops.quote_name(role)
            cursor.execute(f"GRANT USAGE ON SCHEMA public TO {quoted_role}")
            cursor.execute(
                "GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public "
                f"TO {quoted_role}"
            )
            cursor.execute(
                f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {quoted_role}"
            )


def on_post_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    # A flush between transactional tests emits post_migrate on the application role, which
    # owns nothing and may not ALTER; the policies set at migrate time are still in place.
    if (
        "owner" in connections.settings
        and connections[using].vendor == "postgresql"
        and connections[using].settings_dict["USER"] == app_role()
    ):
        return
    apply_rls(using)
