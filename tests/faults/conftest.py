"""Fixtures of the fault suite (tests/faults/stack.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.stack import Stack


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """Private Redis, a PostgreSQL proxy, and (not started) ingest; workers on demand."""
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.close()
