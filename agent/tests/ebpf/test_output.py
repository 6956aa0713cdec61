"""eBPF capture of what a GPU process writes to stdout/stderr, turned into log records."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.ebpf.node import build_collectors
from agent.ebpf.output import OutputCapture
from agent.ebpf.probe_target import Built, Driver
from agent.tests.ebpf.loaded import loaded_or_skip
from contract import signals
from contract.trace import check_record

pytestmark = pytest.mark.bpf


@pytest.fixture
def driver(built: Built) -> Iterator[Driver]:
    with Driver(built) as running:
        yield running


@pytest.fixture
def tracked(driver: Driver) -> set[int]:
    return {driver.pid}


@pytest.fixture
def capture(tracked: set[int]) -> Iterator[OutputCapture]:
    yield from loaded_or_skip(
        OutputCapture(pid_source=lambda: tracked, node="test-node", capture_bytes=512)
    )


def lines_of(records: list[dict[str, Any]], pid: int, stream: str) -> list[dict[str, Any]]:
    for record in records:
        assert check_record(record) is None, (check_record(record), record)
    return [
        r for r in records if r["type"] == "log" and r[signals.PID] == pid and r["stream"] == stream
    ]


def test_lines_written_to_stdout_and_stderr_become_log_records(
    driver: Driver, capture: OutputCapture, tracked: set[int]
) -> None:
    capture.collect(time.time())  # starts tracking the driver
    before = time.time()
    driver.command("say step 10 loss=2.345 lr=3e-4")
    driver.command("sayparts step 1|1 loss=|2.3|01")  # one line in five write() calls
    driver.command("sayparts epoch 0: 10%\\r|epoch 0: 20%\\r|epoch 0: 30%")
    driver.command("saylong 2000")  # more than capture_bytes in one write
    records = capture.collect(time.time())
    after = time.time()

    stderr = lines_of(records, driver.pid, "stderr")
    assert [r["line"] for r in stderr] == [
        "step 10 loss=2.345 lr=3e-4",
        "step 11 loss=2.301",
        "epoch 0: 10%",
        "epoch 0: 20%",
        "epoch 0: 30%",
        "x" * 512,
    ]
    assert [r.get("truncated", False) for r in stderr] == [False] * 5 + [True]
    for record in stderr:
        assert before - 0.5 <= record["ts"] <= after + 0.5
        assert record[signals.NODE] == "test-node"
    # The driver's answers to each command went to stdout: four "ok" lines.
    assert [r["line"] for r in lines_of(records, driver.pid, "stdout")] == ["ok"] * 4
    assert [r["ts"] for r in stderr] == sorted(r["ts"] for r in stderr)

    # A process no longer tracked is not captured.
    tracked.clear()
    capture.collect(time.time())
    driver.command("say not captured")
    assert lines_of(capture.collect(time.time()), driver.pid, "stderr") == []


def test_a_partial_line_is_kept_until_its_newline_or_the_process_exits(
    built: Built, tracked: set[int], capture: OutputCapture
) -> None:
    with Driver(built) as other:
        tracked.add(other.pid)
        capture.collect(time.time())
        other.command("saynonl half a ")
        assert lines_of(capture.collect(time.time()), other.pid, "stderr") == []
        other.command("say line")
        first = lines_of(capture.collect(time.time()), other.pid, "stderr")
        assert [r["line"] for r in first] == ["half a line"]
        other.command("saynonl last words")
        assert lines_of(capture.collect(time.time()), other.pid, "stderr") == []
    # It exited without the newline: what it left is still a line.
    last = lines_of(capture.collect(time.time()), other.pid, "stderr")
    assert [r["line"] for r in last] == ["last words"]


def test_the_node_collectors_capture_what_the_gpu_processes_they_find_print(built: Built) -> None:
    uprobes, output = build_collectors(node="n1")
    try:
        if not uprobes.start() or not output.start():
            pytest.skip(uprobes.unavailable_reason or output.unavailable_reason or "no BPF")
        with Driver(built) as driver:
            uprobes.collect(time.time())  # finds the driver mapping libcuda
            assert driver.pid in uprobes.cuda_pids
            output.collect(time.time())  # starts tracking it
            driver.command("launch 4")
            driver.command("say iteration 7 loss 1.25")
            samples = uprobes.collect(time.time())
            logs = output.collect(time.time())
        assert any(
            s["name"] == signals.CUDA_LAUNCHES and s["pid"] == driver.pid and s["value"] == 4
            for s in samples
        )
        assert [r["line"] for r in lines_of(logs, driver.pid, "stderr")] == [
            "iteration 7 loss 1.25"
        ]
        assert {r["name"] for r in samples} <= set(signals.SIGNALS)
    finally:
        uprobes.close()
        output.close()
