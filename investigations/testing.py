"""Pytest fixtures of the investigations app that tests of other packages use too (the
embedded runner's tests in proof_web). Loaded for the whole suite by the root conftest.py
(`pytest_plugins`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from investigations import notifications


@pytest.fixture
def fired() -> Iterator[list[notifications.Notification]]:
    """The notifications sent while the test runs, in order."""
    seen: list[notifications.Notification] = []
    receiver = notifications.subscribe(seen.append)
    yield seen
    notifications.unsubscribe(receiver)
