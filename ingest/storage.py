"""Raw-SQL storage of sample blocks: DDL, time partitions, COPY writes, range reads.

PostgreSQL: `ingest_sample_block` is partitioned by RANGE (start_ms), one partition per UTC
day, created ahead by `ensure_partitions()` (a periodic task on the owner connection, because
only the owner may create tables) and dropped whole by `drop_expired_partitions()` — retention
without DELETE or VACUUM. A DEFAULT partition catches anything outside the prepared days, so a
write never fails for want of a partition. Row-level security is enabled and forced on the
parent (tenants/rls.py via register_rls_table) and on every partition, because a query naming
a partition directly is checked against the partition's own policies, not the parent's.
Writes are pre-encoded blocks (ingest/blocks.py): one row per node per batch.

SQLite (embedded default): the same table, unpartitioned.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from tenants.rls import app_role, policy_sql

log = logging.getLogger(__name__)

BLOCK_TABLE = "ingest_sample_block"
BLOCK_COLUMNS = (
    "operator_id",
    "node_id",
    "start_ms",
    "end_ms",
    "series_count",
    "sample_count",
    "payload",
)
DAY_MS = 86_400_000
_PARTITION_RE = re.compile(rf"^{BLOCK_TABLE}_p(\d{{8}})$")
# The longest time span one batch may cover; reads look this far before t0 for blocks that
# started earlier and reach into the window.
MAX_BLOCK_SPAN_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class BlockRow:
    operator_id: int
    node_id: int
    start_ms: int
    end_ms: int
    series_count: int
    sample_count: int
    payload: bytes


# The columns both backends share (the payload's type and SQLite's rowid are their own).
_BLOCK_COLUMNS = (
    "operator_id bigint NOT NULL, node_id bigint NOT NULL, start_ms bigint NOT NULL, "
    "end_ms bigint NOT NULL, series_count integer NOT NULL, sample_count integer NOT NULL"
)
_BLOCK_INDEX = (
    f"CREATE INDEX {BLOCK_TABLE}_node_time ON {BLOCK_TABLE} (operator_id, node_id, start_ms)"
)


def create_block_table(connection: BaseDatabaseWrapper) -> None:
    """Create the table (migration 0002). On PostgreSQL also the default partition and the
    partitions around today."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"CREATE TABLE {BLOCK_TABLE} ({_BLOCK_COLUMNS}, payload bytea NOT NULL) "
                "PARTITION BY RANGE (start_ms)"
            )
            # Blocks are already zstd-compressed: keep PostgreSQL from trying pglz on them.
            cursor.execute(f"ALTER TABLE {BLOCK_TABLE} ALTER COLUMN payload SET STORAGE EXTERNAL")
            cursor.execute(_BLOCK_INDEX)
            cursor.execute(f"CREATE TABLE {BLOCK_TABLE}_default PARTITION OF {BLOCK_TABLE} DEFAULT")
            _secure_partition(connection, f"{BLOCK_TABLE}_default")
        else:
            cursor.execute(
                f"CREATE TABLE {BLOCK_TABLE} (id integer PRIMARY KEY AUTOINCREMENT, "
                f"{_BLOCK_COLUMNS}, payload blob NOT NULL)"
            )
            cursor.execute(_BLOCK_INDEX)
    if connection.vendor == "postgresql":
        ensure_partitions(connection, days_back=8, days_ahead=7)


def drop_block_table(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {BLOCK_TABLE} CASCADE")


def _secure_partition(connection: BaseDatabaseWrapper, table: str) -> None:
    with connection.cursor() as cursor:
        for statement in policy_sql(table, "operator_id"):
            cursor.execute(statement)
        role = app_role()
        if role and role != connection.settings_dict["USER"]:
            quoted = connection.ops.quote_name(role)
            cursor.execute(f"GRANT SELECT, INSERT, DELETE ON {table} TO {quoted}")


def _day_start(day: datetime) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def partition_names(connection: BaseDatabaseWrapper) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s ORDER BY 1",
            [BLOCK_TABLE],
        )
        return [row[0] for row in cursor.fetchall()]


def ensure_partitions(
    connection: BaseDatabaseWrapper | None = None,
    *,
    days_back: int = 1,
    days_ahead: int = 7,
    now: datetime | None = None,
) -> list[str]:
    """Create the daily partitions from `days_back` days ago to `days_ahead` days ahead that do
    not exist yet; returns the names created. Needs the owner connection."""
    connection = connection or connections[owner_alias()]
    if connection.vendor != "postgresql":
        return []
    today = _day_start(now or datetime.now(UTC))
    existing = set(partition_names(connection))
    created = []
    for offset in range(-days_back, days_ahead + 1):
        day = today + timedelta(days=offset)
        name = f"{BLOCK_TABLE}_p{day:%Y%m%d}"
        if name in existing:
            continue
        lo = int(day.timestamp() * 1000)
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(
                    f"CREATE TABLE {name} PARTITION OF {BLOCK_TABLE} "
                    f"FOR VALUES FROM ({lo}) TO ({lo + DAY_MS})"
                )
                cursor.execute(f"ALTER TABLE {name} ALTER COLUMN payload SET STORAGE EXTERNAL")
                _secure_partition(connection, name)
        except Exception:
            # Rows for that day already sit in the default partition (written while no
            # partition existed): they stay there, readable, until retention removes them.
            log.exception("could not create partition %s", name)
            continue
        created.append(name)
    return created


def drop_expired_partitions(
    retention_days: int, connection: BaseDatabaseWrapper | None = None, now: datetime | None = None
) -> list[str]:
    """Retention: drop whole daily partitions older than `retention_days` (PostgreSQL), or
    delete the old rows (SQLite). Returns the partitions dropped."""
    connection = connection or connections[owner_alias()]
    cutoff = _day_start(now or datetime.now(UTC)) - timedelta(days=retention_days)
    cutoff_ms = int(cutoff.timestamp() * 1000)
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {BLOCK_TABLE} WHERE end_ms < %s", [cutoff_ms])  # noqa: S608 - our table constant; the cutoff is a parameter
        return []
    dropped = []
    for name in partition_names(connection):
        match = _PARTITION_RE.match(name)
        if not match:
            continue
        day = datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)
        if int(day.timestamp() * 1000) + DAY_MS <= cutoff_ms:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE {name}")
            dropped.append(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {BLOCK_TABLE}_default WHERE end_ms < %s", [cutoff_ms])  # noqa: S608 - our table constant; the cutoff is a parameter
    return dropped


def owner_alias() -> str:
    return "owner" if "owner" in connections.settings else "default"


def write_blocks(rows: Sequence[BlockRow], using: str = "default") -> None:
    """Append blocks inside the caller's transaction.

    Not COPY: PostgreSQL refuses COPY FROM into a table with row-level security for a role it
    applies to ("COPY FROM not supported with row-level security"). Nothing is lost by it —
    samples arrive pre-encoded, one row per node per batch (tens of thousands of samples), so
    the statement count per batch is the same either way.
    """
    if not rows:
        return
    columns = ", ".join(BLOCK_COLUMNS)
    sql = f"INSERT INTO {BLOCK_TABLE} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s)"  # noqa: S608 - our table and column constants; values are parameters
    params = [
        (r.operator_id, r.node_id, r.start_ms, r.end_ms, r.series_count, r.sample_count, r.payload)
        for r in rows
    ]
    connection = connections[using]
    if connection.vendor == "postgresql":
        # Bound server-side, the payload sent as binary: Django's cursors bind client-side,
        # which spells a ~66 KB block as ~132 KB of hex for PostgreSQL to parse back (0.45 ms
        # of CPU a block between the two). Same connection, transaction and tenant setting.
        # Its errors as Django's (DataError, OperationalError…), as the writer tells them apart.
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as raw:
            if len(params) == 1:  # the usual batch (one node): executemany's pipeline costs more
                raw.execute(sql, params[0])
            else:
                raw.executemany(sql, params)
        return
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def read_block_payloads(
    operator_id: int,
    node_ids: Iterable[int],
    t0_ms: int,
    t1_ms: int,
    using: str = "default",
    *,
    with_node: bool = False,
) -> list[Any]:
    """Payloads of the blocks of these nodes that overlap [t0_ms, t1_ms], in time order
    (`with_node`: (node id, payload) pairs).

    The caller is inside tenant_context(operator_id); the operator filter is also explicit so
    that SQLite (no row-level security) is scoped the same way.
    """
    ids = sorted(set(node_ids))
    if not ids:
        return []
    connection = connections[using]
    placeholders = ", ".join(["%s"] * len(ids))
    sql = (
        f"SELECT node_id, payload FROM {BLOCK_TABLE} WHERE operator_id = %s "  # noqa: S608 - our table constant and %s placeholders; values are parameters
        f"AND node_id IN ({placeholders}) AND start_ms >= %s AND start_ms <= %s "
        "AND end_ms >= %s ORDER BY start_ms"
    )
    params = [operator_id, *ids, t0_ms - MAX_BLOCK_SPAN_MS, t1_ms, t0_ms]
    if connection.vendor == "postgresql":
        # Binary results: bytea as is, not hex text to parse (half the bytes, no parsing).
        # Django's cursors bind client-side, which cannot return binary; a plain psycopg
        # cursor on the same connection (same transaction, same tenant setting) can.
        connection.ensure_connection()
        with psycopg.Cursor(connection.connection) as raw:
            raw.execute(sql, params, binary=True)
            rows = raw.fetchall()
    else:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
    if with_node:
        return [(int(node), bytes(payload)) for node, payload in rows]
    return [bytes(payload) for _node, payload in rows]


def block_table_bytes(using: str = "default") -> int:
    """Bytes on disk of all sample blocks (all partitions, TOAST and indexes included)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relkind IN ('r', 'p') AND (c.relname = %s OR c.relname LIKE %s)",
            [BLOCK_TABLE, BLOCK_TABLE + "\\_%"],
        )
        return int(cursor.fetchone()[0])
