"""The batch screen (engine/screen.py): which batches bring a job's evaluation forward."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract import signals
from contract.rows import SeriesInfo, labels_key
from engine.screen import YOUNG_S, BatchScreen, Signs
from simulator import simulate

NODE = "node-1"


def _gpu(name: str, index: int, job: str = "") -> SeriesInfo:
    return SeriesInfo(name, NODE, f"GPU-{index}", index, None, job, None)


def _look(screen: BatchScreen, rows: dict[SeriesInfo, float], ts: float = 0.0, **kw: Any) -> Signs:
    infos = list(rows)
    values = np.array([rows[i] for i in infos], dtype=np.float64)
    return screen.look(
        infos,
        np.ones(len(infos), dtype=np.int64),
        values,
        ts_ms=np.full(len(infos), ts * 1e3),
        **kw,
    )


def _steady(screen: BatchScreen, rows: dict[SeriesInfo, float], batches: int = 40) -> None:
    for k in range(batches):
        assert not _look(screen, rows, float(k)), f"a steady batch {k} showed a sign"


def test_a_level_change_is_a_sign_and_a_steady_one_is_not() -> None:
    screen = BatchScreen()
    util = _gpu(signals.DCGM_FI_DEV_GPU_UTIL, 0)
    _steady(screen, {util: 97.0})
    # A stall: utilisation falls to 10 and stays there. Seen within two batches...
    first = next(k for k in range(10) if _look(screen, {util: 10.0}, 40.0 + k).nodes)
    assert first <= 1
    # ...and not for ever: the new level becomes the baseline.
    later = [bool(_look(screen, {util: 10.0}, 60.0 + k)) for k in range(200)]
    assert not any(later[-50:])


def test_error_counters_and_hardware_throttling_are_signs_traffic_is_not() -> None:
    screen = BatchScreen()
    crc = _gpu(signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0, "job-1")
    xmit = SeriesInfo("ib.port_xmit_data", NODE, "", None, None, "", None, None, labels_key({}))
    throttle = _gpu(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, 0, "job-1")
    _look(screen, {throttle: 0.0}, 0.0)  # the job began long before (not young)
    for k in range(5):  # traffic grows every second; errors and throttling stay put
        signs = _look(screen, {crc: 7.0, xmit: 1e9 * k, throttle: 0.0}, 100.0 + k)
        assert (not signs.nodes and "job-1" not in signs.jobs) or k == 0
    assert (
        not _look(screen, {crc: 7.0, xmit: 9e9, throttle: signals.THROTTLE_SW_POWER_CAP}, 106.0)
        .jobs.get("job-1", "")
        .startswith("hardware")
    )
    moved = _look(screen, {crc: 9.0, xmit: 1e10, throttle: 0.0}, 107.0)
    assert "moved" in moved.jobs["job-1"]
    assert moved.prompt_jobs == {"job-1"}  # a happening: never backed off
    hot = _look(screen, {crc: 9.0, xmit: 2e10, throttle: signals.THROTTLE_HW_THERMAL}, 108.0)
    assert hot.jobs["job-1"] == "hardware throttling"
    assert hot.prompt_jobs == set()  # a lasting condition: the scheduler may back it off


def test_a_corrected_error_counted_is_a_notice_a_fault_counted_a_happening() -> None:
    screen = BatchScreen()
    port = labels_key({"port": "1"})
    symbol = SeriesInfo("ib.symbol_error", NODE, "", None, None, "", None, None, port)
    downed = SeriesInfo("ib.link_downed", NODE, "", None, None, "", None, None, port)
    crc = _gpu(signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0, "job-1")
    dbe = _gpu(signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, 0, "job-1")
    rows = {symbol: 3.0, downed: 0.0, crc: 7.0, dbe: 0.0}
    _look(screen, rows, 0.0)
    # A healthy port trickling symbol errors, an NVLink retrying a flit: notices.
    trickle = _look(screen, {**rows, symbol: 4.0, crc: 8.0}, 100.0)
    assert trickle.prompt_nodes == {NODE} and trickle.severe_nodes == set()
    assert trickle.prompt_jobs == {"job-1"} and trickle.severe_jobs == set()
    # The link going down, a double-bit ECC error: happenings.
    fault = _look(screen, {**rows, symbol: 4.0, crc: 8.0, downed: 1.0, dbe: 1.0}, 101.0)
    assert fault.severe_nodes == {NODE}
    assert fault.severe_jobs == {"job-1"}


def test_a_gpu_drifting_from_its_peers_is_a_sign_jitter_is_not() -> None:
    rng = np.random.default_rng(3)
    screen = BatchScreen()
    sm = [_gpu(signals.DCGM_FI_PROF_SM_ACTIVE, i) for i in range(4)]
    for k in range(300):  # healthy: 4% jitter around 0.75 (the simulator's healthy jobs)
        rows = {t: 0.75 * (1 + 0.04 * rng.standard_normal()) for t in sm}
        assert not _look(screen, rows, float(k)), k
    # GPU 2 becomes a straggler, busy 15% longer than its peers: seen within a few batches...
    seen = []
    for k in range(60):
        rows = {t: 0.75 * (1 + 0.04 * rng.standard_normal()) for t in sm}
        rows[sm[2]] *= 1.15
        seen.append("peers" in _look(screen, rows, 300.0 + k).nodes.get(NODE, ""))
    assert True in seen[:10]
    # ...for the hold only: a drift that persists without a verdict is no longer a sign.
    assert not any(seen[-20:])


def test_log_lines_and_events() -> None:
    screen = BatchScreen()
    util = _gpu(signals.DCGM_FI_DEV_GPU_UTIL, 0)

    def log(line: str) -> dict[str, Any]:
        return {"line": line, "job": "job-1", "node": NODE}

    assert not _look(screen, {util: 90.0}, logs=[log("step 10 | loss 2.50 | lr 1e-4")]).jobs
    assert not _look(screen, {util: 90.0}, logs=[log("step 20 | loss 2.10 | lr 1e-4")]).jobs
    assert _look(screen, {util: 90.0}, logs=[log("step 30 | loss 3.40 | lr 1e-4")]).jobs == {
        "job-1": "loss rose"
    }
    assert _look(screen, {util: 90.0}, logs=[log("Traceback (most recent call last):")]).jobs
    event = {"name": "xid", "node": NODE, "job": ""}
    evented = _look(screen, {util: 90.0}, events=[event])
    assert evented.nodes == {NODE: "event xid"}
    assert evented.prompt_nodes == {NODE}


def test_a_save_line_is_a_notice_an_error_is_a_happening() -> None:
    """A save's log line is what a healthy job prints in its normal course: prompt (never
    backed off) but not severe, so a costly job's saves are held to the notices' share."""
    screen = BatchScreen()
    util = _gpu(signals.DCGM_FI_DEV_GPU_UTIL, 0)

    def look(line: str) -> Signs:
        return _look(screen, {util: 90.0}, logs=[{"line": line, "job": "job-1", "node": NODE}])

    saving = look("[2026-12-04 10:00:00] saving checkpoint at iteration 1200 to /ckpt")
    assert saving.jobs == {"job-1": "save line"}
    assert saving.prompt_jobs == {"job-1"}
    assert saving.severe_jobs == set()
    for line in ("error saving checkpoint: No space left on device", "CUDA error: an illegal"):
        failed = look(line)
        assert failed.jobs == {"job-1": "log line"}, line
        assert failed.severe_jobs == {"job-1"}, line


REAL_LOGS = Path(__file__).resolve().parents[2] / "agent" / "tests" / "data" / "training"


@pytest.mark.parametrize(
    ("log", "signs"),
    [
        # Megatron prints "number of nan iterations: 0" on every iteration line.
        ("megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log", 0),
        ("megatron_deepspeed_bigscience_tr8b_104B.log", 0),
        ("megatron_checkpoint_save_hyperpod_slurm.log", 0),
        # nanoGPT's fp16 run goes NaN: "iter 110: loss nan" and after.
        ("nanogpt_minlora_fp16_nan_loss.log", 8),
    ],
)
def test_real_logs_are_happenings_only_where_something_went_wrong(log: str, signs: int) -> None:
    screen = BatchScreen()
    util = _gpu(signals.DCGM_FI_DEV_GPU_UTIL, 0)
    lines = (REAL_LOGS / log).read_text(errors="replace").splitlines()
    severe = 0
    for line in lines:
        seen = _look(screen, {util: 90.0}, logs=[{"line": line, "job": "job-1", "node": NODE}])
        severe += seen.jobs.get("job-1") == "log line"
    assert severe == signs
    # A Megatron line that did count NaN iterations is one.
    nan_line = "iteration 20/ 100 | lm loss: 2.1E+00 | number of nan iterations:   3 |"
    seen = _look(screen, {util: 90.0}, logs=[{"line": nan_line, "job": "job-1", "node": NODE}])
    assert seen.severe_jobs == {"job-1"}


def test_a_job_is_urgent_through_its_first_minute_only() -> None:
    screen = BatchScreen()
    util = _gpu(signals.DCGM_FI_DEV_GPU_UTIL, 0, "job-1")
    young = [_look(screen, {util: 90.0}, 1000.0 + k).jobs.get("job-1") for k in range(90)]
    assert all(r == "young job" for r in young[: int(YOUNG_S)])
    # A notice: every job is young once, so a costly one's first minute is held to its cost.
    assert not _look(BatchScreen(), {util: 90.0}, 5000.0).severe_jobs
    assert not any(young[int(YOUNG_S) + 1 :])


def test_state_is_bounded() -> None:
    screen = BatchScreen(max_series=10, max_jobs=3)
    for k in range(50):
        _look(screen, {_gpu(signals.DCGM_FI_DEV_GPU_UTIL, k, f"job-{k}"): 50.0}, float(k))
    assert screen.held_series <= 10
    assert len(screen._first_seen) <= 3


def _batches(
    scenario: str, seed: int = 1
) -> tuple[dict[str, Any], Iterable[tuple[float, list[dict[str, Any]]]]]:
    run = simulate(scenario, seed=seed, duration_s=600, nodes=1, gpus_per_node=4)
    records = sorted(run.records(), key=lambda r: float(r.get("ts", 0.0)))

    def cut() -> Iterable[tuple[float, list[dict[str, Any]]]]:
        start = float(records[0]["ts"])
        batch: list[dict[str, Any]] = []
        for r in records:
            while float(r.get("ts", start)) >= start + 1.0:
                yield start, batch
                batch, start = [], start + 1.0
            batch.append(r)
        yield start, batch

    return dict(run.meta.get("truth") or {}), cut()


def _screen_batch(screen: BatchScreen, batch: list[dict[str, Any]]) -> Signs:
    samples = [r for r in batch if r.get("type") == "sample"]
    by: dict[SeriesInfo, list[float]] = {}
    for r in samples:
        info = SeriesInfo(
            r["name"],
            r.get("node", ""),
            r.get("gpu", ""),
            r.get("gpu_index"),
            r.get("pid"),
            r.get("job", ""),
            r.get("rank"),
            r.get("local_rank"),
            labels_key(r.get("labels")),
        )
        by.setdefault(info, []).append(float(r["value"]))
    infos = list(by)
    return screen.look(
        infos,
        np.array([len(by[i]) for i in infos], dtype=np.int64),
        np.array([v for i in infos for v in by[i]], dtype=np.float64),
        [r for r in batch if r.get("type") == "log"],
        [r for r in batch if r.get("type") == "event"],
        np.array([float(r["ts"]) * 1e3 for r in samples]),
    )


@pytest.mark.parametrize(
    "scenario",
    [
        "slow_rank",
        "collective_hang",
        "checkpoint_stall",
        "input_starvation",
        "fabric_degraded",
        "hardware_fault",
        "numerical_divergence",
    ],
)
def test_each_simulated_fault_shows_a_sign_within_seconds_of_its_onset(scenario: str) -> None:
    truth, batches = _batches(scenario)
    onset = float(truth["onset"])
    screen = BatchScreen()
    first = None
    for start, batch in batches:
        signs = _screen_batch(screen, batch)
        if start >= onset and signs:
            first = start - onset
            break
    assert first is not None and first <= 5.0, (scenario, first)


def test_state_carries_over_when_a_batch_brings_other_series() -> None:
    """A node's batches change layout (a process starts, a collector on a slower cadence
    reports): each series keeps its running means whichever layout brings it."""
    screen = BatchScreen()
    util = _gpu(signals.DCGM_FI_DEV_GPU_UTIL, 0)
    power = _gpu(signals.DCGM_FI_DEV_POWER_USAGE, 0)
    _steady(screen, {util: 97.0})
    # The stall arrives in batches of another layout (power reported too, for the first time):
    # the level change is seen within two of them, as in one layout, against the baseline
    # the first layout built (lost, the first would only set a new baseline at 10).
    signs = [_look(screen, {power: 300.0, util: 10.0}, 40.0 + k).nodes for k in range(2)]
    assert signs[1] == {NODE: f"{signals.DCGM_FI_DEV_GPU_UTIL} changed level"}
    assert screen.held_series == 2


def test_a_peer_drift_carries_over_when_the_series_job_key_changes() -> None:
    screen = BatchScreen()
    for k in range(30):  # GPU 1 computes 20% longer than GPU 0 while the job runs
        rows = {
            SeriesInfo(signals.DCGM_FI_PROF_SM_ACTIVE, NODE, f"GPU-{i}", i, None, "job-1", i): v
            for i, v in ((0, 0.5), (1, 0.6))
        }
        _look(screen, rows, float(k))
    # The same GPUs' series without the job key (the agent lost the attribution): the drift
    # held for (node, signal, GPU) goes on rather than starting again from 0.
    rows = {_gpu(signals.DCGM_FI_PROF_SM_ACTIVE, i): v for i, v in ((0, 0.5), (1, 0.6))}
    assert "drifting" in _look(screen, rows, 30.0).nodes.get(NODE, "")
