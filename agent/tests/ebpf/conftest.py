"""Fixtures for the eBPF tests: the stand-in libraries built once per module, and a collector
that skips the test (with the reason) only when BPF programs cannot be loaded here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.ebpf.collector import EbpfCollector
from agent.ebpf.probe_target import Built, build


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(Path(tmp_path_factory.mktemp("probe_target")))


@pytest.fixture
def collector() -> Iterator[EbpfCollector]:
    collector = EbpfCollector(rescan_interval_s=0.0, node="test-node", detach_grace_s=0.0)
    if not collector.start():
        pytest.skip(collector.unavailable_reason or "BPF programs cannot be loaded")
    try:
        yield collector
    finally:
        collector.close()
