"""What a detector returns: a `Finding` with its `Evidence` (docs/design.md §7 evidence objects).

Evidence ids ("e1", "e2", …) are given as evidence is added, so a detector can cite them in
its summary and explanation ("… rank 5 was slowest in 92% of steps [e1]"); the verdict builder
appends the clearance evidence after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JOB = "job"
INFRASTRUCTURE = "infrastructure"


@dataclass
class Evidence:
    id: str
    signal: str
    interval: tuple[float, float]
    observed: float | str
    baseline: float | str | None
    note: str
    node: str | None = None
    gpu: str | None = None
    rank: int | None = None
    job: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "signal": self.signal,
            "node": self.node,
            "gpu": self.gpu,
            "rank": self.rank,
            "job": self.job,
            "interval": {"start": round(self.interval[0], 3), "end": round(self.interval[1], 3)},
            "observed": _num(self.observed),
            "baseline": _num(self.baseline),
            "note": self.note,
        }


def _num(x: float | str | None) -> float | str | None:
    if isinstance(x, float):
        return round(x, 6)
    return x


@dataclass
class Cleared:
    check: str  # hardware | fabric | storage | job
    result: str  # clear | implicated
    evidence: list[str]
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "result": self.result,
            "evidence": list(self.evidence),
            "note": self.note,
        }


@dataclass
class Finding:
    family: str
    category: str
    title: str
    summary: str
    recommendation: str
    explanation: str
    confidence: float
    interval: tuple[float, float]
    subject: dict[str, Any]
    evidence: list[Evidence] = field(default_factory=list)
    cleared: list[Cleared] = field(default_factory=list)
    slowdown_pct: float | None = None
    gpu_hours_lost: float | None = None
    # Detector-specific facts other code may use (e.g. the slow rank's cause).
    details: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        signal: str,
        interval: tuple[float, float],
        observed: float | str,
        baseline: float | str | None,
        note: str,
        *,
        node: str | None = None,
        gpu: str | None = None,
        rank: int | None = None,
        job: str | None = None,
    ) -> str:
        """Append an evidence entry; returns its id to cite in text."""
        eid = f"e{len(self.evidence) + 1}"
        self.evidence.append(
            Evidence(eid, signal, interval, observed, baseline, note, node, gpu, rank, job)
        )
        return eid

    def add_job(
        self, signal: str, observed: float | str, baseline: float | str | None, note: str
    ) -> str:
        """`add` for evidence about the finding's job over the finding's whole interval."""
        return self.add(signal, self.interval, observed, baseline, note, job=self.subject["job"])
