"""Fixtures of the end-to-end tests (helpers: tests/helpers.py and tests/agentproc.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import Ingest


@pytest.fixture
def ingest() -> Iterator[Ingest]:
    """The real ingest server on a loopback port (tests/helpers.py `Ingest`)."""
    srv = Ingest()
    yield srv
    srv.stop()
