"""The current tenant on the database connection: the second wall behind for_tenant().

On PostgreSQL every tenant-owned table has a policy that compares its operator column with the
transaction-local setting `proof.operator_id` (tenants/rls.py). `tenant_context()` opens a
transaction (or savepoint) and sets it with set_config(..., is_local => true), so it can never
leak to the next request or task that reuses the pooled connection. Outside any context the
setting is empty and tenant-owned tables read as empty: the wall fails closed.

`system_context()` is for the few deliberate cross-tenant reads: resolving a token or a
session's membership to its operator, fleet-wide periodic fan-out, the staff admin site.
On SQLite (embedded default) both are plain transactions; for_tenant() is the only wall.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import connections, transaction

R = TypeVar("R")

OPERATOR_SETTING = "proof.operator_id"
SYSTEM_SETTING = "proof.system"


def _swap_settings(using: str, operator: str | None, system: str) -> tuple[str, str]:
    """Set the transaction-local tenant settings in one round trip; return their old values.

    `operator=None` leaves the operator setting as it is (system_context keeps it). Ingest
    enters a context per batch, so each statement saved here is one round trip per batch.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return "", ""
    with connection.cursor() as cursor:
        if operator is None:
            cursor.execute(
                "SELECT '', coalesce(current_setting(%s, true), ''), set_config(%s, %s, true)",
                [SYSTEM_SETTING, SYSTEM_SETTING, system],
            )
        else:
            cursor.execute(
                "SELECT coalesce(current_setting(%s, true), ''), "
                "coalesce(current_setting(%s, true), ''), "
                "set_config(%s, %s, true), set_config(%s, %s, true)",
                [
                    OPERATOR_SETTING,
                    SYSTEM_SETTING,
                    OPERATOR_SETTING,
                    operator,
                    SYSTEM_SETTING,
                    system,
                ],
            )
        row = cursor.fetchone()
    return str(row[0]), str(row[1])


def _set_settings(using: str, operator: str | None, system: str) -> None:
    """Set the transaction-local tenant settings in one round trip (`operator=None` leaves the
    operator setting as it is)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if operator is None:
            cursor.execute("SELECT set_config(%s, %s, true)", [SYSTEM_SETTING, system])
        else:
            cursor.execute(
                "SELECT set_config(%s, %s, true), set_config(%s, %s, true)",
                [OPERATOR_SETTING, operator, SYSTEM_SETTING, system],
            )


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
        cursor.execute("SELECT current_setting(%s, true)", [OPERATOR_SETTING])
        value = cursor.fetchone()[0]
    return int(value) if value else None


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
