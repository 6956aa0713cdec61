"""The current tenant on the database connection: the second wall behind for_tenant().

On PostgreSQL every tenant-owned table has a policy that admits a row when its operator column
is the operator granted to the current transaction, or when the transaction was granted every
tenant (tenants/rls.py). A grant is a row the application role cannot write or even read
(`proof_private.rls_grants`, keyed by backend and transaction id); the one way to make one is
`proof_rls_set()`, which checks a proof of the state asked for, signed with a key derived from
PROOF_SECRET_KEY. The proof is computed here and sent as a server-side bound parameter, so no
query text shows it: an SQL injection cannot set a tenant or the system context, whatever
set_config(), SET ROLE or RESET it tries (tenants/tests/test_rls_injection.py).

`tenant_context()` opens a transaction (or savepoint) and grants the operator; a grant names its
transaction, so it ends with it and can never leak to the next request or task that reuses the
pooled connection. Outside any context tenant-owned tables read as empty: the wall fails closed.

`system_context()` is for the few deliberate cross-tenant reads: resolving a token or a
session's membership to its operator, fleet-wide periodic fan-out, the staff admin site. It is
the same connection and the same transaction as the code around it, so a system block that
writes inside a tenant's transaction (do_create_membership, the webhook's event row) commits or
rolls back with it: nothing is split across connections.
On SQLite (embedded default) both are plain transactions; for_tenant() is the only wall.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from tenants.rls import rls_key, rls_message, rls_proof

R = TypeVar("R")

# Proofs by (operator, keep_operator, all_tenants): an HMAC-like hash per context entry is
# microseconds, but ingest enters a context per batch.
_PROOFS: dict[tuple[int | None, bool, bool], str] = {}
_PROOF_KEY: list[bytes] = []


def _proof(operator: int | None, keep_operator: bool, all_tenants: bool) -> str:
    key = rls_key()
    if not _PROOF_KEY or _PROOF_KEY[0] != key:  # PROOF_SECRET_KEY changed (tests override it)
        _PROOF_KEY[:] = [key]
        _PROOFS.clear()
    wanted = (operator, keep_operator, all_tenants)
    proof = _PROOFS.get(wanted)
    if proof is None:
        proof = rls_proof(key, rls_message(operator, keep_operator, all_tenants))
        if len(_PROOFS) < 100_000:
            _PROOFS[wanted] = proof
    return proof


def _grant(
    connection: BaseDatabaseWrapper, operator: int | None, keep_operator: bool, all_tenants: bool
) -> tuple[str, str]:
    """Grant the state to this connection's transaction in one round trip; return the previous
    one as (operator, system) strings ("" when none), the form _IN_FORCE keeps."""
    connection.ensure_connection()
    # psycopg.Cursor binds parameters on the server: the proof travels apart from the query
    # text, which is all pg_stat_activity shows other sessions. Wrapped as Django wraps its own
    # cursors, so the statement is counted and logged like any other (without its values).
    # (Any: django-stubs types the argument as Django's own wrapper, which it then wraps.)
    raw: Any = psycopg.Cursor(connection.connection)
    cursor = (
        connection.make_debug_cursor(raw)
        if connection.queries_logged
        else connection.make_cursor(raw)
    )
    with cursor:
        cursor.execute(
            "SELECT previous_operator, previous_all_tenants FROM proof_rls_set(%s, %s, %s, %s)",
            [operator, keep_operator, all_tenants, _proof(operator, keep_operator, all_tenants)],
        )
        row = cursor.fetchone()
    previous_operator = "" if row[0] is None else str(row[0])
    return previous_operator, "on" if row[1] else ""


def _swap_settings(using: str, operator: str | None, system: str) -> tuple[str, str]:
    """Grant the tenant state in one round trip; return the old one.

    `operator=None` leaves the operator as it is (system_context keeps it). Ingest enters a
    context per batch, so each statement saved here is one round trip per batch.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return "", ""
    return _grant(
        connection,
        None if not operator else int(operator),
        operator is None,
        system == "on",
    )


def _set_settings(using: str, operator: str | None, system: str) -> None:
    """Grant the tenant state in one round trip (`operator=None` leaves the operator as it is)."""
    _swap_settings(using, operator, system)


# The settings a tenant_context()/system_context() put in force on a connection's open
# transaction, as (operator, system), kept on the connection while the block runs: a context
# nested in one of the same tenant (a selector called inside a service's context) then needs
# no round trips to set and restore what is already set. Anything else (None: unknown) takes
# the full path, so a stale value can only cost a round trip, never scope a query wrongly.
_IN_FORCE = "proof_tenant_in_force"
_SYSTEM = ("", "on")


@contextmanager
def _settings_block(using: str, wanted: tuple[str, str], operator: str | None) -> Iterator[None]:
    connection = connections[using]
    in_force = getattr(connection, _IN_FORCE, None)
    if in_force == wanted and wanted != _SYSTEM and connection.in_atomic_block:
        # Nested in a block of the same tenant: join its transaction. No savepoint either: a
        # SAVEPOINT and its RELEASE are two round trips, and selectors nest a dozen of these
        # in one evaluation. Code that must undo part of a block on an error opens its own
        # transaction.atomic() (the IntegrityError catches do).
        yield
        return
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=using):
        in_force = getattr(connection, _IN_FORCE, None)
        if outermost:
            # A transaction of its own: set_config(..., is_local) ends with it, so there is
            # nothing to read first or restore after — one round trip, not two (ingest opens
            # one of these per batch, an evaluation four).
            _set_settings(using, operator, wanted[1])
        else:
            previous_operator, previous_system = _swap_settings(using, operator, wanted[1])
        setattr(connection, _IN_FORCE, wanted)
        try:
            # On an exception the transaction/savepoint rollback undoes set_config by itself.
            yield
        finally:
            setattr(connection, _IN_FORCE, in_force)
        if not outermost:
            _swap_settings(using, None if operator is None else previous_operator, previous_system)


@contextmanager
def tenant_context(operator_id: int, using: str = "default") -> Iterator[None]:
    """Run the block as operator `operator_id` (inside a transaction or savepoint; nested in a
    block of the same operator it joins that block's transaction)."""
    operator = str(int(operator_id))
    with _settings_block(using, (operator, ""), operator):
        yield


@contextmanager
def system_context(using: str = "default") -> Iterator[None]:
    """Run the block with cross-tenant visibility. Keep these blocks small and few."""
    # The operator setting is kept as it is; what is in force is then not a plain tenant's.
    with _settings_block(using, _SYSTEM, None):
        yield


def current_operator_id(using: str = "default") -> int | None:
    """The operator set on this connection's transaction, if any (PostgreSQL only)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT proof_rls_operator()")
        value = cursor.fetchone()[0]
    return int(value) if value is not None else None


def activate_tenant_in_transaction(operator_id: int, using: str = "default") -> None:
    """Set the tenant for the rest of the transaction already open on `using`.

    For code that cannot wrap its work in tenant_context() because the tenant becomes known
    only part-way through (DRF authenticates inside the view's transaction).
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        raise RuntimeError("activate_tenant_in_transaction() needs an open transaction")
    _swap_settings(using, str(int(operator_id)), "")
    # Unknown from here on (it cannot be restored when the transaction ends): nested contexts
    # set their settings in full.
    setattr(connection, _IN_FORCE, None)


def tenant_task(func: Callable[..., R]) -> Callable[..., R]:
    """Run a task body as the operator given as its first argument.

    Celery tasks take ids, so the tenant is the first positional argument; put this under
    `@shared_task`:

        @shared_task
        @tenant_task
        def recompute(operator_id: int, job_id: int) -> None: ...
    """

    @functools.wraps(func)
    def wrapper(operator_id: int, *args: Any, **kwargs: Any) -> R:
        if isinstance(operator_id, bool) or not isinstance(operator_id, int):
            raise TypeError(
                f"{func.__qualname__}: the first argument must be the operator id (an int), "
                f"got {operator_id!r}"
            )
        with tenant_context(operator_id):
            return func(operator_id, *args, **kwargs)

    return wrapper
