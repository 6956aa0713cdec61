"""Every scenario yields a valid trace with its ground truth; runs are seeded and randomised."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from contract.trace import validate_trace
from simulator import list_scenarios, simulate
from simulator.scenarios import UnknownScenario

SCENARIOS = [info.name for info in list_scenarios()]
FAMILIES = {info.name: info.family for info in list_scenarios()}
DURATION = 240.0


def test_every_design_family_has_a_scenario() -> None:
    families = {i.family for i in list_scenarios()}
    training = {
        "sequence_imbalance",
        "slow_rank",
        "checkpoint_stall",
        "numerical_divergence",
        "no_learning",
        "hardware_fault",
        "fabric_degraded",
        "collective_hang",
        "input_starvation",
        "gpu_degrading",
    }
    assert training <= families
    assert None in families  # healthy controls
    for twin in ("healthy_training", "healthy_local_checkpoint", "healthy_preexisting_counter"):
        assert FAMILIES[twin] is None


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_trace_validates_with_truth(name: str, tmp_path: Path) -> None:
    run = simulate(name, seed=11, duration_s=DURATION, nodes=1)
    path = tmp_path / f"{name}.jsonl.gz"
    written = run.write(path)
    report = validate_trace(path)
    assert report.ok, report.problems[:5]
    assert report.records == written > 1000
    assert report.meta is not None
    truth = report.meta["truth"]
    assert report.meta["scenario"] == name
    assert truth["family"] == FAMILIES[name]
    if truth["family"] is not None:
        assert truth["category"] in ("job", "infrastructure")
        assert set(truth["subject"]) == {"job", "node", "gpu", "rank", "mount"}
        start = report.meta["start_ts"]
        assert start <= truth["onset"] <= start + DURATION
    roles = report.meta["jobs"]
    assert list(roles.values()).count("primary") == 1
    if truth["family"] is not None and truth["subject"]["job"] is not None:
        assert roles[truth["subject"]["job"]] == "primary"
    counts = report.counts
    assert counts["sample"] > 0 and counts.get("job", 0) >= 1 and counts.get("process", 0) >= 1


def test_same_seed_same_trace_and_records_match_write(tmp_path: Path) -> None:
    a = simulate("slow_rank", seed=5, duration_s=240, nodes=2)
    b = simulate("slow_rank", seed=5, duration_s=240, nodes=2)
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write(pa)
    b.write(pb)
    assert hashlib.sha256(pa.read_bytes()).digest() == hashlib.sha256(pb.read_bytes()).digest()
    # records() yields the same records write() wrote, in the same order.
    lines = pa.read_text().splitlines()[1:]
    assert sum(1 for _ in a.records()) == len(lines)


def test_seeds_randomise_world_size_onset_and_log_format() -> None:
    worlds, onsets, formats, causes = set(), set(), set(), set()
    for seed in range(8):
        run = simulate("slow_rank", seed=seed, duration_s=300)
        truth = run.meta["truth"]
        job = next(r for r in run.discrete if r["type"] == "job")
        worlds.add(job["world_size"])
        formats.add(job["config"]["framework"])
        onsets.add(round(truth["onset"] - run.meta["start_ts"]))
        causes.add(truth["detail"]["cause"])
    assert len(worlds) >= 3 and min(worlds) >= 8 and max(worlds) <= 64
    assert len(formats) >= 3
    assert len(onsets) == 8
    assert len(causes) >= 3


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(UnknownScenario, match="unknown scenario 'nope'"):
        simulate("nope", seed=1, duration_s=60)
    with pytest.raises(ValueError, match="duration_s"):
        simulate("healthy_training", seed=1, duration_s=0)


@pytest.mark.parametrize("name", ["collective_hang", "hardware_fault", "no_learning"])
def test_pid_records_fall_inside_the_process_lifetime(name: str) -> None:
    """What the agent joins by pid exists only between the process record and its exit."""
    run = simulate(name, seed=3, duration_s=600, nodes=2)
    seen: dict[tuple[str, int], float] = {}
    gone: dict[tuple[str, int], float] = {}
    checked = 0
    for rec in run.records():
        if rec.get("pid") is None:
            continue
        key = (rec["node"], rec["pid"])
        if rec["type"] == "process":
            seen[key] = rec["ts"]
        elif rec["type"] == "exit":
            gone[key] = rec["ts"]
        else:
            assert key in seen, rec
            assert key not in gone or rec["ts"] <= gone[key], rec
            checked += 1
    assert checked > 10_000
    if name == "no_learning":  # completes inside the window
        assert gone


def test_without_sources_leaves_their_records_out() -> None:
    full = simulate("hardware_fault", seed=2, duration_s=120, nodes=1)
    bare = simulate("hardware_fault", seed=2, duration_s=120, nodes=1, without=["ebpf", "logs"])
    assert bare.meta["missing_sources"] == ["ebpf", "logs"]
    names_full = {r.get("name") for r in full.records()}
    kinds_bare = {(r["type"], r.get("name")) for r in bare.records()}
    assert {"cuda.sync_ms", "nccl.bytes"} <= names_full
    assert not any(n and n.startswith(("cuda.", "nccl.")) for _, n in kinds_bare)
    assert not any(t == "log" for t, _ in kinds_bare)
    assert ("sample", "DCGM_FI_PROF_GR_ENGINE_ACTIVE") in kinds_bare
    with pytest.raises(ValueError, match="unknown source"):
        simulate("hardware_fault", seed=2, duration_s=60, without=["telepathy"])


def test_agent_stalls_leave_gaps_in_samples_only() -> None:
    stalled = None
    for seed in range(12):
        run = simulate("healthy_training", seed=seed, duration_s=300, nodes=1)
        if run.stalled:
            stalled = run
            break
    assert stalled is not None  # about a quarter of training traces have one
    instants = {r["ts"] for r in stalled.records() if r["type"] == "sample"}
    for i in stalled.stalled:
        assert stalled.start_ts + i not in instants
    assert len(instants) == stalled.n_samples - len(stalled.stalled)
