"""Tests that run the gRPC server in threads need a database that makes concurrent writers
wait. CI runs them on PostgreSQL; the in-memory SQLite test database (shared cache) answers a
second writer with "database table is locked" at once, so there they are skipped (the
embedded default's file database has a busy timeout and does wait)."""

from __future__ import annotations

import pytest
from django.db import connection

THREADED_SERVER_MODULES = ("test_server", "test_replay", "test_sink", "test_backpressure")


@pytest.fixture(autouse=True)
def _threaded_server_needs_waiting_writers(request: pytest.FixtureRequest) -> None:
    if request.module.__name__.rsplit(".", 1)[-1] not in THREADED_SERVER_MODULES:
        return
    if connection.vendor == "sqlite":
        pytest.skip("the threaded ingest server needs PostgreSQL (see ingest/tests/conftest.py)")
