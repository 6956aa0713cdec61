"""Issue 16's reproduction: as the application role, no statement reads another tenant's rows.

Before, the policy admitted every row when `current_setting('proof.system') = 'on'`, which
the application role may set itself, so one `SELECT set_config('proof.system', 'on', true)`
in an injected statement read every tenant. Now the tenant in force is a grant the role can
only obtain with a proof signed by a key it cannot read (tenants/rls.py, tenants/context.py).
Each test plays the injection: raw SQL on the application's own connection.

PostgreSQL only (CI runs them); on SQLite they skip, saying so.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from tenants.context import _proof, system_context, tenant_context
from tenants.models import Customer, Operator
from tenants.rls import rls_message, rls_proof
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip(
            "row-level security exists only on PostgreSQL: export DATABASE_URL and "
            "DATABASE_OWNER_URL (see DEVELOPERS.md) to run these"
        )


def _fetch(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def _exec(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def _customer_slugs() -> set[str]:
    return {row[0] for row in _fetch("SELECT slug FROM tenants_customer")}


def _refused(sql: str, match: str, params: list[Any] | None = None, *, after: str = "") -> None:
    """`sql` (then `after`, in the same transaction) fails with an error matching `match`."""
    with pytest.raises(DatabaseError, match=match), transaction.atomic():
        _exec(sql, params)
        if after:
            _exec(after)


@pytest.fixture
def two() -> tuple[Tenant, Tenant]:
    return make_tenant("inj-a"), make_tenant("inj-b")


def test_setting_proof_system_no_longer_reads_every_tenant(two: tuple[Tenant, Tenant]) -> None:
    a, b = two
    with tenant_context(a.operator.pk):
        assert _customer_slugs() == {"inj-a-customer"}
        # The exact statement of the issue, then the same as SET LOCAL and as a session SET.
        _fetch("SELECT set_config('proof.system', 'on', true)")
        assert _customer_slugs() == {"inj-a-customer"}
        _exec("SET LOCAL proof.system = 'on'")
        assert _customer_slugs() == {"inj-a-customer"}
        assert _fetch("SELECT id FROM tenants_customer WHERE id = %s", [b.customer.pk]) == []
    # Outside any context too: the settings admit nothing.
    _fetch("SELECT set_config('proof.system', 'on', true)")
    assert _customer_slugs() == set()
    assert _fetch("SELECT count(*) FROM tenants_operator") == [(0,)]


def test_setting_another_operator_id_reads_nothing_of_it(two: tuple[Tenant, Tenant]) -> None:
    a, b = two
    with tenant_context(a.operator.pk):
        _fetch("SELECT set_config('proof.operator_id', %s, true)", [str(b.operator.pk)])
        assert _customer_slugs() == {"inj-a-customer"}
        _fetch("SELECT set_config('proof.operator_id', %s, false)", [str(b.operator.pk)])
        assert _customer_slugs() == {"inj-a-customer"}
        # Writing B's rows: nothing updated, an insert refused by the policy's WITH CHECK.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE tenants_customer SET name = 'pwned' WHERE id = %s", [b.customer.pk]
            )
            assert cursor.rowcount == 0
        _refused(
            "INSERT INTO tenants_customer (operator_id, name, slug, created_at) "
            "VALUES (%s, 'smuggled', 'smuggled', now())",
            "row-level security",
            [b.operator.pk],
        )
    _exec("RESET proof.operator_id")
    with system_context():
        assert Customer.objects.get(pk=b.customer.pk).name == "Customer inj-b-customer"


def test_role_tricks_are_refused(two: tuple[Tenant, Tenant]) -> None:
    owner_role = str(settings.DATABASES["owner"]["USER"])
    assert connection.settings_dict["USER"] != owner_role
    _refused(f'SET ROLE "{owner_role}"', "permission denied")
    _refused(f'SET SESSION AUTHORIZATION "{owner_role}"', "permission denied")
    _refused("SET ROLE postgres", "permission denied")
    _refused(
        "SET LOCAL row_security = off", "row-level security", after="SELECT * FROM tenants_customer"
    )
    # RESET ROLE / RESET ALL / DISCARD leave the role what it was: still nothing to read.
    with tenant_context(two[0].operator.pk):
        _exec("RESET ROLE")
        _exec("RESET ALL")
        assert _customer_slugs() <= {"inj-a-customer"}
    assert _customer_slugs() == set()
    _refused("DROP POLICY proof_tenant_isolation ON tenants_customer", "must be owner")
    _refused("ALTER TABLE tenants_customer NO FORCE ROW LEVEL SECURITY", "must be owner")
    # Nor can it replace what the policy calls, or shadow it.
    _refused(
        "CREATE OR REPLACE FUNCTION public.proof_rls_all_tenants() RETURNS boolean "
        "LANGUAGE sql AS 'SELECT true'",
        "must be owner|permission denied",
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE FUNCTION pg_temp.proof_rls_all_tenants() RETURNS boolean "
                "LANGUAGE sql AS 'SELECT true'"
            )
            cursor.execute("SET LOCAL search_path = pg_temp, public")
        assert _customer_slugs() == set()


def test_the_grants_and_the_key_are_out_of_reach(two: tuple[Tenant, Tenant]) -> None:
    a, b = two
    _refused("SELECT * FROM proof_private.rls_grants", "permission denied")
    _refused("SELECT * FROM proof_private.rls_key", "permission denied")
    _refused(
        "INSERT INTO proof_private.rls_grants VALUES (pg_backend_pid(), "
        "pg_current_xact_id(), NULL, true)",
        "permission denied",
    )
    # Proofs travel as parameters; `proof setup-db` keeps the app role's out of the log, and
    # the role cannot put them back.
    assert _fetch("SHOW log_parameter_max_length") == [("0",)], "run `proof setup-db`"
    _refused("SET log_parameter_max_length = -1", "permission denied")
    # The function's source is readable by anyone: it must not hold the key.
    ((source,),) = _fetch("SELECT prosrc FROM pg_proc WHERE proname = 'proof_rls_set'")
    assert "rls_key" in source and _proof(None, True, True) not in source
    # Guessing, or signing with another key (a default PROOF_SECRET_KEY, say), is refused.
    for proof in ("", "0" * 64, rls_proof(b"another key", rls_message(None, True, True))):
        _refused(
            "SELECT * FROM proof_rls_set(NULL, true, true, %s)",
            "tenant context refused",
            [proof],
        )
    # The real proof for A does not open B, nor the system context.
    proof_a = _proof(a.operator.pk, False, False)
    _refused(
        "SELECT * FROM proof_rls_set(%s, false, false, %s)",
        "tenant context refused",
        [b.operator.pk, proof_a],
    )
    _refused(
        "SELECT * FROM proof_rls_set(%s, false, true, %s)",
        "tenant context refused",
        [a.operator.pk, proof_a],
    )
    assert _customer_slugs() == set()


def test_no_other_session_sees_a_proof_in_the_query_text(two: tuple[Tenant, Tenant]) -> None:
    """pg_stat_activity shows each session's last statement to other sessions of the same
    role: the proof is a bound parameter, so what it shows is `$4`."""
    params = connection.settings_dict
    with system_context():
        pid = connection.connection.info.backend_pid
        with psycopg.connect(
            host=params["HOST"],
            port=params["PORT"] or 5432,
            user=params["USER"],
            password=params["PASSWORD"],
            dbname=params["NAME"],
            autocommit=True,
        ) as spy:
            row = spy.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    assert row is not None
    (query,) = row
    assert "proof_rls_set" in query and "$4" in query, query
    assert _proof(None, True, True) not in query


def test_a_grant_ends_with_its_transaction(two: tuple[Tenant, Tenant]) -> None:
    a, _ = two
    with tenant_context(a.operator.pk):
        assert _customer_slugs() == {"inj-a-customer"}
        with system_context():
            assert {"inj-a-customer", "inj-b-customer"} <= _customer_slugs()
        assert _customer_slugs() == {"inj-a-customer"}
    assert _customer_slugs() == set()
    assert _fetch("SELECT proof_rls_operator(), proof_rls_all_tenants()") == [(None, False)]


@pytest.mark.django_db(transaction=True)
def test_a_committed_grant_does_not_carry_to_the_next_transaction() -> None:
    a = make_tenant("inj-c")
    with system_context():  # outermost: its own transaction, committed
        assert Operator.objects.filter(pk=a.operator.pk).exists()
    with transaction.atomic():
        assert _customer_slugs() == set()
        assert _fetch("SELECT proof_rls_all_tenants()") == [(False,)]
    with tenant_context(a.operator.pk):
        assert _customer_slugs() == {"inj-c-customer"}
    assert _customer_slugs() == set()


def test_a_system_write_inside_a_tenant_transaction_rolls_back_with_it(
    two: tuple[Tenant, Tenant],
) -> None:
    """One connection, one transaction: a system block nested in a tenant's (as
    do_create_membership and the Stripe webhook have) commits or rolls back with it."""
    a, _ = two

    class Boom(Exception):
        pass

    with pytest.raises(Boom), tenant_context(a.operator.pk):
        with system_context():
            Operator.objects.create(name="Nested", slug="inj-nested")
        Customer.objects.create(operator=a.operator, name="After", slug="inj-after")
        raise Boom
    with system_context():
        assert not Operator.objects.filter(slug="inj-nested").exists()
        assert not Customer.objects.filter(slug="inj-after").exists()
