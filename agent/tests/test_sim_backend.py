"""The sim backend: simulated records flow through the real collectors' loop, identity join and
sinks; `proof-agent record` writes a valid trace of them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simulator
from agent.cli import main as agent_main
from agent.runtime import AcceleratedClock, Agent, MemorySink, Record
from agent.runtime.sim_backend import (
    SOURCE_DCGM,
    SOURCE_EBPF,
    SOURCE_LOGS,
    SOURCE_NVML,
    SOURCE_PROCESSES,
    SimBackend,
    SimCollector,
    SimDcgmSource,
    source_of,
)
from contract import signals
from contract.trace import TraceReader, validate_trace
from simulator import SimRun
from simulator.scenarios import ScenarioContext, register, unregister

T0 = 1767225600.0
TINY = "test_tiny_two_nodes"
TRUTH = {"family": "slow_rank", "category": "infrastructure", "subject": {"rank": 3}}


def build_tiny(ctx: ScenarioContext) -> SimRun:
    """Two nodes x 2 GPUs, one job of 4 ranks: process records, GPU and eBPF samples with full
    identity (as the simulator writes them), logs, an XID event and one rank exiting."""
    n = ctx.n_samples
    run = SimRun(
        {"scenario": TINY, "kind": "training", "truth": TRUTH},
        start_ts=ctx.start_ts,
        n_samples=n,
    )
    gpu_rows: list[dict[str, Any]] = []
    pid_rows: list[dict[str, Any]] = []
    run.add({"type": "job", "ts": ctx.start_ts, "job": "900", "kind": "training", "world_size": 4})
    for node_i in range(2):
        node = f"tiny-{node_i}"
        for g in range(2):
            rank = node_i * 2 + g
            gpu = gpu_of(rank)
            pid = 1000 + g  # the same pids on both nodes, as on real clusters
            ident = {"job": "900", "rank": rank, "local_rank": g}
            run.add(
                {
                    "type": "process",
                    "ts": ctx.start_ts,
                    "node": node,
                    "pid": pid,
                    "world_size": 4,
                    "gpu": gpu,
                    **ident,
                }
            )
            gpu_rows.append({"node": node, "gpu": gpu, "gpu_index": g, **ident})
            pid_rows.append({"node": node, "pid": pid, "gpu": gpu, "gpu_index": g, **ident})
            for s in range(0, n, 5):
                run.add(
                    {
                        "type": "log",
                        "ts": ctx.start_ts + s + 0.5,
                        "node": node,
                        "pid": pid,
                        "line": f"step {s} loss {3.0 - s / 100:.3f}",
                        "stream": "stdout",
                        **ident,
                    }
                )
    rng = ctx.rng
    run.add_samples(signals.DCGM_FI_DEV_POWER_USAGE, 300 + 50 * rng.random((4, n)), gpu_rows)
    run.add_samples(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, rng.random((4, n)), gpu_rows)
    run.add_samples(signals.CUDA_LAUNCHES, rng.integers(500, 900, (4, n)), pid_rows)
    run.add(
        {
            "type": "event",
            "ts": ctx.start_ts + 3.2,
            "node": "tiny-1",
            "gpu": gpu_rows[3]["gpu"],
            "name": signals.EVENT_XID,
            "value": 79,
        }
    )
    run.add(
        {"type": "exit", "ts": ctx.start_ts + n - 1, "node": "tiny-1", "pid": 1001, "exit_code": 1}
    )
    return run


@pytest.fixture(autouse=True)
def tiny_scenario() -> Iterator[None]:
    # Registered only while these tests run: simulator/tests plays every registered scenario
    # and checks ground-truth rules that this two-node fixture does not follow.
    register(TINY, kind="training", family="slow_rank", description="test fixture, two nodes")(
        build_tiny
    )
    yield
    unregister(TINY)


def key(rec: Record) -> str:
    return repr(sorted(rec.items()))


def core(rec: Record) -> tuple[Any, ...]:
    return tuple(rec.get(k) for k in ("type", "ts", "node", "pid", "name", "line", "value"))


def gpu_of(rank: int) -> str:
    return f"GPU-{rank:08d}-0000-0000-0000-000000000000"


def test_agent_output_equals_the_simulated_run(tmp_path: Path) -> None:
    original = list(simulator.simulate(TINY, seed=3, duration_s=20, start_ts=T0).records())
    backend = SimBackend.from_scenario(TINY, seed=3, duration_s=20, start_ts=T0)
    sink = MemorySink()
    agent_ = Agent(backend.collectors(), sink, clock=AcceleratedClock(T0, speed=0))
    stats = agent_.run(until=backend.end_ts)
    assert backend.feed.exhausted
    # Every sample came out with exactly the identity the simulator gave it: the join restored
    # what the simulated collectors could not have known.
    samples = [r for r in sink.records if r["type"] == "sample"]
    assert Counter(map(key, samples)) == Counter(key(r) for r in original if r["type"] == "sample")
    # Other records came out too, and the join keyed those carrying a pid (logs, exits) with
    # the pid's job, rank and GPU, beyond what the simulator wrote on them.
    others = [r for r in sink.records if r["type"] != "sample"]
    assert Counter(map(core, others)) == Counter(core(r) for r in original if r["type"] != "sample")
    for rec in others:
        if "pid" in rec:
            rank = (0 if rec["node"] == "tiny-0" else 2) + rec["pid"] - 1000
            assert (rec["job"], rec["rank"], rec["gpu"]) == ("900", rank, gpu_of(rank))
    assert stats.ticks == 21 and stats.collector_errors == {}
    assert agent_.join.filled > 0
    ts = [r["ts"] for r in sink.records]
    assert ts == sorted(ts)


def test_collectors_see_only_what_their_source_knows() -> None:
    backend = SimBackend.from_scenario(TINY, seed=3, duration_s=5, start_ts=T0)
    by_name: dict[str, SimCollector | SimDcgmSource] = {c.name: c for c in backend.collectors()}
    procs = by_name[SOURCE_PROCESSES].collect(T0)
    assert len(procs) == 4 and all(r["rank"] is not None for r in procs)
    ebpf = by_name[SOURCE_EBPF].collect(T0)
    assert {r["name"] for r in ebpf} == {signals.CUDA_LAUNCHES}
    # eBPF knows the pid, not the job, rank or GPU (the process table says those).
    assert all(not {"job", "rank", "local_rank", "gpu"} & set(r) for r in ebpf)
    nvml = by_name[SOURCE_NVML].collect(T0)
    assert all("rank" not in r and "gpu_index" in r for r in nvml)
    assert {source_of(r) for r in by_name[SOURCE_DCGM].collect(T0)} == {SOURCE_DCGM}
    assert by_name[SOURCE_LOGS].collect(T0) == []  # the first log line is at T0 + 0.5
    logs = by_name[SOURCE_LOGS].collect(T0 + 1)
    assert len(logs) == 4 and all("rank" not in r for r in logs)
    xid = by_name[SOURCE_NVML].collect(T0 + 4)
    assert [r["value"] for r in xid if r["type"] == "event"] == [79]


def test_single_node(tmp_path: Path) -> None:
    backend = SimBackend.from_scenario(TINY, seed=3, duration_s=10, start_ts=T0, node="tiny-1")
    sink = MemorySink()
    Agent(backend.collectors(), sink, clock=AcceleratedClock(T0, speed=0), node="tiny-1").run(
        until=backend.end_ts
    )
    nodes = Counter(r.get("node") for r in sink.records)
    assert set(nodes) == {"tiny-1"}  # the job record (no node) is stamped with the agent's node
    ranks = {r.get("rank") for r in sink.records if r["type"] == "sample"}
    assert ranks == {2, 3}
    assert backend.trace_meta()[0]["node"] == "tiny-1"


def test_a_single_simulated_node_registers_like_a_real_one() -> None:
    """The meta the transport registers with: the simulated node's hostname and its GPUs with
    their model, as the node backend's NVML facts give a real node's (ingest keys GPU models,
    hence list prices, on them)."""
    backend = SimBackend.from_scenario(
        "healthy_training", seed=1, duration_s=30, start_ts=T0, nodes=1, gpus_per_node=4
    )
    both = backend.run.meta["nodes"]
    assert len(both) == 2  # the job's neighbour runs on a second node
    # One agent per node (`--node`): that node and its four GPUs.
    one = SimBackend.from_scenario(
        "healthy_training",
        seed=1,
        duration_s=30,
        start_ts=T0,
        nodes=1,
        gpus_per_node=4,
        node=both[1],
    )
    meta = one.trace_meta()[0]
    assert meta["node"] == both[1]
    assert [g["index"] for g in meta["gpus"]] == [0, 1, 2, 3]
    assert {g["model"] for g in meta["gpus"]} == {one.run.meta["gpu_model"]}
    sampled = {r["gpu"] for r in one.run.records() if r.get("node") == both[1] and r.get("gpu")}
    assert {g["uuid"] for g in meta["gpus"]} == sampled
    # One agent for the whole simulated cluster: no single node to register as.
    assert "node" not in backend.trace_meta()[0] and "gpus" not in backend.trace_meta()[0]


def test_accelerated_clock_plays_in_compressed_real_time() -> None:
    backend = SimBackend.from_scenario(TINY, seed=3, duration_s=30, start_ts=T0)
    sink = MemorySink()
    clock = AcceleratedClock(T0, speed=100)
    started = time.monotonic()
    Agent(backend.collectors(), sink, clock=clock).run(until=backend.end_ts)
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 3.0  # 30 simulated seconds at 100x: ~0.3 s
    samples = [r for r in sink.records if r["type"] == "sample"]
    assert len(samples) == 3 * 4 * 30


def test_record_command_writes_a_valid_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rec.jsonl.gz"
    code = agent_main(
        [
            "record",
            "--out",
            str(out),
            "--backend",
            "sim",
            "--scenario",
            TINY,
            "--speed",
            "max",
            "--duration",
            "12",
            "--start-ts",
            str(T0),
            "--seed",
            "5",
        ]
    )
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    report = validate_trace(out)
    assert report.ok, report.problems
    assert report.counts["sample"] == 3 * 4 * 12
    assert report.counts["process"] == 4 and report.counts["exit"] == 1
    meta = report.meta
    assert meta is not None and meta["truth"] == TRUTH
    assert meta["backend"] == "sim" and meta["scenario"] == TINY and meta["seed"] == 5
    cuda = [r for r in TraceReader(out) if r.get("name") == signals.CUDA_LAUNCHES]
    assert all(r["job"] == "900" and r["gpu"].startswith("GPU-") for r in cuda)
    assert np.all(np.diff([r["ts"] for r in cuda]) >= 0)


def test_record_command_errors_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = agent_main(["record", "--out", str(tmp_path / "x.jsonl"), "--scenario", "nope"])
    assert code == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
    code = agent_main(["record", "--out", str(tmp_path / "x.jsonl"), "--backend", "sim"])
    assert code == 2
    assert "needs --scenario" in capsys.readouterr().err


def test_run_command_without_transport_prints_and_refuses_server_without_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["run", "--scenario", TINY, "--speed", "max", "--duration", "25"]
    assert agent_main([*args, "--start-ts", str(T0), "--print-every", "10"]) == 0
    out = capsys.readouterr().out
    assert "sample" in out and "agent stopped after 26 intervals" in out
    assert agent_main([*args, "--server", "localhost:1"]) == 2
    assert "--server needs --token" in capsys.readouterr().err


@pytest.mark.parametrize("scenario", ["slow_rank", "hardware_fault"])
def test_real_scenario_through_the_agent(tmp_path: Path, scenario: str) -> None:
    """A real simulator scenario played through the agent and recorded: every sample leaves
    keyed exactly as the simulator keyed it, and the recorded trace validates with its truth."""
    kwargs: dict[str, Any] = {
        "seed": 4,
        "duration_s": 90,
        "nodes": 2,
        "gpus_per_node": 4,
        "start_ts": T0,
    }
    run = simulator.simulate(scenario, **kwargs)
    original = [r for r in run.records() if r["type"] == "sample"]
    backend = SimBackend.from_scenario(scenario, **kwargs)
    sink = MemorySink()
    agent_ = Agent(backend.collectors(), sink, clock=AcceleratedClock(T0, speed=0))
    agent_.run(until=backend.end_ts)
    samples = [r for r in sink.records if r["type"] == "sample"]
    assert Counter(map(key, samples)) == Counter(map(key, original))
    assert agent_.join.filled > len(samples)  # most identity came back through the join

    out = tmp_path / f"{scenario}.jsonl.gz"
    argv = ["record", "--out", str(out), "--scenario", scenario, "--speed", "max"]
    argv += ["--duration", "90", "--nodes", "2", "--gpus-per-node", "4", "--seed", "4"]
    assert agent_main([*argv, "--start-ts", str(T0)]) == 0
    report = validate_trace(out)
    assert report.ok, report.problems[:5]
    assert report.counts["sample"] == len(original)
    assert report.meta is not None and report.meta["truth"] == run.meta["truth"]
    assert report.meta["truth"]["family"] == scenario


def test_run_command_writes_a_trace_with_out(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    argv = ["run", "--scenario", TINY, "--speed", "max", "--duration", "8", "--node", "tiny-0"]
    assert agent_main([*argv, "--start-ts", str(T0), "--out", str(out)]) == 0
    report = validate_trace(out)
    assert report.ok and report.counts["sample"] == 3 * 2 * 8
    assert {r["node"] for r in TraceReader(out)} == {"tiny-0"}


def test_sigterm_stops_record_with_a_complete_trace(tmp_path: Path) -> None:
    out = tmp_path / "stopped.jsonl.gz"
    argv = [sys.executable, "-m", "agent.cli", "record", "--out", str(out)]
    argv += ["--scenario", "healthy_training", "--duration", "3600", "--speed", "5"]
    argv += ["--nodes", "1", "--gpus-per-node", "2", "--start-ts", str(T0)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 2000):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "wrote" in stdout
    report = validate_trace(out)
    assert report.ok, report.problems  # closed cleanly: no cut-short gzip stream
    assert report.counts["sample"] > 0
