"""Hardware clearance: what the job's own GPUs and nodes did during exactly its window.

For every job verdict, the deltas of ECC (SBE/DBE), XIDs, remapped rows (correctable,
uncorrectable, failure), throttle time, NVLink CRC and PCIe replay counters over the job's GPUs,
and IB error counters over its nodes, become evidence entries (observed = the delta, baseline =
the pre-existing value at the window's start) and `cleared` entries: `clear` when nothing moved,
`implicated` when something did. A pre-existing counter that stays flat clears the hardware
(docs/design.md §1, case 4): the dispute evidence an operator shows a customer.
"""

from __future__ import annotations

import numpy as np

from contract import signals
from contract.rows import SeriesData
from engine.detectors.common import counter_delta
from engine.detectors.hardware import FAULT_COUNTERS, IB_ERROR_COUNTERS
from engine.detectors.xids import APPLICATION, FAULT, WARNING, xid_kind
from engine.findings import INFRASTRUCTURE, Cleared, Finding
from engine.window import JobWindow

GPU_CLEARANCE_COUNTERS: tuple[str, ...] = signals.GPU_ERROR_COUNTERS
# Counters whose increase alone implicates the hardware. SBE, NVLink CRC and PCIe replays are
# corrected errors: a handful are normal on a healthy fleet, so on their own they are reported
# as evidence only; they implicate the hardware when they rose on the GPU an infrastructure
# verdict blames (the detector already tied that GPU to the slowdown).
_IMPLICATING = FAULT_COUNTERS
_HW_THROTTLE = (
    signals.THROTTLE_HW_SLOWDOWN | signals.THROTTLE_HW_THERMAL | signals.THROTTLE_HW_POWER_BRAKE
)


def _increase(s: SeriesData, a: float, b: float) -> tuple[float, float] | None:
    """(increase over [a, b], value already there at a — 0 when unknown) of one cumulative
    counter series; None when it has no sample in [a, b]."""
    keep = (s.ts >= a) & (s.ts <= b)
    if not keep.any():
        return None
    delta, start_value, _ = counter_delta(s.ts[keep], s.values[keep])
    return delta, (start_value if np.isfinite(start_value) else 0.0)


def hardware_clearance(
    w: JobWindow, f: Finding, a: float | None = None, b: float | None = None
) -> list[Cleared]:
    """Append clearance evidence to `f` for [a, b] (default: the job's window) and return the
    `cleared` entries. One evidence entry per counter summed over the job's GPUs (the GPUs with
    a non-zero delta or pre-existing value named in the note), so a 64-GPU job's verdict stays
    readable."""
    a = w.t0 if a is None else a
    b = w.t1 if b is None else b
    gpus = [r.gpu for r in w.ranks if r.gpu]
    blamed_gpu = f.subject.get("gpu") if f.category == INFRASTRUCTURE else None
    hw_ids: list[str] = []
    implicated: list[str] = []
    implicated_notes: list[str] = []
    corrected_rises: list[str] = []
    if not gpus or not any(w.gpu_raw.get(g) for g in gpus):
        return []  # no counters seen: the verdict's "could not see" says so
    for name in GPU_CLEARANCE_COUNTERS:
        total = 0.0
        pre = 0.0
        moved: list[str] = []
        seen = 0
        for g in gpus:
            s = w.gpu_raw.get(g, {}).get(name)
            increase = None if s is None else _increase(s, a, b)
            if increase is None:
                continue
            seen += 1
            total += increase[0]
            pre += increase[1]
            if increase[0] > 0:
                moved.append(g)
        if not seen:
            continue
        note = (
            f"increase over the job's {seen} GPU(s) in its window; baseline: the sum of "
            "pre-existing values at the window's start"
        )
        if moved:
            note += " — rose on " + ", ".join(moved[:4])
        eid = f.add(name, (a, b), total, pre, note, job=w.job)
        hw_ids.append(eid)
        if total > 0 and (name in _IMPLICATING or (blamed_gpu and blamed_gpu in moved)):
            implicated.append(eid)
            implicated_notes.append(f"{name} +{total:g} [{eid}]")
        elif total > 0:
            corrected_rises.append(f"{name} +{total:g}")
    gpu_set = set(gpus)
    xids = [
        e
        for e in w.events
        if e.name == signals.EVENT_XID and a <= e.ts <= b and (not e.gpu or e.gpu in gpu_set)
    ]
    # Fault XIDs implicate the hardware; warning XIDs (corrected/recorded errors) implicate it
    # only on the GPU an infrastructure verdict blames; application XIDs are the program's own.
    hard = [e for e in xids if xid_kind(e.value) == FAULT]
    warned = [e for e in xids if xid_kind(e.value) == WARNING]
    app = [e for e in xids if xid_kind(e.value) == APPLICATION]
    if blamed_gpu:
        hard += [e for e in warned if e.gpu == blamed_gpu]
        warned = [e for e in warned if e.gpu != blamed_gpu]
    other = [
        e
        for e in w.events
        if e.name in (signals.EVENT_ECC_DBE, signals.EVENT_GPU_LOST) and a <= e.ts <= b
    ]
    eid = f.add(
        "event: xid",
        (a, b),
        len(xids),
        0,
        "XID events on the job's GPUs in its window"
        + (": " + ", ".join(str(int(e.value or 0)) for e in xids[:6]) if xids else ""),
        job=w.job,
    )
    hw_ids.append(eid)
    if hard or other:
        implicated.append(eid)
        implicated_notes.append(
            f"{len(hard) + len(other)} hardware XID/ECC/GPU-lost event(s) [{eid}]"
        )
    if warned:
        corrected_rises.append(
            "warning XID(s) " + ", ".join(sorted({str(int(e.value or 0)) for e in warned}))
        )
    if app:
        corrected_rises.append(
            "application XID(s) "
            + ", ".join(sorted({str(int(e.value or 0)) for e in app}))
            + " (the program's own errors, not the hardware's)"
        )
    bits = w.gpu.get(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)
    if bits is not None:
        sel = (w.times >= a) & (w.times <= b)
        v = np.nan_to_num(bits[:, sel], nan=0.0).astype(np.int64)
        throttled = (v & _HW_THROTTLE) != 0
        secs = float(throttled.sum()) * w.dt
        blamed_rows = [i for i, r in enumerate(w.ranks) if blamed_gpu and r.gpu == blamed_gpu]
        blamed_throttled = bool(blamed_rows) and bool(throttled[blamed_rows].any())
        eid = f.add(
            signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
            (a, b),
            secs,
            0,
            "GPU-seconds with hardware throttle reasons set (HW slowdown, HW "
            "thermal, power brake) across the job's GPUs",
            job=w.job,
        )
        hw_ids.append(eid)
        if blamed_throttled:
            implicated.append(eid)
            implicated_notes.append(f"hardware throttling on the blamed GPU [{eid}]")
        elif secs > 0:
            corrected_rises.append(f"hardware throttling {secs:g} GPU-s")
    out = [
        Cleared(
            "hardware",
            "implicated" if implicated else "clear",
            hw_ids,
            ("hardware errors during the job's window: " + "; ".join(implicated_notes))
            if implicated
            else _clear_note(corrected_rises),
        )
    ]
    ib_ids: list[str] = []
    ib_moved = False
    for name in IB_ERROR_COUNTERS:
        total, pre, seen = 0.0, 0.0, 0
        for series in w.node_series.values():
            for s in series:
                increase = _increase(s, a, b) if s.info.name == name else None
                if increase is not None:
                    seen += 1
                    total += increase[0]
                    pre += increase[1]
        if seen:
            ib_ids.append(
                f.add(
                    name,
                    (a, b),
                    total,
                    pre,
                    f"increase over the job's nodes' {seen} IB port(s); baseline: pre-existing sum",
                    job=w.job,
                )
            )
            ib_moved |= total > 0
    if ib_ids:
        out.append(
            Cleared(
                "fabric",
                "implicated" if ib_moved else "clear",
                ib_ids,
                "InfiniBand errors rose on the job's nodes"
                if ib_moved
                else "no InfiniBand errors on the job's nodes during its window",
            )
        )
    return out


def _clear_note(corrected_rises: list[str]) -> str:
    base = "no uncorrectable ECC, row-remap or hardware XID during the job's window on its GPUs"
    if not corrected_rises:
        return base + "; pre-existing counts stayed flat and no hardware throttling"
    return (
        base
        + "; corrected errors/throttling seen, not tied to this verdict's subject: "
        + ", ".join(corrected_rises)
    )
