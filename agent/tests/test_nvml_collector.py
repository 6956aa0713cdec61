"""NVML collector against the simulated pynvml module (real pynvml error classes/structs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pynvml
import pytest

from agent.collectors.nvml import NvmlCollector
from agent.collectors.nvml_sim import SimGpu, SimulatedNvml
from contract import signals
from contract.trace.records import check_record
from simulator.hardware import GpuActivity, GpuFaults, gpu_uuid, simulate_gpus

NODE = "gpu-node-07"


def _by_name(records: list[dict[str, Any]], gpu_index: int) -> dict[str, float]:
    return {
        r["name"]: r["value"]
        for r in records
        if r["type"] == "sample" and r.get("gpu_index") == gpu_index
    }


def _events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == "event" and r["name"] == name]


@pytest.fixture
def sim() -> SimulatedNvml:
    nv = SimulatedNvml.with_gpus(2)
    g = nv.gpus[0]
    g.util_gpu = 97
    g.memory_used = 30 * 1024**3 + 512 * 1024**2
    g.power_mw = 612_345
    g.temp_c = 71
    g.memory_temp_c = 83
    g.sm_clock_mhz = 1755
    g.throttle_reasons = signals.THROTTLE_SW_POWER_CAP | signals.THROTTLE_HW_THERMAL
    g.pcie_gen, g.pcie_width, g.pcie_replay = 4, 8, 120
    g.ecc = {
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 3,
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 177,
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 2,
    }
    g.remapped_rows = (1, 0, 1, 0)
    g.nvlink_crc_flit = [0, 5, 0, 7]
    return nv


def test_values_mapped_to_dcgm_names_and_scaled(sim: SimulatedNvml) -> None:
    col = NvmlCollector(sim, node=NODE)
    records = col.collect(1000.0)
    for r in records:
        assert check_record(r) is None, r
    v = _by_name(records, 0)
    assert v[signals.DCGM_FI_DEV_GPU_UTIL] == 97
    assert v[signals.DCGM_FI_DEV_FB_USED] == pytest.approx(30 * 1024 + 512)  # MiB
    assert v[signals.DCGM_FI_DEV_FB_FREE] == pytest.approx(80 * 1024 - 30 * 1024 - 512)
    assert v[signals.DCGM_FI_DEV_POWER_USAGE] == pytest.approx(612.345)  # mW → W
    assert v[signals.DCGM_FI_DEV_GPU_TEMP] == 71
    assert v[signals.DCGM_FI_DEV_MEMORY_TEMP] == 83
    assert v[signals.DCGM_FI_DEV_SM_CLOCK] == 1755
    assert v[signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS] == 0x4 | 0x40
    assert v[signals.DCGM_FI_DEV_PCIE_LINK_GEN] == 4
    assert v[signals.DCGM_FI_DEV_PCIE_LINK_WIDTH] == 8
    assert v[signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER] == 120
    assert v[signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL] == 3
    assert v[signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL] == 0
    assert v[signals.DCGM_FI_DEV_ECC_SBE_AGG_TOTAL] == 177
    assert v[signals.DCGM_FI_DEV_ECC_DBE_AGG_TOTAL] == 2
    assert v[signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS] == 1
    assert v[signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS] == 0
    assert v[signals.DCGM_FI_DEV_ROW_REMAP_PENDING] == 1
    assert v[signals.DCGM_FI_DEV_ROW_REMAP_FAILURE] == 0
    assert v[signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] == 12  # summed over links
    sample = next(r for r in records if r["type"] == "sample")
    assert sample["node"] == NODE and sample["ts"] == 1000.0
    gpu0 = [r for r in records if r.get("gpu_index") == 0]
    assert {r["gpu"] for r in gpu0} == {sim.gpus[0].uuid}
    # both GPUs report; no events on a healthy node
    assert _by_name(records, 1)[signals.DCGM_FI_DEV_GPU_UTIL] == 0
    assert [r for r in records if r["type"] == "event"] == []


def test_not_supported_field_is_absent_and_not_retried(sim: SimulatedNvml) -> None:
    sim.gpus[1].unsupported = {"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetRemappedRows"}
    col = NvmlCollector(sim, node=NODE)
    for t in range(5):
        records = col.collect(1000.0 + t)
    v1, v0 = _by_name(records, 1), _by_name(records, 0)
    assert signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER not in v1
    assert signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS not in v1
    assert signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER in v0  # other GPU unaffected
    assert signals.DCGM_FI_DEV_GPU_UTIL in v1
    assert _events(records, signals.EVENT_COLLECTOR_ERROR) == []
    # GPU 0 read it five times; GPU 1 once, then remembered NotSupported.
    assert sim.calls["nvmlDeviceGetPcieReplayCounter"] == 5 + 1


def test_other_nvml_error_reported_once_and_collection_continues(sim: SimulatedNvml) -> None:
    sim.gpus[0].errors = {"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_UNKNOWN}
    col = NvmlCollector(sim, node=NODE)
    first = col.collect(1.0)
    second = col.collect(2.0)
    errors = _events(first, signals.EVENT_COLLECTOR_ERROR)
    assert len(errors) == 1
    assert errors[0]["gpu_index"] == 0 and "power" in errors[0]["text"]
    assert _events(second, signals.EVENT_COLLECTOR_ERROR) == []
    assert signals.DCGM_FI_DEV_POWER_USAGE not in _by_name(second, 0)
    assert signals.DCGM_FI_DEV_GPU_TEMP in _by_name(second, 0)
    # transient errors are retried; when the call recovers the value comes back
    sim.gpus[0].errors = {}
    assert signals.DCGM_FI_DEV_POWER_USAGE in _by_name(col.collect(3.0), 0)


def test_gpu_lost_emits_event_once_and_others_keep_going(sim: SimulatedNvml) -> None:
    col = NvmlCollector(sim, node=NODE)
    col.collect(1.0)
    sim.gpus[1].lost = True
    lost = col.collect(2.0)
    events = _events(lost, signals.EVENT_GPU_LOST)
    assert len(events) == 1 and events[0]["gpu"] == sim.gpus[1].uuid
    assert _by_name(lost, 1) == {}
    later = col.collect(3.0)
    assert _events(later, signals.EVENT_GPU_LOST) == []
    assert _by_name(later, 0)[signals.DCGM_FI_DEV_GPU_UTIL] == 97
    assert col.node_facts()["gpus"][1]["lost"] is True


def test_xid_events_and_xid_79_marks_gpu_lost(sim: SimulatedNvml) -> None:
    col = NvmlCollector(sim, node=NODE)
    col.collect(1.0)
    sim.push_xid(0, 48)
    sim.push_xid(1, 79)
    records = col.collect(2.0)
    xids = _events(records, signals.EVENT_XID)
    assert [(e["value"], e["gpu_index"]) for e in xids] == [(48, 0), (79, 1)]
    assert all(check_record(e) is None for e in xids)
    lost = _events(records, signals.EVENT_GPU_LOST)
    assert [e["gpu_index"] for e in lost] == [1]
    assert _by_name(records, 1) == {}
    assert signals.DCGM_FI_DEV_GPU_UTIL in _by_name(records, 0)


def test_dbe_rise_emits_ecc_dbe_event(sim: SimulatedNvml) -> None:
    col = NvmlCollector(sim, node=NODE)
    col.collect(1.0)
    key = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    sim.gpus[0].ecc[key] = 2
    events = _events(col.collect(2.0), signals.EVENT_ECC_DBE)
    assert [(e["gpu_index"], e["value"]) for e in events] == [(0, 2)]


def test_pid_to_gpu_map(sim: SimulatedNvml) -> None:
    sim.gpus[0].processes = [(4242, 1 << 30), (5151, 1 << 30)]
    sim.gpus[1].processes = [(5151, 1 << 30)]
    col = NvmlCollector(sim, node=NODE)
    col.collect(1.0)
    m = col.pid_gpus()
    assert [g.index for g in m[4242]] == [0]
    assert [g.index for g in m[5151]] == [0, 1]
    assert m[4242][0].uuid == sim.gpus[0].uuid
    sim.gpus[0].processes = []
    col.collect(2.0)
    assert 4242 not in col.pid_gpus()


def test_driver_missing_reports_reason_and_returns_nothing() -> None:
    sim = SimulatedNvml.with_gpus(1)
    sim.driver_missing = True
    col = NvmlCollector(sim, node=NODE)
    assert col.collect(1.0) == []
    assert col.available is False
    assert "libnvidia-ml.so.1 not found" in (col.unavailable_reason or "")
    assert sim.calls["nvmlInit"] == 1
    col.collect(2.0)
    assert sim.calls["nvmlInit"] == 1  # not retried every interval


def test_node_facts(sim: SimulatedNvml) -> None:
    facts = NvmlCollector(sim, node=NODE).node_facts()
    assert facts["driver_version"] == "550.90.07"
    assert facts["cuda_version"] == "12.4"
    assert facts["gpus"][0] == {
        "uuid": sim.gpus[0].uuid,
        "index": 0,
        "model": "NVIDIA H100 80GB HBM3",
        "memory_mib": 80 * 1024,
        "lost": False,
    }


def test_real_pynvml_without_driver_is_unavailable_with_reason() -> None:
    """The real nvidia-ml-py on this machine (no NVIDIA driver): a clear reason, no crash."""
    col = NvmlCollector(pynvml, node=NODE)
    if col.start():
        pytest.skip("an NVIDIA driver is present on this machine")
    assert col.collect(1.0) == []
    assert col.unavailable_reason == "libnvidia-ml.so.1 not found — no NVIDIA driver on this node"


def test_older_driver_falls_back_to_throttle_reasons() -> None:
    sim = SimulatedNvml([SimGpu(uuid="GPU-a", throttle_reasons=0x8)])
    sim.gpus[0].errors = {
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    }
    col = NvmlCollector(sim, node=NODE)
    records = col.collect(1.0)
    assert _by_name(records, 0)[signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS] == 0x8
    assert _events(records, signals.EVENT_COLLECTOR_ERROR) == []


def test_round_trip_from_the_simulated_hardware_model() -> None:
    """simulator/hardware.py arrays → simulated NVML API → collector → the same values."""
    n_gpus, n = 2, 12
    act = GpuActivity.idle(n_gpus, n)
    act.engine_active[:] = 0.95
    act.sm_active[:] = 0.8
    act.tensor_active[:] = 0.5
    act.dram_active[:] = 0.3
    act.fb_used_mib[:] = 40000
    faults = GpuFaults(n_gpus, n)
    faults.set_preexisting(signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, 0, 9)
    faults.bump(signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0, at=3, amount=4)
    faults.lose(1, at=6)
    arrays = simulate_gpus(act, faults, np.random.default_rng(7))
    uuids = [gpu_uuid(7, "n1", i) for i in range(n_gpus)]
    nv = SimulatedNvml.from_hardware(arrays, uuids)
    col = NvmlCollector(nv, node="n1")
    lost_at = None
    for t in range(n):
        nv.set_sample(t)
        records = col.collect(float(t))
        if _events(records, signals.EVENT_GPU_LOST):
            lost_at = t
        v = _by_name(records, 0)
        for name in (
            signals.DCGM_FI_DEV_GPU_UTIL,
            signals.DCGM_FI_DEV_FB_USED,
            signals.DCGM_FI_DEV_SM_CLOCK,
            signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
            signals.DCGM_FI_DEV_PCIE_LINK_GEN,
            signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
            signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        ):
            assert v[name] == arrays[name][0, t], (name, t)
        assert v[signals.DCGM_FI_DEV_POWER_USAGE] == pytest.approx(
            arrays[signals.DCGM_FI_DEV_POWER_USAGE][0, t], abs=0.001
        )
    assert lost_at == 6
    assert arrays[signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL][0, 0] == 9


def test_driver_loaded_after_the_agent_is_picked_up() -> None:
    sim = SimulatedNvml.with_gpus(1)
    sim.driver_missing = True
    col = NvmlCollector(sim, node=NODE, retry_after_s=60)
    assert col.collect(100.0) == []
    sim.driver_missing = False
    assert col.collect(150.0) == []  # not retried before 60 s
    assert sim.calls["nvmlInit"] == 1
    records = col.collect(161.0)
    assert signals.DCGM_FI_DEV_GPU_UTIL in _by_name(records, 0)
    assert col.available is True and col.unavailable_reason is None
