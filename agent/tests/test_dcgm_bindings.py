"""DCGM bindings collector: field mapping, graceful absence, and the value path with a fake
binding object shaped like DCGM's pydcgm (DCGM itself needs NVIDIA GPUs and a host engine)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agent.collectors.dcgm import (
    DEFAULT_FIELDS,
    PROFILING_FIELDS,
    Bindings,
    DcgmCollector,
    DcgmUnavailable,
    load_bindings,
)
from contract import signals
from contract.trace.records import check_record

NODE = "gpu-node-07"


def test_field_ids_map_to_design_names() -> None:
    assert PROFILING_FIELDS[1001] == signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE
    assert PROFILING_FIELDS[1002] == signals.DCGM_FI_PROF_SM_ACTIVE
    assert PROFILING_FIELDS[1003] == signals.DCGM_FI_PROF_SM_OCCUPANCY
    assert PROFILING_FIELDS[1004] == signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    assert PROFILING_FIELDS[1005] == signals.DCGM_FI_PROF_DRAM_ACTIVE
    assert PROFILING_FIELDS[1009] == "DCGM_FI_PROF_PCIE_TX_BYTES"
    assert PROFILING_FIELDS[1012] == "DCGM_FI_PROF_NVLINK_RX_BYTES"
    # the ids agree with dcgm-exporter's own field list (real file)
    csv = (Path(__file__).parent / "data" / "dcgm" / "default-counters.csv").read_text()
    for name in PROFILING_FIELDS.values():
        if name.startswith("DCGM_FI_PROF_") and name in csv:
            assert f"{name}," in csv


def test_missing_bindings_reason(tmp_path: Path) -> None:
    with pytest.raises(DcgmUnavailable, match="DCGM Python bindings not found"):
        load_bindings([tmp_path / "nope"])
    col = DcgmCollector(node=NODE, bindings_paths=[tmp_path / "nope"])
    assert col.collect(1.0) == []
    assert col.available is False
    assert "not found" in (col.unavailable_reason or "")
    assert str(tmp_path / "nope") in (col.unavailable_reason or "")


def test_broken_bindings_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pydcgm.py").write_text(
        "raise OSError('libdcgm.so.4: cannot open shared object')\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "pydcgm", raising=False)
    col = DcgmCollector(node=NODE, bindings_paths=[tmp_path])
    assert col.collect(1.0) == []
    assert "failed to import" in (col.unavailable_reason or "")
    assert "libdcgm.so.4" in (col.unavailable_reason or "")


# --- a fake shaped like pydcgm ------------------------------------------------------------------


class FieldValue:
    """Like dcgm_field_helpers.DcgmFieldValue."""

    def __init__(self, field_id: int, value: Any, ts: int, blank: bool = False) -> None:
        self.fieldId, self.value, self.ts, self.isBlank = field_id, value, ts, blank


class FakeDcgm:
    def __init__(self, values: dict[int, dict[int, list[FieldValue]]], fail: str | None = None):
        self.values = values
        self.fail = fail
        self.watched: list[tuple[Any, ...]] = []
        fake = self

        class DcgmHandle:
            def __init__(self, ipAddress: str | None = None, opMode: int = 0) -> None:
                if fake.fail == "connect":
                    raise Exception("Host engine connection invalid/disconnected")
                self.ipAddress, self.opMode = ipAddress, opMode

            def GetSystem(self) -> Any:
                attrs = {i: f"GPU-dcgm-{i}" for i in (0, 1)}
                return SimpleNamespace(
                    discovery=SimpleNamespace(
                        GetGpuAttributes=lambda gpu_id: SimpleNamespace(
                            identifiers=SimpleNamespace(uuid=attrs[gpu_id])
                        )
                    )
                )

        class Samples:
            def WatchFields(self, fg: Any, freq: int, age: float, keep: int) -> None:
                fake.watched.append((tuple(fg.fieldIds), freq, age, keep))

            def GetLatest(self, fg: Any) -> Any:
                if fake.fail == "read":
                    raise Exception("Host engine connection invalid/disconnected")
                return SimpleNamespace(values=fake.values)

        class DcgmGroup:
            def __init__(self, handle: Any, groupId: int | None = None) -> None:
                self.groupId = groupId
                self.samples = Samples()

        class DcgmFieldGroup:
            def __init__(self, handle: Any, name: str = "", fieldIds: list[int] | None = None):
                self.name, self.fieldIds = name, fieldIds or []

        self.bindings = Bindings(
            pydcgm=SimpleNamespace(
                DcgmHandle=DcgmHandle, DcgmGroup=DcgmGroup, DcgmFieldGroup=DcgmFieldGroup
            ),
            dcgm_structs=SimpleNamespace(
                DCGM_GROUP_ALL_GPUS=0x7FFFFFFF, DCGM_OPERATION_MODE_AUTO=1
            ),
        )


def test_values_become_samples_with_identity() -> None:
    fake = FakeDcgm(
        {
            0: {
                1001: [FieldValue(1001, 0.42, 1), FieldValue(1001, 0.97, 2)],
                1004: [FieldValue(1004, 0.31, 2)],
                1009: [FieldValue(1009, 123456789, 2)],
                1005: [FieldValue(1005, None, 2, blank=True)],
                150: [FieldValue(150, 55, 2)],  # not a profiling field we watch
            },
            1: {1002: [FieldValue(1002, 0.5, 2)]},
        }
    )
    col = DcgmCollector(node=NODE, bindings=fake.bindings)
    records = col.collect(50.0)
    assert col.available is True
    # the table in field groups of <= 128 ids: FAST ones every 1 s, SLOW ones every 10 s
    assert [(freq, age) for _ids, freq, age, _keep in fake.watched] == [
        (1_000_000, 30.0),
        (10_000_000, 30.0),
        (10_000_000, 30.0),
    ]
    watched = [i for ids, *_ in fake.watched for i in ids]
    assert sorted(watched) == sorted(f.id for f in DEFAULT_FIELDS)
    assert all(len(ids) <= 128 for ids, *_ in fake.watched)
    assert set(PROFILING_FIELDS) <= set(watched) and 150 not in watched  # NVML reads 150
    got = {(r["gpu_index"], r["name"]): r["value"] for r in records}
    assert got == {
        (0, signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE): 0.97,  # latest of the series
        (0, signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE): 0.31,
        (0, "DCGM_FI_PROF_PCIE_TX_BYTES"): 123456789.0,
        (1, signals.DCGM_FI_PROF_SM_ACTIVE): 0.5,
    }
    assert {r["gpu"] for r in records if r["gpu_index"] == 0} == {"GPU-dcgm-0"}
    for r in records:
        assert check_record(r) is None and r["node"] == NODE and r["ts"] == 50.0


def test_uuid_from_nvml_preferred() -> None:
    fake = FakeDcgm({0: {1001: [FieldValue(1001, 0.1, 1)]}})
    col = DcgmCollector(node=NODE, bindings=fake.bindings, gpu_uuid=lambda i: f"GPU-nvml-{i}")
    assert col.collect(1.0)[0]["gpu"] == "GPU-nvml-0"


def test_host_engine_down_is_unavailable_with_reason() -> None:
    fake = FakeDcgm({}, fail="connect")
    col = DcgmCollector(node=NODE, bindings=fake.bindings, host="10.0.0.5")
    assert col.collect(1.0) == []
    assert "nv-hostengine" in (col.unavailable_reason or "")
    assert "10.0.0.5" in (col.unavailable_reason or "")


def test_read_failure_reported_once_then_recovers() -> None:
    fake = FakeDcgm({0: {1001: [FieldValue(1001, 0.1, 1)]}}, fail="read")
    col = DcgmCollector(node=NODE, bindings=fake.bindings)
    first = col.collect(1.0)
    assert [r["name"] for r in first] == [signals.EVENT_COLLECTOR_ERROR]
    assert col.collect(2.0) == []
    fake.fail = None
    assert [r["name"] for r in col.collect(3.0)] == [signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE]


def test_host_engine_started_later_is_picked_up() -> None:
    fake = FakeDcgm({0: {1001: [FieldValue(1001, 0.7, 1)]}}, fail="connect")
    col = DcgmCollector(node=NODE, bindings=fake.bindings, retry_after_s=60)
    assert col.collect(100.0) == []
    fake.fail = None  # nv-hostengine comes up
    assert col.collect(130.0) == []  # not asked again before retry_after_s
    assert [r["value"] for r in col.collect(161.0)] == [0.7]
    assert col.available is True and col.unavailable_reason is None


def test_missing_bindings_are_not_retried(tmp_path: Path) -> None:
    calls = []

    def loader(paths: object) -> Bindings:
        calls.append(paths)
        raise DcgmUnavailable("DCGM Python bindings not found")

    col = DcgmCollector(node=NODE, loader=loader, retry_after_s=1)
    for t in range(5):
        col.collect(float(t * 10))
    assert len(calls) == 1


# --- the whole table: unsupported fields, slow fields, the simulated host engine --------------

NOT_SUPPORTED_I64 = 0x7FFFFFFFFFFFFFF0 + 2
BLANK_I64 = 0x7FFFFFFFFFFFFFF0


def test_not_supported_is_skipped_once_and_listed() -> None:
    enc, dec = 206, 207  # DCGM_FI_DEV_ENC_UTIL, DCGM_FI_DEV_DEC_UTIL
    fake = FakeDcgm(
        {
            0: {
                enc: [FieldValue(enc, NOT_SUPPORTED_I64, 1, blank=True)],
                dec: [FieldValue(dec, 3, 1)],
            },
            1: {
                enc: [FieldValue(enc, 12, 1)],
                dec: [
                    FieldValue(dec, BLANK_I64, 1, blank=True)
                ],  # no sample yet: not "unsupported"
            },
        }
    )
    col = DcgmCollector(node=NODE, bindings=fake.bindings)
    got = {(r["gpu_index"], r["name"]) for r in col.collect(1.0)}
    assert got == {(0, "DCGM_FI_DEV_DEC_UTIL"), (1, "DCGM_FI_DEV_ENC_UTIL")}
    assert col.unsupported_fields() == {0: ["DCGM_FI_DEV_ENC_UTIL"]}
    # GPU 0 starts answering (it never would; the point is that it is no longer looked at)
    fake.values[0][enc] = [FieldValue(enc, 50, 2)]
    assert (0, "DCGM_FI_DEV_ENC_UTIL") not in {
        (r["gpu_index"], r["name"]) for r in col.collect(2.0)
    }


def test_slow_fields_every_10_s_and_sent_on_change_or_each_minute() -> None:
    energy = 156  # DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: a counter, SLOW
    util = 204  # DCGM_FI_DEV_MEM_COPY_UTIL: a gauge, FAST
    fake = FakeDcgm({0: {energy: [FieldValue(energy, 1000, 1)], util: [FieldValue(util, 7, 1)]}})
    col = DcgmCollector(node=NODE, bindings=fake.bindings)
    sent: dict[float, set[str]] = {}
    for t in range(0, 95):
        if t == 30:
            fake.values[0][energy] = [FieldValue(energy, 5000, 2)]
        sent[float(t)] = {r["name"] for r in col.collect(float(t))}
    energy_at = [t for t, names in sent.items() if "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in names]
    assert energy_at == [0.0, 30.0, 90.0]  # first read, the change, a minute after it
    assert all("DCGM_FI_DEV_MEM_COPY_UTIL" in names for names in sent.values())


def test_simulated_host_engine_through_the_sim_backend() -> None:
    from agent.runtime.sim_backend import SimBackend, SimDcgmSource

    first = SimBackend.from_scenario(
        "healthy_training", seed=3, duration_s=40, start_ts=1000.0, nodes=1, gpus_per_node=2
    )
    node = str(first.trace_meta()[0]["nodes"][0])
    backend = SimBackend(first.run, node=node, start_ts=1000.0, duration_s=40, dcgm_fields=True)
    source = next(c for c in backend.collectors() if isinstance(c, SimDcgmSource))
    series: dict[tuple[int, str], list[float]] = {}
    for t in range(40):
        for r in source.collect(1000.0 + t):
            assert check_record(r) is None
            series.setdefault((r["gpu_index"], r["name"]), []).append(r["value"])
    names = {name for _gpu, name in series}
    # H100 SXM: all 18 links per link, the profiling fields, none of what NVML reads
    assert {f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{n}" for n in range(18)} <= names
    assert {f"DCGM_FI_PROF_NVLINK_L{n}_RX_BYTES" for n in range(18)} <= names
    assert set(PROFILING_FIELDS.values()) <= names
    assert signals.DCGM_FI_DEV_POWER_USAGE not in names
    # the fields an H100 lacks were answered NOT_SUPPORTED and skipped, per GPU
    unsupported = source.collector.unsupported_fields()
    assert set(unsupported) == {0, 1}
    assert "DCGM_FI_DEV_ENC_UTIL" in unsupported[0] and "DCGM_FI_DEV_RETIRED_SBE" in unsupported[0]
    assert not names & set(unsupported[0])
    # energy is a counter: it only grows, at roughly the simulated power
    energy = series[(0, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")]
    assert energy == sorted(energy) and energy[-1] > energy[0]
    active = series[(0, signals.DCGM_FI_PROF_SM_ACTIVE)]
    assert len(active) == 40 and max(active) > 0.3


def test_doctor_lists_the_fields_each_gpu_does_not_support() -> None:
    from agent.collectors.dcgm_sim import SimulatedDcgm
    from agent.commands.doctor import OK, check_dcgm_bindings
    from agent.config import parse_config
    from simulator.dcgm_fields import SimDcgmGpu
    from simulator.hardware import A100_SXM

    zeros = {signals.DCGM_FI_DEV_GPU_UTIL: np.array([50.0])}
    engine = SimulatedDcgm([SimDcgmGpu(0, zeros, A100_SXM)], ["GPU-a100-0"])
    cfg = parse_config({"dcgm": {"mode": "bindings"}}, env={})
    check = check_dcgm_bindings(cfg, bindings=engine.bindings(), settle_s=0)
    assert check.status == OK
    assert f"{len(DEFAULT_FIELDS)} fields watched" in check.detail
    # an A100 has 12 NVLinks: links 12..17 and the encoder are reported, page retirement too
    assert "GPU 0:" in check.detail and "DCGM_FI_DEV_ENC_UTIL" in check.detail
    assert "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L12" in check.detail
    assert "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L11," not in check.detail
    assert "DCGM_FI_DEV_RETIRED_SBE" in check.detail
    assert "DCGM_FI_DEV_DEC_UTIL" not in check.detail
