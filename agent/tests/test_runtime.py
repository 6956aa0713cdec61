"""The agent runtime: identity join, the collector loop, failing collectors, sinks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.runtime import (
    AcceleratedClock,
    Agent,
    IdentityJoin,
    ManualClock,
    MemorySink,
    Record,
    TraceSink,
)
from contract import signals
from contract.trace import TraceReader, validate_trace

T0 = 1767225600.0
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def proc(pid: int, rank: int, gpu: str, job: str = "77", ts: float = T0) -> Record:
    return {
        "type": "process",
        "ts": ts,
        "node": "n1",
        "pid": pid,
        "job": job,
        "rank": rank,
        "local_rank": rank % 8,
        "world_size": 16,
        "gpu": gpu,
    }


def test_identity_join_fills_pid_and_gpu_records() -> None:
    join = IdentityJoin("n1")
    join.learn_gpu(GPU_A, 0)
    join.learn_gpu(GPU_B, 1)
    ebpf = {"type": "sample", "ts": T0, "name": signals.CUDA_LAUNCHES, "value": 900, "pid": 10}
    log_line = {"type": "log", "ts": T0, "line": "step 3 loss 2.1", "pid": 11, "step": 3}
    nvml = {"type": "sample", "ts": T0, "name": signals.DCGM_FI_DEV_POWER_USAGE, "value": 300.0}
    nvml_a = {**nvml, "gpu": GPU_A, "gpu_index": 0}
    nvml_b_index_only = {**nvml, "gpu_index": 1}
    own = {**ebpf, "pid": 11, "job": "override-kept", "rank": 99}
    unknown_pid = {**ebpf, "pid": 12345}
    batch = [
        proc(10, 8, GPU_A),
        proc(11, 9, GPU_B),
        ebpf,
        log_line,
        nvml_a,
        nvml_b_index_only,
        own,
        unknown_pid,
    ]
    join.apply(batch, T0)
    assert ebpf == {
        **ebpf,
        "node": "n1",
        "job": "77",
        "rank": 8,
        "local_rank": 0,
        "gpu": GPU_A,
        "gpu_index": 0,
    }
    assert (log_line["job"], log_line["rank"], log_line["gpu"], log_line["step"]) == (
        "77",
        9,
        GPU_B,
        3,
    )
    assert (nvml_a["job"], nvml_a["rank"], nvml_a["local_rank"]) == ("77", 8, 0)
    assert "pid" not in nvml_a  # a GPU record is not turned into a process record
    assert nvml_b_index_only["gpu"] == GPU_B and nvml_b_index_only["rank"] == 9
    assert own["job"] == "override-kept" and own["rank"] == 99 and own["gpu"] == GPU_B
    assert "job" not in unknown_pid and unknown_pid["node"] == "n1"
    assert join.identity_of(10) == {
        "job": "77",
        "rank": 8,
        "local_rank": 0,
        "world_size": 16,
        "gpu": GPU_A,
    }


def test_identity_join_shared_gpu_only_agreed_keys_and_exit_grace() -> None:
    join = IdentityJoin("n1", exit_grace_s=10)
    join.apply([proc(10, 0, GPU_A, job="1"), proc(11, 1, GPU_A, job="1")], T0)
    rec: Record = {"type": "sample", "ts": T0, "name": "x", "value": 1, "gpu": GPU_A}
    join.apply([rec], T0)
    assert rec["job"] == "1" and "rank" not in rec  # two ranks share the GPU: rank unknown

    join.apply([{"type": "exit", "ts": T0 + 1, "node": "n1", "pid": 11, "exit_code": 0}], T0 + 1)
    late = {"type": "sample", "ts": T0 + 5, "name": "x", "value": 1, "pid": 11}
    join.apply([late], T0 + 5)
    assert late["rank"] == 1  # still known within the grace period
    join.apply([], T0 + 12)
    assert join.known_pids() == [10]
    rec2: Record = {"type": "sample", "ts": T0 + 12, "name": "x", "value": 1, "gpu": GPU_A}
    join.apply([rec2], T0 + 12)
    assert rec2["rank"] == 0  # only pid 10 left on the GPU


class Ticker:
    """A collector producing one sample per GPU and one eBPF sample per call."""

    name = "ticker"

    def __init__(self) -> None:
        self.calls: list[float] = []

    def collect(self, now: float) -> list[Record]:
        self.calls.append(now)
        out: list[Record] = [proc(10, 3, GPU_A, ts=now)] if len(self.calls) == 1 else []
        out.append(
            {"type": "sample", "ts": now, "name": signals.CUDA_SYNC_MS, "value": 12.5, "pid": 10}
        )
        out.append({"type": "sample", "ts": now - 0.5, "name": "x", "value": 1, "gpu": GPU_A})
        return out


class Broken:
    name = "broken"

    def __init__(self, fail_times: int) -> None:
        self.fail_times = fail_times
        self.calls = 0

    def collect(self, now: float) -> list[Record]:
        self.calls += 1
        if self.calls <= self.fail_times:
            raise OSError(f"source unreadable #{self.calls}")
        return [{"type": "event", "ts": now, "name": "recovered"}]


def test_failing_collector_reported_once_and_loop_continues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    ticker, broken = Ticker(), Broken(fail_times=5)
    sink = MemorySink()
    agent = Agent([broken, ticker], sink, clock=clock, interval=1.0, node="n1")
    with caplog.at_level(logging.WARNING):
        stats = agent.run(max_ticks=8)
    assert stats.ticks == 8
    assert ticker.calls == [T0 + i for i in range(8)]
    errors = [r for r in sink.records if r.get("name") == signals.EVENT_COLLECTOR_ERROR]
    assert len(errors) == 1
    assert errors[0]["labels"] == {"collector": "broken"}
    assert "source unreadable #1" in errors[0]["text"]
    assert errors[0]["node"] == "n1"
    assert stats.collector_errors == {"broken": 5}
    assert sum("collector broken failed" in m for m in caplog.messages) == 1
    assert [r["ts"] for r in sink.records if r.get("name") == "recovered"] == [
        T0 + 5,
        T0 + 6,
        T0 + 7,
    ]
    # Every record left keyed, and each tick's batch reached the sink in ts order.
    sync = [r for r in sink.records if r.get("name") == signals.CUDA_SYNC_MS]
    assert len(sync) == 8 and all(r["rank"] == 3 and r["gpu"] == GPU_A for r in sync)
    gpu_samples = [r for r in sink.records if r.get("name") == "x"]
    assert all(r["job"] == "77" and r["rank"] == 3 for r in gpu_samples)
    ts = [r["ts"] for r in sink.records]
    assert ts == sorted(ts)


def test_failure_after_recovery_is_reported_again() -> None:
    class Flaky:
        name = "flaky"
        n = 0

        def collect(self, now: float) -> list[Record]:
            self.n += 1
            if self.n in (1, 2, 4):
                raise RuntimeError("boom")
            return []

    sink = MemorySink()
    Agent([Flaky()], sink, clock=ManualClock(T0)).run(max_ticks=5)
    assert [r["ts"] for r in sink.records] == [T0, T0 + 3]


def test_run_until_and_trace_sink(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl.gz"
    sink = TraceSink(path, {"source": "test"})
    clock = AcceleratedClock(T0, speed=0)  # virtual time: no waiting
    agent = Agent([Ticker()], sink, clock=clock, node="n1")
    agent.run(until=T0 + 9.5)
    # A late record (earlier than what was written) keeps its time under source_ts.
    sink.submit([{"type": "log", "ts": T0, "line": "late kernel line"}])
    agent.close()
    report = validate_trace(path)
    assert report.ok, report.problems
    assert report.counts["sample"] == 2 * agent.stats.ticks
    assert agent.stats.ticks == 11  # T0 .. T0+9 and the final tick at T0+9.5
    records = list(TraceReader(path))
    assert records[-1]["line"] == "late kernel line" and records[-1]["source_ts"] == T0
    assert sink.late_records == 1


def test_trace_sink_drops_invalid_records_and_keeps_going(tmp_path: Path) -> None:
    sink = TraceSink(tmp_path / "t.jsonl")
    sink.submit(
        [
            {"type": "sample", "ts": T0, "name": "x", "value": 1},
            {"type": "sample", "ts": T0, "name": "x", "value": "NaN"},
            {"type": "sample", "ts": T0 + 1, "name": "x", "value": 2},
        ]
    )
    sink.close()
    assert sink.invalid_records == 1
    assert [r["value"] for r in TraceReader(tmp_path / "t.jsonl")] == [1, 2]


def test_accelerated_clock_runs_faster_than_real_time() -> None:
    clock = AcceleratedClock(T0, speed=1000)
    clock.sleep(5.0)  # 5 simulated seconds = 5 ms
    assert 5.0 <= clock.now() - T0 < 5.0 + 1000 * 0.5


def test_process_seen_again_after_exit_is_kept() -> None:
    join = IdentityJoin("n1", exit_grace_s=5)
    join.apply([proc(10, 0, GPU_A)], T0)
    join.apply([{"type": "exit", "ts": T0 + 1, "node": "n1", "pid": 10, "exit_code": 0}], T0 + 1)
    join.apply([proc(10, 4, GPU_B, ts=T0 + 2)], T0 + 2)  # the pid was reused by a new rank
    join.apply([], T0 + 60)
    assert join.known_pids() == [10]
    assert join.identity_of(10) == {
        "job": "77",
        "rank": 4,
        "local_rank": 4,
        "world_size": 16,
        "gpu": GPU_B,
    }


def test_identity_join_keys_pids_per_node() -> None:
    join = IdentityJoin()
    join.apply([proc(10, 0, GPU_A), {**proc(10, 8, GPU_B), "node": "n2"}], T0)
    a = {"type": "sample", "ts": T0, "name": "x", "value": 1, "pid": 10, "node": "n1"}
    b = {**a, "node": "n2"}
    join.apply([a, b], T0)
    assert (a["rank"], b["rank"]) == (0, 8)


def test_sink_failure_does_not_stop_the_agent(caplog: pytest.LogCaptureFixture) -> None:
    class FullDisk(MemorySink):
        calls = 0

        def submit(self, records: Sequence[Record]) -> None:
            self.calls += 1
            if self.calls in (2, 3):
                raise OSError(28, "No space left on device")
            super().submit(records)

    sink = FullDisk()
    agent = Agent([Ticker()], sink, clock=ManualClock(T0))
    with caplog.at_level(logging.ERROR):
        stats = agent.run(max_ticks=5)
    assert stats.ticks == 5 and stats.sink_errors == 2
    assert sorted({r["ts"] for r in sink.records if r.get("name") == signals.CUDA_SYNC_MS}) == [
        T0,
        T0 + 3,
        T0 + 4,
    ]
    assert sum("sink failed" in m for m in caplog.messages) == 1
