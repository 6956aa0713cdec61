"""Findings → verdicts, the normative JSON of docs/design.md §7 (contract/verdict_schema.json).

    verdicts = build_verdicts(run_detectors(window), window)
    fleet = build_verdicts(run_fleet_health(gpu_window), None)

A job verdict gets the hardware clearance over the job's GPUs and window appended (its
evidence continues the finding's numbering) and says what the detectors could not see.
"""

from __future__ import annotations

import hashlib
from typing import Any

from engine.clearance import hardware_clearance
from engine.findings import Finding
from engine.window import SOURCE_DESCRIPTIONS, JobWindow


def verdict_id(f: Finding) -> str:
    s = f.subject
    key = "|".join(str(x) for x in (f.family, s["job"], s["node"], s["gpu"], s["rank"], s["mount"]))
    return "v-" + hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:16]


def build_verdict(f: Finding, window: JobWindow | None) -> dict[str, Any]:
    cleared = list(f.cleared)
    explanation = f.explanation
    if window is not None and f.subject.get("job"):
        cleared.extend(hardware_clearance(window, f))
        if window.missing_sources:
            explanation += (
                " Could not see: "
                + "; ".join(SOURCE_DESCRIPTIONS.get(m, m) for m in sorted(window.missing_sources))
                + "."
            )
    return {
        "id": verdict_id(f),
        "family": f.family,
        "category": f.category,
        "title": f.title,
        "summary": f.summary,
        "recommendation": f.recommendation,
        "confidence": round(float(min(1.0, max(0.0, f.confidence))), 3),
        "subject": dict(f.subject),
        "interval": {"start": round(f.interval[0], 3), "end": round(f.interval[1], 3)},
        "impact": {
            "slowdown_pct": None if f.slowdown_pct is None else round(float(f.slowdown_pct), 1),
            "gpu_hours_lost": None
            if f.gpu_hours_lost is None
            else round(float(f.gpu_hours_lost), 3),
        },
        "evidence": [e.as_dict() for e in f.evidence],
        "cleared": [c.as_dict() for c in cleared],
        "explanation": explanation,
    }


def build_verdicts(findings: list[Finding], window: JobWindow | None) -> list[dict[str, Any]]:
    return [build_verdict(f, window) for f in findings]
