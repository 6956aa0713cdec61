"""Row-level security, checked against the PostgreSQL catalog and with raw SQL.

These bypass the ORM's for_tenant() on purpose: they prove the second wall holds on its own.
They need PostgreSQL (CI runs them); on SQLite they skip, saying so.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from tenants.context import system_context, tenant_context
from tenants.models import Customer
from tenants.rls import POLICY_NAME
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgres_only(settings: object) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(
            "row-level security exists only on PostgreSQL: export DATABASE_URL and "
            "DATABASE_OWNER_URL (see DEVELOPERS.md) to run these"
        )
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # type: ignore[attr-defined]


def _fetch(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def test_every_table_with_an_operator_column_has_rls_enabled_and_forced() -> None:
    rows = _fetch(
        """
        SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
               EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = %s)
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema()
          AND c.relkind IN ('r', 'p')
          AND (c.relname = 'tenants_operator' OR EXISTS (
                SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attname = 'operator_id' AND NOT a.attisdropped))
        ORDER BY c.relname
        """,
        [POLICY_NAME],
    )
    tables = {name for name, *_ in rows}
    # The enumeration itself must see the tenancy tables, or this test proves nothing.
    assert {
        "tenants_operator",
        "tenants_customer",
        "tenants_membership",
        "tenants_apitoken",
        "tenants_agenttoken",
        "tenants_jobmappingrule",
    } <= tables
    unprotected = [
        f"{name} (enabled={enabled}, forced={forced}, policy={has_policy})"
        for name, enabled, forced, has_policy in rows
        if not (enabled and forced and has_policy)
    ]
    assert not unprotected, f"tenant-owned tables without forced RLS: {unprotected}"


def test_raw_sql_in_tenant_context_cannot_read_or_write_another_tenant() -> None:
    a, b = make_tenant("rla"), make_tenant("rlb")
    with tenant_context(a.operator.pk):
        slugs = {row[0] for row in _fetch("SELECT slug FROM tenants_customer")}
        assert slugs == {"rla-customer"}
        operators = _fetch("SELECT id FROM tenants_operator")
        assert operators == [(a.operator.pk,)]
        assert _fetch("SELECT id FROM tenants_customer WHERE id = %s", [b.customer.pk]) == []
        # Tokens, memberships: same wall.
        assert (
            _fetch("SELECT 1 FROM tenants_membership WHERE operator_id = %s", [b.operator.pk]) == []
        )
        # UPDATE/DELETE of B's rows touch nothing.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE tenants_customer SET name = 'pwned' WHERE id = %s", [b.customer.pk]
            )
            assert cursor.rowcount == 0
            cursor.execute("DELETE FROM tenants_customer WHERE id = %s", [b.customer.pk])
            assert cursor.rowcount == 0
        # INSERT of a row for B is refused by the policy's WITH CHECK.
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            _fetch(
                "INSERT INTO tenants_customer (operator_id, name, slug, created_at) "
                "VALUES (%s, 'smuggled', 'smuggled', now()) RETURNING id",
                [b.operator.pk],
            )
        # Moving one of A's rows to B is refused too.
        with pytest.raises(DatabaseError, match="row-level security"), transaction.atomic():
            _fetch(
                "UPDATE tenants_customer SET operator_id = %s WHERE id = %s RETURNING id",
                [b.operator.pk, a.customer.pk],
            )
    with system_context():
        assert Customer.objects.get(pk=b.customer.pk).name == "Customer rlb-customer"
        assert not Customer.objects.filter(slug="smuggled").exists()


def test_outside_any_tenant_context_tenant_tables_read_empty() -> None:
    make_tenant("rlc")
    assert _fetch("SELECT count(*) FROM tenants_customer") == [(0,)]
    assert _fetch("SELECT count(*) FROM tenants_operator") == [(0,)]
    with system_context():
        assert _fetch("SELECT count(*) FROM tenants_customer")[0][0] >= 1


def test_application_role_is_restricted_and_owns_nothing() -> None:
    ((role, is_super, bypass_rls),) = _fetch(
        "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
    )
    assert (is_super, bypass_rls) == (False, False), f"{role} must be NOSUPERUSER NOBYPASSRLS"
    owned = _fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
        "AND tableowner = current_user"
    )
    assert owned == [], f"the application role {role} owns tables: {owned}"
    owners = {
        row[0]
        for row in _fetch(
            "SELECT tableowner FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename = 'tenants_customer'"
        )
    }
    assert owners and role not in owners
    # And it cannot switch RLS off.
    with pytest.raises(DatabaseError, match="must be owner"), transaction.atomic():
        _fetch("ALTER TABLE tenants_customer DISABLE ROW LEVEL SECURITY")


def test_nested_contexts_scope_like_the_innermost_and_restore_the_outer() -> None:
    """A context nested in one of the same tenant sets nothing again (no set_config round
    trip: selectors called inside a service's context); another tenant's or the system context
    nested inside still scopes its block, and the outer tenant is back after it."""
    a, b = make_tenant("rln-a"), make_tenant("rln-b")

    def slugs() -> set[str]:
        return {row[0] for row in _fetch("SELECT slug FROM tenants_customer")}

    with tenant_context(a.operator.pk):
        with CaptureQueriesContext(connection) as same, tenant_context(a.operator.pk):
            assert slugs() == {"rln-a-customer"}
        assert not any("set_config" in q["sql"] for q in same.captured_queries)
        with tenant_context(b.operator.pk):
            assert slugs() == {"rln-b-customer"}
            with tenant_context(b.operator.pk):
                assert slugs() == {"rln-b-customer"}
        assert slugs() == {"rln-a-customer"}
        with system_context():
            assert {"rln-a-customer", "rln-b-customer"} <= slugs()
            with tenant_context(a.operator.pk):  # the system setting is not "a" in force
                assert slugs() == {"rln-a-customer"}
        assert slugs() == {"rln-a-customer"}
    assert slugs() == set()
