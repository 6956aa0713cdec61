"""Fixtures for the eBPF tests: the stand-in libraries built once per module, and a collector
that skips the test (with the reason) only when BPF programs cannot be loaded here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.ebpf.collector import EbpfCollector
from agent.ebpf.probe_target import Built, build
from agent.tests.ebpf.loaded import loaded_or_skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(Path(tmp_path_factory.mktemp("probe_target")))


@pytest.fixture
def collector() -> Iterator[EbpfCollector]:
    yield from loaded_or_skip(
        EbpfCollector(rescan_interval_s=0.0, node="test-node", detach_grace_s=0.0)
    )
