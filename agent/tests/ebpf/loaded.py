"""The eBPF tests' way to hold a collector with its BPF program loaded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import pytest

from agent.ebpf.loader import LoadsOnce

_Program = TypeVar("_Program", bound=LoadsOnce[Any])


def loaded_or_skip(program: _Program) -> Iterator[_Program]:
    """For a fixture to `yield from`: `program` started, closed after the test; the test is
    skipped (with the reason) only when BPF programs cannot be loaded here."""
    if not program.start():
        pytest.skip(program.unavailable_reason or "BPF programs cannot be loaded")
    try:
        yield program
    finally:
        program.close()
