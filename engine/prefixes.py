"""Verdicts on growing prefixes of a trace: what a live evaluation at each moment would say.

`families_on_prefixes` gives the verdict families at each prefix end; `first_verdict_at` the
first prefix end at which a family's verdict appears — naming the truth's subject when one is
given (`proof eval --time-to-verdict`, and the tests that check a verdict is never given early
on a short prefix).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from engine.analyze import analyze
from engine.store import TraceStore


def prefix_ends(start: float, stop: float, step: float) -> Iterator[float]:
    """start, start + step, … up to and including the last one ≤ stop, then stop itself."""
    if step <= 0:
        raise ValueError("step must be > 0")
    k = 0
    while start + k * step < stop:
        yield start + k * step
        k += 1
    yield stop


def subject_matches(truth: dict[str, Any] | None, got: dict[str, Any]) -> bool:
    """Every field the truth names (non-null) is the verdict's."""
    if not truth:
        return True
    return all(got.get(k) == v for k, v in truth.items() if v is not None)


def verdicts_at(store: TraceStore, t1: float) -> list[dict[str, Any]]:
    return analyze(store, t1=t1).verdicts


def families_at(store: TraceStore, t1: float) -> set[str]:
    return {v["family"] for v in verdicts_at(store, t1)}


def families_on_prefixes(store: TraceStore, ends: Iterable[float]) -> list[set[str]]:
    return [families_at(store, t1) for t1 in ends]


def names_subject(
    verdicts: list[dict[str, Any]], family: str, subject: dict[str, Any] | None
) -> bool:
    """Some verdict of `family` names `subject` (any subject when None). A verdict of the
    right family about another GPU or rank is not the verdict: live, it would send someone to
    drain the wrong GPU."""
    return any(
        v["family"] == family and subject_matches(subject, v.get("subject") or {}) for v in verdicts
    )


def first_verdict_at(
    store: TraceStore,
    family: str,
    start: float,
    step: float,
    stop: float | None = None,
    subject: dict[str, Any] | None = None,
) -> float | None:
    """The first prefix end (start + k·step, then the trace's end) whose verdicts include
    `family` (naming `subject`, when given); None if no prefix up to `stop` (default: the
    trace's end) gives it."""
    hi = store.time_range()[1] if stop is None else stop
    for t1 in prefix_ends(start, hi, step):
        if names_subject(verdicts_at(store, t1), family, subject):
            return t1
    return None
