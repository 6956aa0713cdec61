"""The GPU physical model: consistency of the signals it derives from activity and faults."""

from __future__ import annotations

import numpy as np

from contract import signals
from simulator.hardware import H100_SXM, GpuActivity, GpuFaults, compute_speed, simulate_gpus


def _busy_activity(n_gpus: int, n: int) -> GpuActivity:
    act = GpuActivity.idle(n_gpus, n)
    act.engine_active[:, 10:] = 0.98
    act.sm_active[:, 10:] = 0.9
    act.sm_occupancy[:, 10:] = 0.4
    act.tensor_active[:, 10:] = 0.62
    act.dram_active[:, 10:] = 0.4
    act.fb_used_mib[:, 5:] = 60000
    return act


def test_ratios_power_clock_fb_are_consistent() -> None:
    rng = np.random.default_rng(1)
    act = _busy_activity(4, 300)
    out = simulate_gpus(act, GpuFaults(4, 300), rng)
    eng = out[signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE]
    assert (out[signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE] <= eng).all()
    assert (out[signals.DCGM_FI_PROF_SM_ACTIVE] <= eng).all()
    power = out[signals.DCGM_FI_DEV_POWER_USAGE]
    assert power.min() >= 0.9 * 0.92 * H100_SXM.idle_w and power.max() <= H100_SXM.tdp_w
    assert power[:, 100:].mean() > 450  # a dense training step draws most of the TDP
    assert power[:, :5].mean() < 90  # no context: idle
    fb = out[signals.DCGM_FI_DEV_FB_USED] + out[signals.DCGM_FI_DEV_FB_FREE]
    assert (fb == H100_SXM.fb_total_mib - H100_SXM.fb_reserved_mib).all()
    clock = out[signals.DCGM_FI_DEV_SM_CLOCK]
    assert (clock[:, :5] == 345).all() and clock[:, 100:].min() >= 1800
    temp = out[signals.DCGM_FI_DEV_GPU_TEMP]
    assert 25 <= temp[:, :5].mean() < 40 and 55 < temp[:, -10:].mean() < 85
    # Thermal inertia: the die does not jump to its loaded temperature in one second.
    assert temp[:, 11].mean() < temp[:, 100].mean() - 10
    # The link trains down while idle and up under load.
    gen = out[signals.DCGM_FI_DEV_PCIE_LINK_GEN]
    assert (gen[:, :5] == 1).all() and (gen[:, 20:] == 5).all()


def test_faults_throttle_power_cap_and_counters() -> None:
    rng = np.random.default_rng(2)
    n = 200
    act = _busy_activity(3, n)
    faults = GpuFaults(3, n)
    faults.throttle(0, 50, None, bits=signals.THROTTLE_HW_SLOWDOWN, clock_mhz=1200)
    faults.power_cap(1, 50, None, 350.0)
    faults.pcie_downgrade(2, 50, None, gen=3, width=8, replays_per_s=2.0)
    faults.set_preexisting(signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, 2, 3)
    out = simulate_gpus(act, faults, rng)
    clock = out[signals.DCGM_FI_DEV_SM_CLOCK]
    bits = out[signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS]
    assert clock[0, 60:].max() <= 1200 and (bits[0, 60:] & signals.THROTTLE_HW_SLOWDOWN).all()
    power = out[signals.DCGM_FI_DEV_POWER_USAGE]
    assert power[1, 60:].max() <= 350 and (bits[1, 60:] & signals.THROTTLE_SW_POWER_CAP).all()
    assert clock[1, 60:].mean() < clock[2, 60:].mean()
    assert (out[signals.DCGM_FI_DEV_PCIE_LINK_GEN][2, 60:] == 3).all()
    assert (out[signals.DCGM_FI_DEV_PCIE_LINK_WIDTH][2, 60:] == 8).all()
    replays = out[signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER]
    assert (np.diff(replays, axis=1) >= 0).all() and replays[2, -1] > 200
    assert replays[2, 49] == 0 and replays[0, -1] == 0
    remap = out[signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS]
    assert (remap[2] == 3).all()  # pre-existing and flat
    speed = compute_speed(H100_SXM, faults, 0.9)
    assert speed[0, 60] < 0.65 and speed[1, 60] < 0.8 and speed[2, 60] == 1.0


def test_lost_gpu_stops_reporting() -> None:
    rng = np.random.default_rng(3)
    faults = GpuFaults(2, 50)
    faults.lose(1, 20)
    out = simulate_gpus(_busy_activity(2, 50), faults, rng)
    assert np.isnan(out[signals.DCGM_FI_DEV_POWER_USAGE][1, 20:]).all()
    assert (out[signals.DCGM_FI_DEV_SM_CLOCK][1, 20:] == -1).all()
    assert np.isfinite(out[signals.DCGM_FI_DEV_POWER_USAGE][0]).all()
