"""Row-level security for every tenant-owned table, applied in one place.

After each migrate (post_migrate, as the owner role) every table of a `TenantOwned` model,
the operator table itself, and every table registered with `register_rls_table()` (raw-SQL
tables such as ingest's partitioned sample chunks) gets RLS enabled and forced with one
policy, and the application role gets DML grants. Any other table the catalog shows with an
`operator_id` column (partitions included) is covered too. tests/test_rls.py enumerates the
catalog and fails if any table with an operator column lacks RLS.

What the policy compares with is not a setting the application role may write. The tenant in
force on a transaction is a row of `proof_private.rls_grants` (backend pid, transaction id,
operator, all-tenants flag), in a schema the application role may not even look into; the one
way to write it is `proof_rls_set()`, a SECURITY DEFINER function (owned by the owner role) that
checks a proof: sha256(key || sha256(key || message)) over the state asked for, with the key in
`proof_private.rls_key` (derived from PROOF_SECRET_KEY, stored by each migrate). The app
computes the proof in-process and sends it as a bound parameter (tenants/context.py), so it
appears in no query text another session can see. An SQL injection running as the application
role can call set_config() all it likes: the policy no longer reads any setting.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import psycopg
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


def policy_sql(table: str, column: str, *, with_functions: bool = True) -> list[str]:
    """The statements that put `table` under the tenant policy. First, unless the caller has
    just installed them, the functions the policy calls (idempotent): ingest secures its
    partitions with this during its own migration, before post_migrate's apply_rls()."""
    # Sub-selects: each is an InitPlan, evaluated once per query, not once per row.
    predicate = (
        f"({column} = (SELECT public.proof_rls_operator()) "
        "OR (SELECT public.proof_rls_all_tenants()))"
    )
    quoted = connections["default"].ops.quote_name(table)
    return [
        *([RLS_FUNCTIONS_SQL] if with_functions else []),
        f"ALTER TABLE {quoted} ENABLE ROW LEVEL SECURITY",
        f"ALTER TABLE {quoted} FORCE ROW LEVEL SECURITY",
        f"DROP POLICY IF EXISTS {POLICY_NAME} ON {quoted}",
        f"CREATE POLICY {POLICY_NAME} ON {quoted} USING {predicate} WITH CHECK {predicate}",
    ]


# --- the tenant in force, kept where the application role cannot write it ------------------

# Spelled out in the SQL below too (it is a literal, not a template).
RLS_SCHEMA = "proof_private"
PROOF_TAG = "proof-rls"


def rls_key(secret_key: str | None = None) -> bytes:
    """The key proofs are made with: derived from PROOF_SECRET_KEY, so web, ingest, workers
    and migrate agree with nothing more to configure (migrate stores it in the database)."""
    secret = settings.SECRET_KEY if secret_key is None else secret_key
    return hmac.new(secret.encode(), b"proof.rls-key.v1", hashlib.sha256).digest()


def rls_message(operator: int | None, keep_operator: bool, all_tenants: bool) -> bytes:
    """What a proof covers: the state asked for, nothing else (tenants/context.py signs it)."""
    op = "keep" if keep_operator else ("" if operator is None else str(int(operator)))
    return f"{PROOF_TAG}|{op}|{'all' if all_tenants else ''}".encode()


def rls_proof(key: bytes, message: bytes) -> str:
    """sha256(key || sha256(key || message)), hex: the construction proof_rls_set() checks
    (PostgreSQL has sha256() built in; no pgcrypto needed). The outer hash over a fixed-length
    digest rules out length extension."""
    inner = hashlib.sha256(key + message).digest()
    return hashlib.sha256(key + inner).hexdigest()


# Run as the owner role after every migrate. The grants table is UNLOGGED (a grant lives no
# longer than its transaction; a crash that truncates it loses nothing) and keyed by backend
# pid: a backend runs one transaction at a time, and a grant names its transaction (xid8, never
# reused), so one left by a committed transaction can never match again.
RLS_FUNCTIONS_SQL = """
CREATE SCHEMA IF NOT EXISTS proof_private;
REVOKE ALL ON SCHEMA proof_private FROM PUBLIC;
CREATE TABLE IF NOT EXISTS proof_private.rls_key (
    id int PRIMARY KEY CHECK (id = 1),
    key bytea NOT NULL
);
CREATE UNLOGGED TABLE IF NOT EXISTS proof_private.rls_grants (
    pid int PRIMARY KEY,
    xid xid8 NOT NULL,
    operator_id bigint,
    all_tenants boolean NOT NULL
);

CREATE OR REPLACE FUNCTION public.proof_rls_set(
    p_operator bigint, p_keep_operator boolean, p_all_tenants boolean, p_proof text
) RETURNS TABLE (previous_operator bigint, previous_all_tenants boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    k bytea;
    me int := pg_backend_pid();
    msg text := 'proof-rls|'
        || CASE WHEN p_keep_operator THEN 'keep' ELSE coalesce(p_operator::text, '') END
        || '|' || CASE WHEN p_all_tenants THEN 'all' ELSE '' END;
    prev_op bigint;
    prev_all boolean;
BEGIN
    SELECT r.key INTO k FROM proof_private.rls_key r WHERE r.id = 1;
    IF k IS NULL THEN
        RAISE EXCEPTION 'tenant context refused: this database has no RLS key (run migrate)'
            USING ERRCODE = '42501';
    END IF;
    -- Compared as digests, so the time taken says nothing about how much of a guess matched.
    IF p_proof IS NULL OR p_keep_operator IS NULL OR p_all_tenants IS NULL
       OR sha256(convert_to(p_proof, 'UTF8')) <> sha256(convert_to(
            encode(sha256(k || sha256(k || convert_to(msg, 'UTF8'))), 'hex'), 'UTF8')) THEN
        RAISE EXCEPTION 'tenant context refused: the proof does not match this database''s '
            'RLS key (was migrate run with this PROOF_SECRET_KEY?)' USING ERRCODE = '42501';
    END IF;
    SELECT g.operator_id, g.all_tenants INTO prev_op, prev_all
    FROM proof_private.rls_grants g
    WHERE g.pid = me AND g.xid = pg_current_xact_id_if_assigned();
    INSERT INTO proof_private.rls_grants AS g (pid, xid, operator_id, all_tenants)
    VALUES (me, pg_current_xact_id(),
            CASE WHEN p_keep_operator THEN prev_op ELSE p_operator END, p_all_tenants)
    ON CONFLICT (pid) DO UPDATE
        SET xid = EXCLUDED.xid, operator_id = EXCLUDED.operator_id,
            all_tenants = EXCLUDED.all_tenants;
    previous_operator := prev_op;
    previous_all_tenants := coalesce(prev_all, false);
    RETURN NEXT;
END
$fn$;

CREATE OR REPLACE FUNCTION public.proof_rls_operator() RETURNS bigint
LANGUAGE sql STABLE PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT g.operator_id FROM proof_private.rls_grants g
    WHERE g.pid = pg_backend_pid() AND g.xid = pg_current_xact_id_if_assigned()
$fn$;

CREATE OR REPLACE FUNCTION public.proof_rls_all_tenants() RETURNS boolean
LANGUAGE sql STABLE PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT coalesce((SELECT g.all_tenants FROM proof_private.rls_grants g
                     WHERE g.pid = pg_backend_pid()
                       AND g.xid = pg_current_xact_id_if_assigned()), false)
$fn$;
"""


def install_rls_functions(using: str) -> None:
    """The grants table, the key and the functions the policies call (as the owner role)."""
    connection = connections[using]
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(RLS_FUNCTIONS_SQL)
    # A server-side bound parameter: the key is in no query text, not even the owner's.
    raw = connection.connection
    with psycopg.Cursor(raw) as cursor:
        cursor.execute(
            "INSERT INTO proof_private.rls_key (id, key) VALUES (1, %s) "
            "ON CONFLICT (id) DO UPDATE SET key = EXCLUDED.key",
            [rls_key()],
        )


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
    install_rls_functions(using)
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
            for statement in policy_sql(table, column, with_functions=False):
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
