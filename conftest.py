"""Test-wide setup: tests run against whatever DATABASE_URL/REDIS_URL say (PostgreSQL and
Redis in CI, SQLite when unset)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("PROOF_ENV", "test")

# App fixtures shared across packages (pytest-django has set Django up by the time these load).
pytest_plugins = ["investigations.testing"]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2 at production strength costs ~0.5 s a user; tests make dozens of users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _own_login_throttle(settings: Any) -> None:
    # Sign-in failures are counted in the cache (tenants/login_throttle.py), which is the one
    # shared Redis under CI: without its own prefix a test would inherit the failed sign-ins of
    # earlier tests and runs, and be locked out.
    settings.PROOF_LOGIN_CACHE_PREFIX = f"login-test:{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest, django_test_environment: None, django_db_blocker: Any
) -> Iterator[None]:
    """On PostgreSQL, create and migrate the test database as the owner role, then point the
    application role at it, so tests run under row-level security exactly as production."""
    from django.conf import settings
    from django.db import connections
    from django.test.utils import setup_databases, teardown_databases

    # WhiteNoise warns on every request when the static root is missing (collectstatic makes
    # it in production).
    os.makedirs(settings.STATIC_ROOT, exist_ok=True)
    with django_db_blocker.unblock():
        if connections["default"].vendor != "postgresql":
            old_config = setup_databases(verbosity=0, interactive=False)
            yield
            teardown_databases(old_config, verbosity=0)
            return
        if "owner" not in connections.settings:
            raise RuntimeError(
                "tests on PostgreSQL need DATABASE_OWNER_URL: the owner role creates and "
                "migrates the test database, the application role runs the tests"
            )
        owner = connections["owner"]
        default = connections["default"]
        original_name = owner.settings_dict["NAME"]
        # One test database per pytest process, so concurrent runs on one machine never drop
        # each other's database.
        owner.settings_dict.setdefault("TEST", {})
        owner.settings_dict["TEST"]["NAME"] = f"test_{original_name}_{os.getpid()}"
        test_name = owner.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        default.close()
        default.settings_dict["NAME"] = test_name
    yield
    with django_db_blocker.unblock():
        default.close()
        owner.close()
        owner.creation.destroy_test_db(original_name, verbosity=0)


@pytest.fixture
def start_task_worker() -> Iterator[Callable[[], Any]]:
    """Start a real Celery worker in this process (proof_web/runner.py's TaskRunner, with no
    periodic tasks) on the in-process broker that tests use: what the test enqueues from then
    on, it runs. The worker's threads have connections of their own, so the test needs
    `django_db(transaction=True)`. Stopped at the end of the test."""
    from proof_web.runner import TaskRunner

    started: list[TaskRunner] = []

    def start() -> TaskRunner:
        runner = TaskRunner({})
        runner.start()
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.stop()
