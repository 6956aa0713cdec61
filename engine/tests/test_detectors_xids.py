"""Fault vs warning vs application XIDs (engine/detectors/xids.py, NVIDIA's catalogue):
faults hit the job (`hardware_fault`), warnings feed fleet health (`gpu_degrading`), the
application's own XIDs blame neither."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from contract import signals
from contract.rows import EventRow
from engine.analyze import analyze_trace
from engine.clearance import hardware_clearance
from engine.detectors import detect_gpu_degrading, detect_hardware_fault, run_detectors
from engine.detectors.xids import (
    APPLICATION,
    CATALOGUE,
    FAULT,
    FAULT_XIDS,
    WARNING,
    WARNING_XIDS,
    xid_kind,
)
from engine.findings import INFRASTRUCTURE
from engine.tests.synthetic import T0, counter, finding, gpu_uuid, healthy_sync, steps, window
from engine.window import GpuWindow, StepTable
from simulator import simulate


def _xid(code: int, gpu: int = 2, at: float = 200.0) -> EventRow:
    return EventRow(
        T0 + at, signals.EVENT_XID, "n0", gpu_uuid(gpu), gpu % 4, "", float(code), f"Xid {code}"
    )


def _learning() -> np.ndarray:
    return 8.0 * np.exp(-np.arange(30) / 10) + 2.0


def _accelerating_sbe(n: int = 600) -> np.ndarray:
    rate = np.where(np.arange(n) >= 100, 0.05 * np.exp((np.arange(n) - 100) / 150.0), 0.0)
    return 12 + np.cumsum(np.random.default_rng(7).poisson(rate))


def test_catalogue_classes_are_disjoint_and_follow_nvidia() -> None:
    # (the three sets are built from CATALOGUE by kind: disjoint by construction)
    assert {48, 64, 74, 79, 94, 95, 119, 120, 140} <= FAULT_XIDS
    assert {63, 92} <= WARNING_XIDS
    assert {c for c, x in CATALOGUE.items() if x.kind == APPLICATION} == {13, 31, 43, 45, 137}
    assert CATALOGUE[92].name == "High single-bit ECC error rate"
    assert xid_kind(92.0) == WARNING and xid_kind(79) == FAULT and xid_kind(13) == APPLICATION
    assert xid_kind(None) is None and xid_kind(float("nan")) is None and xid_kind(9999) is None


@pytest.mark.parametrize("code", [79, 48])
def test_fault_xid_on_a_running_job_is_hardware_fault(code: int) -> None:
    w = window(sync=healthy_sync(np.random.default_rng(1)), steps=steps(_learning()))
    w.events.append(_xid(code))
    found = run_detectors(w)
    assert [f.family for f in found] == ["hardware_fault"]
    f = found[0]
    assert f.subject["gpu"] == gpu_uuid(2) and f.subject["rank"] == 2
    assert f"XID {code}" in f.summary
    assert any(e.observed == code for e in f.evidence)
    assert f.gpu_hours_lost is not None and f.gpu_hours_lost > 0


@pytest.mark.parametrize("code", [92, 63])
def test_warning_xid_with_healthy_job_is_not_a_hardware_fault(code: int) -> None:
    w = window(sync=healthy_sync(np.random.default_rng(1)), steps=steps(_learning()))
    w.events.extend([_xid(code, at=150.0), _xid(code, at=250.0)])
    assert detect_hardware_fault(w) == []
    assert run_detectors(w) == []


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xid_blames_neither_job_hardware_nor_fleet(code: int) -> None:
    w = window(sync=healthy_sync(np.random.default_rng(1)), steps=steps(_learning()))
    w.events.append(_xid(code))
    assert detect_hardware_fault(w) == []
    g = gpu_uuid(2)
    gw = GpuWindow(
        g,
        "n0",
        2,
        T0,
        T0 + 599,
        {
            signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: counter(
                g, signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, _accelerating_sbe()
            )
        },
        [_xid(code)],
    )
    assert detect_gpu_degrading(gw) == []  # one sign (SBE) only: the app's XID is not a sign
    f = finding("numerical_divergence")
    w.gpu_raw = {g: {}}  # counters seen (empty) so the clearance runs
    w.gpu_raw[g][signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL] = counter(
        g, signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, np.zeros(300)
    )
    cleared = hardware_clearance(w, f)
    hw = next(c for c in cleared if c.check == "hardware")
    assert hw.result == "clear"
    assert f"application XID(s) {code}" in hw.note


def test_xid92_with_accelerating_sbe_is_gpu_degrading_only() -> None:
    """The reported case: corrected errors accelerate with XID 92s while the job runs fine."""
    g = gpu_uuid(2)
    xids = [_xid(92, at=400.0), _xid(92, at=520.0)]
    sbe = counter(g, signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, _accelerating_sbe())
    job = window(
        sync=healthy_sync(np.random.default_rng(3)),
        steps=steps(_learning()),
        events=list(xids),
        gpu_raw={g: {signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: sbe}},
    )
    assert run_detectors(job) == []  # no hardware_fault, nothing else either
    gw = GpuWindow(g, "n0", 2, T0, T0 + 599, {signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: sbe}, xids)
    found = detect_gpu_degrading(gw)
    assert [f.family for f in found] == ["gpu_degrading"]
    f = found[0]
    assert f.category == INFRASTRUCTURE and f.subject["gpu"] == g and f.subject["job"] is None
    assert "rising single-bit ECC rate" in f.summary and "2 warning XID(s)" in f.summary
    xid_ev = next(e for e in f.evidence if e.signal.startswith("event: xid"))
    assert xid_ev.observed == 2 and "XID 92 (High single-bit ECC error rate)" in xid_ev.note
    # Without the XID 92s the accelerating SBE is one sign: not enough alone.
    alone = GpuWindow(g, "n0", 2, T0, T0 + 599, {signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: sbe}, [])
    assert detect_gpu_degrading(alone) == []


def test_warning_xid_implicates_only_the_gpu_an_infrastructure_verdict_blames() -> None:
    g = gpu_uuid(2)
    w = window(
        sync=healthy_sync(np.random.default_rng(1)),
        events=[_xid(92)],
        gpu_raw={
            g: {
                signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: counter(
                    g, signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, np.zeros(300)
                )
            }
        },
    )
    job_f = finding("sequence_imbalance")
    hw = next(c for c in hardware_clearance(w, job_f) if c.check == "hardware")
    assert hw.result == "clear" and "warning XID(s) 92" in hw.note
    blamed = finding("slow_rank", INFRASTRUCTURE, node="n0", gpu=g, rank=2)
    hw = next(c for c in hardware_clearance(w, blamed) if c.check == "hardware")
    assert hw.result == "implicated"


def test_simulated_xid92_twin_analyzes_to_gpu_degrading_only(tmp_path: Path) -> None:

    run = simulate("xid92_warning", seed=4, duration_s=420, nodes=1, gpus_per_node=4)
    path = tmp_path / "xid92.jsonl.gz"
    run.write(path)
    truth = run.meta["truth"]
    assert any(r.get("name") == signals.EVENT_XID and r.get("value") == 92 for r in run.records())
    with open(os.devnull, "w") as devnull:
        verdicts = analyze_trace(str(path), err=devnull)
    assert [v["family"] for v in verdicts] == ["gpu_degrading"]
    assert verdicts[0]["subject"]["gpu"] == truth["subject"]["gpu"]


def test_progress_bar_rows_after_a_fault_are_not_a_blown_up_loss() -> None:
    # HF Trainer prints bar rows (a step, no loss) between its metric dicts; their loss
    # column is NaN. A healthy loss after a fault XID must not read as "the loss blew up".
    printed = steps(_learning())
    k = len(printed)
    bar_ts = printed.ts + 5.0
    order = np.argsort(np.concatenate([printed.ts, bar_ts]), kind="stable")
    nan = np.full(k, np.nan)
    table = StepTable(
        ts=np.concatenate([printed.ts, bar_ts])[order],
        step=np.concatenate([printed.step, printed.step + 5.0])[order],
        loss=np.concatenate([printed.loss, nan])[order],
        lr=np.concatenate([printed.lr, nan])[order],
        grad_norm=np.concatenate([printed.grad_norm, nan])[order],
        iter_ms=np.concatenate([printed.iter_ms, nan])[order],
        has_loss=np.concatenate([np.ones(k, bool), np.zeros(k, bool)])[order],
    )
    w = window(sync=healthy_sync(np.random.default_rng(1)), steps=table)
    w.events.append(_xid(79))
    found = run_detectors(w)
    assert [f.family for f in found] == ["hardware_fault"]
    assert not any(e.signal == "log: loss" for e in found[0].evidence)
    assert "blew up" not in found[0].summary
