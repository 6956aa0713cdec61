"""The days-ahead forecast (engine/forecast.py) on hand-built daily series: a degrading GPU and
IB port flagged with evidence, a benign burst, a plateau, an old flat count and a recovered link
not drained, counter resets and gaps not counted as errors, and the batch refusing bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contract import signals
from engine import forecast as fc

SBE = signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
REMAPS = signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
DAYS = fc.LOOKBACK_DAYS


def _gpu_batch(sbe_rows: list[list[float]], **extra: np.ndarray) -> fc.BatchForecast:
    n = len(sbe_rows)
    daily = {SBE: np.asarray(sbe_rows, dtype=np.float64)}
    daily.update(extra)
    batch = fc.ComponentBatch(
        "gpu", [f"GPU-{i}" for i in range(n)], ["node-a"] * n, 1_767_225_600.0, daily
    )
    return fc.forecast_batch(batch)


def _quiet(days: int = DAYS) -> list[float]:
    return [2.0] * days


def test_counter_increase_counts_resets_from_zero_and_never_a_preexisting_count() -> None:
    # Hour 0: old count 5000 (pre-existing: no increase); +10 in hour 1; driver reload before
    # hour 2 (restarts at 0, +3); a gap at hour 3; +4 across the gap and +1 inside hour 4;
    # a reset inside hour 5 (last below first: counted from zero).
    first = np.array([[5000.0, 5000.0, 0.0, np.nan, 7.0, 12.0]])
    last = np.array([[5000.0, 5010.0, 3.0, np.nan, 8.0, 2.0]])
    inc = fc.counter_increase(first, last)
    assert inc[0, 0] == 0.0
    assert inc[0, 1] == 10.0
    assert inc[0, 2] == 3.0
    assert math.isnan(inc[0, 3])
    assert inc[0, 4] == 5.0  # 4 between hours 2 and 4, 1 inside hour 4
    assert inc[0, 5] == 6.0  # 12 − 8 = 4 before the reset… counted as 2 after it, plus 4
    # Two series of one GPU (it moved nodes) add up hour by hour.
    a = fc.counter_increase(np.array([[0.0, 1.0, np.nan]]), np.array([[1.0, 2.0, np.nan]]))
    b = fc.counter_increase(np.array([[np.nan, np.nan, 50.0]]), np.array([[np.nan, np.nan, 52.0]]))
    assert np.nansum(np.vstack([a, b]), axis=0).tolist() == [1.0, 1.0, 2.0]


def test_daily_sums_days_ending_at_the_last_hour_and_leaves_empty_days_nan() -> None:
    hourly = np.full((1, 3 * 24 + 5), np.nan)
    hourly[0, -24:] = 1.0
    hourly[0, -48:-24] = 2.0
    d = fc.daily(hourly)
    assert d.shape == (1, 3)
    assert d[0, 2] == 24.0 and d[0, 1] == 48.0 and math.isnan(d[0, 0])
    with pytest.raises(ValueError, match="unknown daily aggregate 'median'"):
        fc.daily(hourly, "median")


def test_growing_sbe_with_warning_xids_is_drained_with_its_evidence() -> None:
    growing = [*_quiet(DAYS - 5), 40.0, 90.0, 200.0, 450.0, 1000.0]
    warnings = np.zeros((2, DAYS))
    warnings[0, -4:] = [1.0, 2.0, 4.0, 7.0]
    fc_ = _gpu_batch([growing, _quiet()], **{fc.XID_WARNINGS: warnings})
    assert fc.LEVELS[int(fc_.level[0])] in ("drain", "urgent")
    assert fc_.level[1] == 0
    result = fc.component_result(fc_, 0)
    sbe = next(e for e in result["evidence"] if e["signal"] == SBE)
    assert sbe["now"] == 1000.0 and sbe["three_days_ago"] == 90.0
    assert sbe["threshold"] == 5000.0 and "XID 48" in sbe["heading_for"]
    assert sbe["doubling_days"] is not None and sbe["doubling_days"] < 1.5
    assert result["ttf_hours"] is not None and 0 < result["ttf_hours"] < 7 * 24
    assert result["risk"]["7d"] >= fc.DRAIN_RISK
    assert len(result["daily"][SBE]) == DAYS
    assert "heading for XID 48" in fc.summary_text(result)
    assert fc.summary_text(fc.component_result(fc_, 1)) == "no sign of degradation"


def test_one_young_sign_is_watch_only_and_a_burst_plateau_or_flat_count_is_nothing() -> None:
    two_days = [*_quiet(DAYS - 2), 120.0, 400.0]  # 2 days present, not 3: nothing yet
    slowing = [*_quiet(DAYS - 3), 40.0, 1200.0, 1300.0]  # a jump, then +8%: watch at most
    burst = [*_quiet(DAYS - 2), 3000.0, 2.0]  # a burst that stopped
    plateau = [*_quiet(DAYS - 4), 30.0, 2500.0, 2600.0, 2550.0]  # a step up that stays flat
    # A GPU that always logs 8-24 a day (around the fixed floor of 20) and a burst today.
    trickle = [8.0, 12.0, 9.0, 14.0, 10.0, 12.0, 16.0, 11.0, 13.0, 15.0, 23.0, 20.0, 23.0, 855.0]
    fc_ = _gpu_batch([two_days, slowing, burst, plateau, trickle, _quiet()])
    assert fc_.level[0] <= 1 and fc_.risk[0, 2] <= fc.SINGLE_SIGN_RISK_CAP
    assert fc_.level[1] <= 1 and fc_.risk[1, 2] <= fc.SINGLE_SIGN_RISK_CAP
    assert fc_.level[2] == 0 and not fc_.active[2].any()
    assert fc_.level[3] == 0 and not fc_.active[3].any()
    assert fc_.level[4] == 0 and not fc_.active[4].any()
    assert fc_.level[5] == 0


def test_a_sign_growing_steadily_three_days_drains_a_step_on_a_partial_day_does_not() -> None:
    # ×3 a day on each of the last two days (each rise far beyond Poisson noise): drain on
    # three days, a day before the four-day rule would.
    steady = [*_quiet(DAYS - 3), 40.0, 120.0, 400.0]
    fc_ = _gpu_batch([steady])
    assert fc_.level[0] >= 2
    # An IB port whose cable errors stepped up on a partial day and stayed (the symbol errors
    # flat, the receive errors +14% on ~300, 2.3 σ): watch at most.
    batch = fc.ComponentBatch(
        "ib_port",
        ["node-a/mlx5_0/1"],
        ["node-a"],
        0.0,
        {
            signals.IB_SYMBOL_ERROR: np.array([[*_quiet(DAYS - 3), 862.0, 1945.0, 1970.0]]),
            signals.IB_LINK_ERROR_RECOVERY: np.array([[0.0] * (DAYS - 3) + [4.0, 3.0, 15.0]]),
            signals.IB_PORT_RCV_ERRORS: np.array([[*_quiet(DAYS - 3), 153.0, 314.0, 358.0]]),
        },
    )
    assert fc.forecast_batch(batch).level[0] <= 1


def test_recovery_clears_a_degrading_ib_port() -> None:
    rising = [*_quiet(DAYS - 5), 200.0, 500.0, 1300.0, 3200.0, 8000.0]
    recovered = [*_quiet(DAYS - 6), 200.0, 500.0, 1300.0, 3200.0, 8000.0, 0.0]
    rec_rising = [0.0] * (DAYS - 5) + [3.0, 6.0, 12.0, 25.0, 50.0]
    rec_after = [0.0] * (DAYS - 6) + [3.0, 6.0, 12.0, 25.0, 50.0, 0.0]
    batch = fc.ComponentBatch(
        "ib_port",
        ["node-a/mlx5_0/1", "node-a/mlx5_1/1"],
        ["node-a", "node-a"],
        0.0,
        {
            signals.IB_SYMBOL_ERROR: np.array([rising, recovered]),
            signals.IB_LINK_ERROR_RECOVERY: np.array([rec_rising, rec_after]),
        },
    )
    out = fc.forecast_batch(batch)
    assert out.level[0] >= 2
    assert out.level[1] == 0 and not out.active[1].any()


def test_a_gpu_heating_above_its_node_peers_is_flagged_and_a_hot_rack_is_not() -> None:
    n = 8
    temp = np.full((n, DAYS), 70.0) + np.arange(n)[:, None] * 0.5  # fixed offsets: not a sign
    temp[0, -5:] = [72.0, 76.0, 80.0, 84.0, 87.0]
    hot_rack = np.full((n, DAYS), 70.0)
    hot_rack[:, -3:] += 8.0  # every GPU of the node hotter: the weather, not a GPU
    throttled = np.zeros((n, DAYS))
    throttled[0, -4:] = [1.0, 2.0, 4.0, 8.0]
    nodes = ["node-a"] * n
    out = fc.forecast_batch(
        fc.ComponentBatch(
            "gpu",
            [f"g{i}" for i in range(n)],
            nodes,
            0.0,
            {fc.TEMP_EXCESS: temp, fc.THROTTLE_HOURS: throttled},
        )
    )
    assert out.level[0] >= 2 and out.level[1:].max() == 0
    rack = fc.forecast_batch(
        fc.ComponentBatch(
            "gpu", [f"g{i}" for i in range(n)], nodes, 0.0, {fc.TEMP_EXCESS: hot_rack}
        )
    )
    assert rack.level.max() == 0
    # The same heating GPU new on its node (data only for the last five days: no usual
    # offset from these peers yet) is not judged against them.
    new = temp.copy()
    new[0, :-5] = np.nan
    fresh = fc.forecast_batch(
        fc.ComponentBatch("gpu", [f"g{i}" for i in range(n)], nodes, 0.0, {fc.TEMP_EXCESS: new})
    )
    assert fresh.level[0] == 0 and not fresh.active[0].any()


def test_remap_headroom_near_the_spare_rows_shortens_time_to_failure() -> None:
    remaps = np.array([[0.0] * (DAYS - 4) + [3.0, 7.0, 16.0, 36.0]] * 2)
    level = np.array([fc.SPARE_ROWS - 10.0, 5.0])
    batch = fc.ComponentBatch("gpu", ["a", "b"], ["n", "n"], 0.0, {REMAPS: remaps}, {REMAPS: level})
    out = fc.forecast_batch(batch)
    j = [r.signal for r in fc.RULES["gpu"]].index(REMAPS)
    assert out.active[:, j].all()
    assert out.sign_ttf[0, j] < out.sign_ttf[1, j]


def test_the_batch_refuses_bad_input_naming_what_was_wrong() -> None:
    with pytest.raises(ValueError, match="unknown component kind 'disk'"):
        fc.ComponentBatch("disk", [], [], 0.0, {})
    with pytest.raises(ValueError, match="1 nodes for 2 components"):
        fc.ComponentBatch("gpu", ["a", "b"], ["n"], 0.0, {})
    with pytest.raises(ValueError, match=r"daily\['x'\] has shape \(3,\)"):
        fc.ComponentBatch("gpu", ["a"], ["n"], 0.0, {"x": np.zeros(3)})
