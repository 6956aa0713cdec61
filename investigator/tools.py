"""The investigation's procedure: job, node, fabric, storage — in that order, always.

Each step is a bounded tool over the detectors' own input (the verdict's `JobWindow`, built
from the same `SignalStore` the detectors read, offline or live): it summarises, never hands
on raw series, and its output is capped in lines (`MAX_LINES`) and characters (`MAX_CHARS`)
so that a 64-GPU job costs the model the same prompt as an 8-GPU one. Every line a tool
returns is a finding with its own id (`t1`, `t2`, … across the four steps, next to the
verdict's `e1`, `e2` …) so the model can cite it and the validator can check the citation.

A fleet-health verdict (`gpu_degrading`) has no job window: the tools then say so and read
only what the verdict's own evidence holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import signals
from engine.window import JobWindow

CHECKS: tuple[str, ...] = ("job", "node", "fabric", "storage")
# A tool's output: at most this many finding lines and characters. 6 lines × 4 tools keeps the
# whole prompt near 700 tokens, which the default 270M model reads in a few seconds on 2 cores.
MAX_LINES = 6
MAX_CHARS = 600
MAX_CONCLUDED_CHARS = 240


@dataclass
class ToolFinding:
    id: str  # "t1", "t2", …
    text: str


@dataclass
class ToolResult:
    check: str  # one of CHECKS
    findings: list[ToolFinding]
    concluded: str  # "clear", "implicated" or "not seen", with the reason
    result: str  # "clear" | "implicated" | "not_seen"

    @property
    def returned(self) -> str:
        text = "; ".join(f"[{f.id}] {f.text}" for f in self.findings) or "nothing recorded"
        return text[:MAX_CHARS]

    def as_step(self) -> dict[str, str]:
        return {
            "check": self.check,
            "returned": self.returned,
            "concluded": self.concluded[:MAX_CONCLUDED_CHARS],
        }


@dataclass
class _Ids:
    n: int = 0
    found: list[ToolFinding] = field(default_factory=list)

    def add(self, text: str) -> ToolFinding:
        self.n += 1
        f = ToolFinding(f"t{self.n}", text)
        self.found.append(f)
        return f


def fmt(x: float) -> str:
    """A number as the tools print it (and the validator later recognises): 3 significant
    digits, integers as integers."""
    if not math.isfinite(x):
        return "none"
    if abs(x - round(x)) < 1e-9 and abs(x) < 1e12:
        return str(round(x))
    return f"{x:.3g}" if abs(x) < 1000 else str(round(x))


def _median(values: Iterable[float]) -> float:
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    return float(np.median(arr)) if len(arr) else math.nan


def _clearance(verdict: dict[str, Any], check: str) -> dict[str, Any] | None:
    for c in verdict.get("cleared") or []:
        if c.get("check") == check:
            return dict(c)
    return None


# Where each infrastructure family places its cause: that check is implicated by the detector's
# decision, whatever a counter says (a slow rank's throttled clock moves no error counter; a
# degrading GPU's fleet verdict has no clearance at all). Every job family places it in the job.
FAMILY_CHECK: dict[str, str] = {
    "slow_rank": "hardware",
    "hardware_fault": "hardware",
    "gpu_degrading": "hardware",
    "fabric_degraded": "fabric",
    "checkpoint_stall": "storage",
}


def _conclude(verdict: dict[str, Any], check: str, seen: bool) -> tuple[str, str]:
    c = _clearance(verdict, check)
    blamed = {"job": "job", "infrastructure": None}.get(str(verdict.get("category")))
    if FAMILY_CHECK.get(str(verdict.get("family"))) == check:
        return "implicated", f"implicated: the {verdict['family']} detector places the cause here"
    if c is not None:
        ids = ", ".join(c.get("evidence") or [])
        cite = f" [{ids}]" if ids else ""
        return str(c["result"]), f"{c['result']}: {c.get('note') or check}{cite}"
    if not seen:
        return "not_seen", f"not seen: no {check} data in the job's window"
    if check == "job" and blamed == "job":
        return "implicated", "implicated: the detector places the cause in the job"
    return "clear", f"clear: nothing in the {check} data points at a fault"


def job_tool(verdict: dict[str, Any], w: JobWindow | None, ids: _Ids) -> ToolResult:
    """Progress, loss, step time and ranks."""
    start = len(ids.found)
    if w is None:
        ids.add("no job: a fleet-health verdict on one GPU")
        return ToolResult("job", ids.found[start:], "not seen: no job", "not_seen")
    st = w.steps
    if len(st):
        steps = st.step[np.isfinite(st.step)]
        if len(steps):
            ids.add(f"steps {fmt(float(steps.min()))}–{fmt(float(steps.max()))} seen")
        loss = st.loss[np.isfinite(st.loss)]
        if len(loss):
            ids.add(f"loss first {fmt(float(loss[0]))}, last {fmt(float(loss[-1]))}")
        iters = st.iter_ms[np.isfinite(st.iter_ms)]
        if len(iters):
            ids.add(f"step time median {fmt(_median(iters))} ms, max {fmt(float(iters.max()))} ms")
    ids.add(f"{w.world} ranks on {len(w.job_nodes())} node(s): {', '.join(w.job_nodes()[:4])}")
    sync = w.proc.get(signals.CUDA_SYNC_MS)
    if sync is not None and sync.size and w.world > 1:
        per_rank = [(_median(sync[i]), r.rank) for i, r in enumerate(w.ranks)]
        per_rank = [p for p in per_rank if math.isfinite(p[0])]
        if per_rank:
            per_rank.sort()
            # the rank the others wait for waits least itself
            least, most = per_rank[0], per_rank[-1]
            ids.add(
                f"sync wait median: least rank {least[1]} ({fmt(least[0])} ms), "
                f"most rank {most[1]} ({fmt(most[0])} ms)"
            )
    for e in w.log_events[:2]:
        rank = "" if e.rank is None else f" rank {e.rank}"
        ids.add(f"log{rank}: {e.kind}")
    found = ids.found[start:][:MAX_LINES]
    result, concluded = _conclude(verdict, "job", bool(found))
    return ToolResult("job", found, concluded, result)


def node_tool(verdict: dict[str, Any], w: JobWindow | None, ids: _Ids) -> ToolResult:
    """GPU counters, throttling, XIDs and the hardware clearance."""
    start = len(ids.found)
    if w is not None:
        clocks = w.gpu.get(signals.DCGM_FI_DEV_SM_CLOCK)
        if clocks is not None and clocks.size:
            per = [(_median(clocks[i]), r.rank) for i, r in enumerate(w.ranks)]
            per = [p for p in per if math.isfinite(p[0])]
            if per:
                per.sort()
                ids.add(
                    f"SM clock median lowest rank {per[0][1]} {fmt(per[0][0])} MHz, "
                    f"highest rank {per[-1][1]} {fmt(per[-1][0])} MHz"
                )
        throttled = [e for e in w.events if e.name == signals.EVENT_THROTTLE]
        xids = [e for e in w.events if e.name == signals.EVENT_XID]
        if throttled:
            ids.add(
                f"{len(throttled)} throttle event(s) on {len({e.gpu for e in throttled})} GPU(s)"
            )
        if xids:
            codes = sorted({int(e.value) for e in xids if e.value is not None})
            ids.add(f"XID event(s): {', '.join(str(c) for c in codes[:5])} on {xids[0].node}")
        else:
            ids.add("no XID event on the job's nodes")
    moved = 0
    for e in verdict.get("evidence") or []:
        sig = str(e.get("signal"))
        observed = e.get("observed")
        if sig.startswith("DCGM_FI_DEV_") and isinstance(observed, int | float) and observed > 0:
            moved += 1
            # observed and baseline as the evidence has them: a counter's rise, a rate, a
            # clock's median ("DCGM_FI_DEV_SM_CLOCK rose by 1515" once said of a slowed clock)
            base = e.get("baseline")
            against = f", baseline {fmt(float(base))}" if isinstance(base, int | float) else ""
            ids.add(f"{sig} observed {fmt(float(observed))}{against} [{e['id']}]")
    if not moved and any(
        str(e.get("signal")).startswith("DCGM_FI_DEV_") for e in verdict.get("evidence") or []
    ):
        ids.add("every GPU error counter flat over the window")
    found = ids.found[start:][:MAX_LINES]
    result, concluded = _conclude(verdict, "hardware", bool(found))
    return ToolResult("node", found, concluded, result)


def _node_signal(w: JobWindow, prefix: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for node, series in w.node_series.items():
        for s in series:
            if s.info.name.startswith(prefix):
                out.setdefault(node, []).append(s)
    return out


def fabric_tool(verdict: dict[str, Any], w: JobWindow | None, ids: _Ids) -> ToolResult:
    """IB error counters and collective time."""
    start = len(ids.found)
    seen = False
    if w is not None:
        errors = (
            signals.IB_SYMBOL_ERROR,
            signals.IB_LINK_DOWNED,
            signals.IB_LINK_ERROR_RECOVERY,
            signals.IB_PORT_RCV_ERRORS,
        )
        for node, series in sorted(_node_signal(w, signals.IB_PREFIX).items()):
            seen = True
            rise = 0.0
            for s in series:
                if s.info.name in errors and len(s.values) > 1:
                    rise += max(0.0, float(s.values[-1] - s.values[0]))
            ids.add(f"IB error counters on {node} rose by {fmt(rise)}")
        nccl = w.proc.get(signals.NCCL_MS)
        if nccl is not None and nccl.size:
            seen = True
            per = [(_median(nccl[i]), r.rank) for i, r in enumerate(w.ranks)]
            per = sorted(p for p in per if math.isfinite(p[0]))
            if per:
                ids.add(
                    f"NCCL time median lowest rank {per[0][1]} {fmt(per[0][0])} ms, "
                    f"highest rank {per[-1][1]} {fmt(per[-1][0])} ms"
                )
    found = ids.found[start:][:MAX_LINES]
    result, concluded = _conclude(verdict, "fabric", seen)
    return ToolResult("fabric", found, concluded, result)


def storage_tool(verdict: dict[str, Any], w: JobWindow | None, ids: _Ids) -> ToolResult:
    """Mount write latency and throughput."""
    start = len(ids.found)
    if w is not None:
        by_mount: dict[str, dict[str, list[Any]]] = {}
        for series in _node_signal(w, signals.STORAGE_PREFIX).values():
            for s in series:
                m = s.info.label("mount")
                if m:
                    by_mount.setdefault(m, {}).setdefault(s.info.name, []).append(s)
        for mount, named in sorted(by_mount.items())[:3]:
            lat = [v for s in named.get(signals.STORAGE_WRITE_MS, []) for v in s.values]
            written = 0.0
            span = 0.0
            for s in named.get(signals.STORAGE_WRITE_BYTES, []):
                if len(s.values) > 1:
                    written += max(0.0, float(s.values[-1] - s.values[0]))
                    span = max(span, float(s.ts[-1] - s.ts[0]))
            parts = [f"mount {mount}:"]
            if lat:
                parts.append(
                    f"write latency median {fmt(_median(lat))} ms, max {fmt(float(np.nanmax(lat)))} ms"
                )
            if span > 0:
                parts.append(f"write throughput {fmt(written / span / 1e6)} MB/s")
            ids.add(" ".join(parts))
    found = ids.found[start:][:MAX_LINES]
    result, concluded = _conclude(verdict, "storage", bool(found))
    return ToolResult("storage", found, concluded, result)


def run_procedure(verdict: dict[str, Any], window: JobWindow | None) -> list[ToolResult]:
    """The four checks, in order, each over the verdict's job window."""
    ids = _Ids()
    return [
        job_tool(verdict, window, ids),
        node_tool(verdict, window, ids),
        fabric_tool(verdict, window, ids),
        storage_tool(verdict, window, ids),
    ]
