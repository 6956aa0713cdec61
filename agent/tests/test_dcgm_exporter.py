import logging
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.dcgm_exporter import DcgmExporterCollector
from agent.tests.fileserver import serve
from contract import signals

DATA = Path(__file__).parent / "data" / "dcgm"
L40S = (DATA / "dcgm_exporter_metrics_L40S_upcloud.prom").read_bytes()
T4 = (DATA / "dcgm_exporter_metrics_T4_datadog_fixture.prom").read_bytes()
L40S_UUID = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"


def _by_name(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in records if r["type"] == "sample"}


def test_scrapes_real_http_endpoint_and_maps_identity() -> None:
    with serve({"/metrics": L40S}) as base:
        records = DcgmExporterCollector(f"{base}/metrics").collect(now=1000.0)
    samples = _by_name(records)
    power = samples[signals.DCGM_FI_DEV_POWER_USAGE]
    assert power["value"] == pytest.approx(35.686)
    assert power["ts"] == 1000.0
    assert power["gpu"] == L40S_UUID
    assert power["gpu_index"] == 0
    assert power["node"] == "gpu1-wl8sg"
    assert power["labels"] == {
        "modelName": "NVIDIA L40S",
        "device": "nvidia0",
        "pci_bus_id": "00000000:00:07.0",
    }
    assert samples[signals.DCGM_FI_PROF_DRAM_ACTIVE]["value"] == pytest.approx(0.000131)
    assert samples[signals.DCGM_FI_DEV_GPU_TEMP]["value"] == 32
    # counters reported as read, exact
    assert samples["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"] == 5551899580
    assert samples[signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER]["value"] == 0
    assert all(r["gpu"] == L40S_UUID for r in records)
    assert len(records) == 23


def test_node_override_wins_over_exporter_hostname() -> None:
    with serve({"/metrics": L40S}) as base:
        records = DcgmExporterCollector(f"{base}/metrics", node="node-a").collect(1.0)
    assert {r["node"] for r in records} == {"node-a"}


def test_t4_fixture_kubernetes_job_and_unlabelled_dummies_dropped() -> None:
    with serve({"/metrics": T4}) as base:
        records = DcgmExporterCollector(f"{base}/metrics").collect(5.0)
    dram = [r for r in records if r["name"] == signals.DCGM_FI_PROF_DRAM_ACTIVE]
    # DataDog's dummy DCGM_FI_PROF_* lines carry no labels: no GPU to key them to
    assert len(dram) == 1
    assert dram[0]["job"] == "ray-1111111"
    assert dram[0]["gpu"] == "GPU-abc"
    assert dram[0]["labels"]["namespace"] == "ray-llm"
    assert dram[0]["labels"]["container"] == "ray-worker"
    assert dram[0]["value"] == pytest.approx(3e-06)
    assert not any(r["name"] == signals.DCGM_FI_PROF_SM_ACTIVE for r in records)
    throttle = [r for r in records if r["name"] == signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS]
    assert [t["value"] for t in throttle] == [1]
    assert throttle[0]["gpu"] == "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"
    # two exporter versions, two GPUs of the same index on different hosts
    assert {r["node"] for r in records} == {"424773df46e0", "551bdf382151", "ip-11111"}
    assert all("DCGM_FI_DRIVER_VERSION" not in r.get("labels", {}) for r in records)


def test_xid_field_change_becomes_event_once() -> None:
    body = {"v": L40S + b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-x"} 0\n'}
    with serve({"/metrics": lambda: body["v"]}) as base:
        col = DcgmExporterCollector(f"{base}/metrics")
        assert not [r for r in col.collect(1.0) if r["type"] == "event"]
        body["v"] = L40S + b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-x"} 79\n'
        events = [r for r in col.collect(2.0) if r["type"] == "event"]
        assert len(events) == 1
        assert events[0]["name"] == signals.EVENT_XID and events[0]["value"] == 79
        assert events[0]["gpu"] == "GPU-x"
        assert not [r for r in col.collect(3.0) if r["type"] == "event"]


def test_unreachable_endpoint_logs_once_and_returns_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve({}) as base:
        col = DcgmExporterCollector(f"{base}/metrics")  # 404
        with caplog.at_level(logging.WARNING):
            assert col.collect(1.0) == []
            assert col.collect(2.0) == []
    warnings = [r for r in caplog.records if "cannot scrape" in r.getMessage()]
    assert len(warnings) == 1
    # connection refused (server gone) also yields nothing, without raising
    assert col.collect(3.0) == []
