"""Physical consistency of simulated training: the signals agree with the step timeline and with
each other, and each scenario shows the signature its family is defined by (docs/design.md §6)."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from contract import signals
from simulator import SimRun, simulate
from simulator.fleet import make_fleet
from simulator.hardware import spec_named
from simulator.training import JobResult, draw_plan, simulate_job

START = 1_767_600_000.0


def _job(n_samples: int = 240, **knobs: Any) -> tuple[SimRun, JobResult]:
    rng = np.random.default_rng(42)
    fleet = make_fleet(
        rng, seed=42, n_nodes=2, gpus_per_node=4, n_samples=n_samples, start_ts=START
    )
    run = SimRun({}, start_ts=START, n_samples=n_samples)
    plan = draw_plan(rng, fleet, node_ids=[0, 1], start_t=START + 3.0, step_time_s=1.3)
    for key, value in knobs.items():
        setattr(plan, key, value)
    res = simulate_job(plan, fleet, run, rng, pid_base=5000)
    fleet.emit(run, rng)
    return run, res


def _per_rank(run: SimRun, name: str) -> dict[int, np.ndarray]:
    """Per rank of the job under study (another job may share the fleet)."""
    job = _primary_job(run)
    rows = run.series(name, key=("node", "pid"), job=job)
    return {row["rank"]: v for row, v in rows if "rank" in row}


def _primary_job(run: SimRun) -> str:
    """The job the scenario is about (another, healthy job may share the fleet)."""
    jobs = run.meta.get("jobs")
    if jobs is None:  # a run built in the test: its only job
        return str(next(r["job"] for r in run.discrete if r["type"] == "job"))
    return str(next(j for j, role in jobs.items() if role == "primary"))


def _slowest_per_window(run: SimRun, i0: int, width: int = 10) -> np.ndarray:
    """Per `width`-second window, the rank that waited least in collectives (the one the others
    waited for)."""
    sync = _per_rank(run, signals.CUDA_SYNC_MS)
    arr = np.array([sync[r][i0:] for r in sorted(sync)])
    arr = arr[:, ~np.isnan(arr).any(axis=0)]
    n = arr.shape[1] // width
    windows = arr[:, : n * width].reshape(len(sync), n, width).sum(axis=2)
    slowest: np.ndarray = np.argmin(windows, axis=0)
    return slowest


def test_sync_ms_is_the_time_spent_waiting_for_the_slowest_rank() -> None:
    run, res = _job(imbalance_seqs=3)
    sync = _per_rank(run, signals.CUDA_SYNC_MS)
    n_steps = res.coll_end.shape[0]
    # Independent of the simulator's integration: overlap of [arrival, collective end) of every
    # step with every 1 s interval, summed by brute force.
    for r, observed in sync.items():
        expected = np.zeros(run.n_samples)
        for k in range(n_steps):
            a, b = res.arrive[r, k], res.coll_end[k]
            for i in range(int((a - START) // 1), min(run.n_samples, int((b - START) // 1) + 1)):
                lo, hi = max(a, START + i), min(b, START + i + 1)
                expected[i] += max(0.0, hi - lo) * 1000.0
        seen = ~np.isnan(observed)
        assert seen.sum() > 200
        assert np.abs(observed[seen] - expected[seen]).max() < 0.35, f"rank {r}"
    # Somebody waited a lot: with variable-length sequences the slowest rank holds the others.
    assert max(np.nanmean(v) for v in sync.values()) > 50


def test_nccl_bytes_and_calls_agree_across_ranks() -> None:
    run, res = _job()
    nbytes = _per_rank(run, signals.NCCL_BYTES)
    calls = _per_rank(run, signals.NCCL_CALLS)
    end = START + run.n_samples
    for r in nbytes:
        arrivals = int((res.arrive[r] < end).sum())
        assert np.nansum(calls[r]) == arrivals * res.n_buckets
        assert np.nansum(nbytes[r]) == pytest.approx(arrivals * res.bytes_per_step, rel=1e-6)
    totals = [np.nansum(v) for v in nbytes.values()]
    assert max(totals) - min(totals) <= res.bytes_per_step * 1.0001


@pytest.mark.parametrize("seed", range(6))
def test_gpu_ratios_power_fb_and_counters_are_consistent(seed: int) -> None:
    run = simulate("gpu_degrading", seed=seed, duration_s=300, nodes=2)
    spec = spec_named(run.meta["gpu_model"])
    values: dict[tuple[str, str], np.ndarray] = {}
    for name in (
        signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        signals.DCGM_FI_PROF_SM_ACTIVE,
        signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
        signals.DCGM_FI_PROF_SM_OCCUPANCY,
        signals.DCGM_FI_DEV_POWER_USAGE,
        signals.DCGM_FI_DEV_FB_USED,
        signals.DCGM_FI_DEV_FB_FREE,
        signals.DCGM_FI_DEV_GPU_TEMP,
        signals.DCGM_FI_DEV_SM_CLOCK,
    ):
        for row, v in run.series(name):
            values[(name, row["gpu"])] = v[~np.isnan(v)]  # an agent stall leaves gaps
    gpus = {g for _, g in values}
    assert len(gpus) == 8 * len(run.meta["nodes"]) >= 16
    for g in gpus:
        eng = values[(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE, g)]
        assert (values[(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, g)] <= eng + 1e-9).all()
        assert (values[(signals.DCGM_FI_PROF_SM_ACTIVE, g)] <= eng + 1e-9).all()
        assert (values[(signals.DCGM_FI_PROF_SM_OCCUPANCY, g)] <= 1).all()
        power = values[(signals.DCGM_FI_DEV_POWER_USAGE, g)]
        assert 0.8 * spec.idle_w <= power.min() and power.max() <= spec.tdp_w
        assert power.max() > 0.4 * spec.tdp_w  # the job's GPUs do work
        fb = values[(signals.DCGM_FI_DEV_FB_USED, g)] + values[(signals.DCGM_FI_DEV_FB_FREE, g)]
        assert (fb == spec.fb_usable_mib).all()
        temp = values[(signals.DCGM_FI_DEV_GPU_TEMP, g)]
        assert temp.min() >= 15 and temp.max() <= 95
        clock = values[(signals.DCGM_FI_DEV_SM_CLOCK, g)]
        assert clock.max() <= spec.sm_clock_max_mhz
    # Every cumulative counter in the trace (GPU, IB, storage) never decreases.
    series: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for rec in run.records():
        if rec["type"] == "sample" and signals.is_cumulative(rec["name"]):
            key = (rec["name"], rec.get("node"), rec.get("gpu"), str(rec.get("labels")))
            series[key].append(rec["value"])
    assert len(series) > 100
    for key, vals in series.items():
        assert (np.diff(vals) >= 0).all(), key
    # The degrading GPU's SBE counter rises; pre-existing values elsewhere stay flat.
    truth = run.meta["truth"]
    sbe = {row["gpu"]: v for row, v in run.series(signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)}
    rising = [g for g, v in sbe.items() if v[-1] > v[0]]
    assert rising == [truth["subject"]["gpu"]]


def test_slow_rank_is_the_same_rank_every_step() -> None:
    for seed in (1, 2, 3):
        run = simulate("slow_rank", seed=seed, duration_s=600, nodes=2)
        truth = run.meta["truth"]
        slowest = _slowest_per_window(run, int(truth["onset"] - run.start_ts) + 5)
        assert np.bincount(slowest).argmax() == truth["subject"]["rank"], truth
        assert np.bincount(slowest).max() / len(slowest) > 0.8


def test_rotating_straggler_changes_every_step() -> None:
    run = simulate("sequence_imbalance", seed=4, duration_s=600, nodes=2)
    i0 = int(run.meta["truth"]["onset"] - run.start_ts) + 5
    slowest = _slowest_per_window(run, i0, width=3)
    assert len(set(slowest.tolist())) >= 8
    assert np.bincount(slowest).max() / len(slowest) < 0.5
    # Waiting ranks: engine busy, tensor pipes idle, so engine ≫ tensor on average.
    eng = np.nanmean([v[i0:] for _, v in run.series(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)])
    ten = np.nanmean([v[i0:] for _, v in run.series(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)])
    assert eng > 0.85 and ten < 0.6 * eng


def _ckpt_view(name: str, seed: int) -> tuple[SimRun, float, float]:
    """(run, longest launch gap seen on every rank in ms, worst write latency in ms on the
    mount the job checkpoints to)."""
    run = simulate(name, seed=seed, duration_s=1200, nodes=1)
    gaps = _per_rank(run, signals.CUDA_LAUNCH_GAP_MAX_MS)
    max_gap = float(np.nanmin([np.nanmax(v) for v in gaps.values()]))
    job = _primary_job(run)
    save_dir = next(r for r in run.discrete if r["type"] == "job" and r["job"] == job)["config"][
        "save"
    ]
    lat = [
        v
        for row, v in run.series(signals.STORAGE_WRITE_MS, key=("node", "labels"))
        if save_dir.startswith(row["labels"]["mount"] + "/")
    ]
    return run, max_gap, float(np.nanmax(lat))


def test_checkpoint_stall_vs_local_nvme_twin() -> None:
    stall, stall_gap, stall_lat = _ckpt_view("checkpoint_stall", 2)
    _, ok_gap, ok_lat = _ckpt_view("healthy_local_checkpoint", 2)
    assert stall_gap > 25_000 and stall_lat > 200
    assert ok_gap < stall_gap / 3 and ok_lat < 5
    # The long gaps line up with the save lines in the log.
    saves = [
        r["ts"]
        for r in stall.discrete
        if r["type"] == "log" and "checkpoint" in r["line"].lower() and "sav" in r["line"].lower()
    ]
    assert saves
    gaps = _per_rank(stall, signals.CUDA_LAUNCH_GAP_MAX_MS)[0]
    for ts in saves[:2]:
        i = int(ts - stall.start_ts)
        window = gaps[max(0, i - 3) : i + 60]
        assert np.nanmax(window) > 5_000


def test_collective_hang_one_rank_stops_launching() -> None:
    run = simulate("collective_hang", seed=5, duration_s=900, nodes=1)
    truth = run.meta["truth"]
    hung = truth["subject"]["rank"]
    i0 = int(truth["onset"] - run.start_ts) + 10
    launches = _per_rank(run, signals.CUDA_LAUNCHES)
    sync = _per_rank(run, signals.CUDA_SYNC_MS)
    for r in launches:
        after_l = launches[r][i0 : i0 + 100]
        after_s = sync[r][i0 : i0 + 100]
        assert np.nansum(after_l) == 0  # nobody launches: all blocked, or the one that hung
        if r == hung:
            assert np.nanmax(after_s) == 0
        else:
            assert np.nanmin(after_s) > 990


def test_input_starvation_idles_gpus_and_saturates_workers() -> None:
    run = simulate("input_starvation", seed=6, duration_s=600, nodes=1)
    i0 = int(run.meta["truth"]["onset"] - run.start_ts) + 10
    workers = [
        v[i0:]
        for row, v in run.series(signals.HOST_CPU_UTIL, key=("node", "pid"))
        if "pid" in row and "gpu" not in row
    ]
    assert np.nanmean(workers) > 0.85
    eng = np.nanmean([v[i0:] for _, v in run.series(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)])
    assert eng < 0.6


# The GPU error counters but PCIe replays, which a healthy link also counts now and then.
_FAULT_COUNTERS = tuple(
    n for n in signals.GPU_ERROR_COUNTERS if n != signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER
)


def _rising(run: SimRun, names: tuple[str, ...]) -> set[tuple[str, str]]:
    out = set()
    for name in names:
        for row, v in run.series(name):
            v = v[~np.isnan(v)]
            if len(v) and v[-1] > v[0]:
                out.add((name, row["gpu"]))
    return out


@pytest.mark.parametrize(
    "name", ["healthy_training", "healthy_local_checkpoint", "healthy_preexisting_counter"]
)
def test_healthy_controls_carry_no_fault_evidence(name: str) -> None:
    for seed in (1, 2):
        run = simulate(name, seed=seed, duration_s=300, nodes=2)
        assert not _rising(run, _FAULT_COUNTERS)  # pre-existing counts stay flat
        assert not [r for r in run.discrete if r["type"] == "event"]
        hw_bits = (
            signals.THROTTLE_HW_SLOWDOWN
            | signals.THROTTLE_HW_THERMAL
            | signals.THROTTLE_SW_THERMAL
            | signals.THROTTLE_HW_POWER_BRAKE
        )
        for _, v in run.series(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS):
            v = v[~np.isnan(v)].astype(int)
            assert not (v & hw_bits).any()
        states = {r.get("state") for r in run.discrete if r["type"] == "job"}
        assert states <= {"running", "completed"}


def test_divergence_twins_clean_hardware_vs_xid_first() -> None:
    div = simulate("numerical_divergence", seed=4, duration_s=1200, nodes=1)
    truth = div.meta["truth"]
    job, rerun = truth["subject"]["job"], truth["detail"]["rerun"]
    assert div.meta["jobs"][rerun] == "rerun"
    assert not _rising(div, _FAULT_COUNTERS)
    assert not [r for r in div.discrete if r["type"] == "event"]
    # Both runs blow up at the same iteration (loss non-finite or far above its best).
    first_bad = {}
    for j in (job, rerun):
        lines = [r["line"] for r in div.discrete if r["type"] == "log" and r["job"] == j]
        steps = _logged_losses(lines)
        best = min(v for _, v in steps if np.isfinite(v))
        first_bad[j] = next(s for s, v in steps if not np.isfinite(v) or v > 2.5 * best)
    assert first_bad[job] == first_bad[rerun]

    hw = simulate("hardware_fault", seed=6, duration_s=1200, nodes=1)
    truth = hw.meta["truth"]
    xids = [r for r in hw.discrete if r["type"] == "event" and r["name"] == signals.EVENT_XID]
    assert xids and xids[0]["gpu"] == truth["subject"]["gpu"]
    assert xids[0]["ts"] == pytest.approx(truth["onset"])


def _logged_losses(lines: list[str]) -> list[tuple[int, float]]:
    """(step, loss) from any of the four formats — enough for this test's two jobs."""
    out = []
    for i, line in enumerate(lines):
        m = (
            re.search(r"iteration\s+(\d+)/.*?lm loss: (\S+) \|", line)
            or re.search(r"step:\s*(\d+)\s+loss:\s*(\S+)", line)
            or re.search(r"iter (\d+): loss ([^,]+),", line)
        )
        if m:
            out.append((int(m.group(1)), float(m.group(2))))
        elif line.startswith("{'loss'"):
            hf = re.search(r"'loss': ([^,]+),", line)
            assert hf is not None, line
            out.append((i, float(hf.group(1))))
    return out
