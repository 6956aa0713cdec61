"""Column-wise bulk inserts for the seeder.

PostgreSQL refuses `COPY FROM` into a table with row-level security for a role it applies to
(ingest/storage.py says the same of the sample blocks), and every tenant-owned table here has
it forced. The next fastest statement that the policy still checks is one `INSERT … SELECT *
FROM unnest(array, array, …)` per chunk of rows: each column travels as one array parameter
(bound server-side, binary), so 50,000 rows cost one round trip and no per-row SQL text. On
SQLite (the embedded default) the same rows go through `bulk_create`.

Every call runs inside the caller's tenant_context: the policy's WITH CHECK then refuses any
row of another operator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from django.db import connection, connections, models
from django.utils import timezone

CHUNK = 50_000
# Rows holding a verdict (~7 KB of JSON each) go in smaller statements.
JSON_CHUNK = 2_000


def _column_list(values: Any) -> list[Any]:
    if isinstance(values, np.ndarray):
        return list(values.tolist())
    return list(values)


def insert_columns(model: type[models.Model], columns: dict[str, Any]) -> int:
    """Insert rows given column by column (field name → sequence or numpy array, all of one
    length); JSON fields take Python objects. Returns the rows inserted. A field left out gets
    what Django would give it — its default, now for auto_now(_add), NULL — and the id its
    sequence."""
    names = list(columns)
    data = [_column_list(columns[n]) for n in names]
    count = len(data[0]) if data else 0
    if any(len(col) != count for col in data):
        raise ValueError(f"{model.__name__}: columns of different lengths")
    if count == 0:
        return 0
    now = timezone.now()
    for field in model._meta.concrete_fields:
        if field.primary_key or field.name in columns or field.attname in columns:
            continue
        if field.generated:  # the database computes it (Incident.gpu_hours_lost)
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            value: Any = now
        elif field.has_default():
            value = field.get_default()
        elif field.null:
            value = None
        else:
            raise ValueError(f"{model.__name__}.{field.name} needs a value")
        names.append(field.attname)
        data.append([value] * count)
    fields: list[Any] = [model._meta.get_field(n) for n in names]
    if connection.vendor != "postgresql":
        _bulk_create(model, fields, data, count)
        return count
    chunk = JSON_CHUNK if any(isinstance(f, models.JSONField) for f in fields) else CHUNK
    casts = []
    for field, col_index in zip(fields, range(len(fields)), strict=True):
        db_type = field.db_type(connection)
        if isinstance(field, models.JSONField):
            data[col_index] = [None if v is None else json.dumps(v) for v in data[col_index]]
            casts.append("%s::text[]::jsonb[]")
        else:
            casts.append(f"%s::{db_type}[]")
    targets = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
    sql = (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({targets}) "  # noqa: S608 - table and column names from the model's own meta; values are parameters
        f"SELECT * FROM unnest({', '.join(casts)})"
    )
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        for lo in range(0, count, chunk):
            cursor.execute(sql, [col[lo : lo + chunk] for col in data])
    return count


def _bulk_create(
    model: type[models.Model], fields: Sequence[Any], data: list[list[Any]], count: int
) -> None:
    attnames = [f.attname for f in fields]
    objs = [model(**{a: data[c][i] for c, a in enumerate(attnames)}) for i in range(count)]
    model.objects.bulk_create(objs, batch_size=2000)  # type: ignore[attr-defined]


def ids_of(model: type[models.Model], key_field: str, keys: Sequence[Any]) -> dict[Any, int]:
    """The ids of the rows whose `key_field` is one of `keys` (in the caller's tenant scope)."""
    found: dict[Any, int] = {}
    manager: Any = model.objects  # type: ignore[attr-defined]
    for lo in range(0, len(keys), CHUNK):
        rows = manager.filter(**{f"{key_field}__in": list(keys[lo : lo + CHUNK])}).values_list(
            key_field, "id"
        )
        found.update({k: int(i) for k, i in rows})
    return found


def analyze(tables: Sequence[str]) -> None:
    """Vacuum the tables just filled and refresh their planner statistics, as autovacuum
    would minutes later. Until then PostgreSQL plans as if they were as small as before the
    seed (a fleet page's rollup join ran 10 minutes on such plans), and with no page marked
    all-visible no index-only scan is used (the jobs list's per-job counts read the heap of
    every process: 0.052 -> 0.022 ms a job once vacuumed). Only the owner may VACUUM and
    ANALYZE: the owner alias when it is configured (else the app role, which PostgreSQL lets
    skip with a warning). VACUUM runs outside a transaction (Django's autocommit)."""
    from ingest.storage import owner_alias

    target = connections[owner_alias()]
    with target.cursor() as cursor:
        if target.vendor == "postgresql":
            names = ", ".join(target.ops.quote_name(t) for t in tables)
            cursor.execute(("VACUUM (ANALYZE) " if target.get_autocommit() else "ANALYZE ") + names)
        else:
            cursor.execute("ANALYZE")
