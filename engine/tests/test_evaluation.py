"""`proof eval` scoring: precision/recall per family, category/subject accuracy, delay, and
verdicts on healthy controls, on hand-made outcomes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.evaluation import (
    Outcome,
    format_table,
    format_time_to_verdict,
    right_subjects,
    run_one,
    score,
)
from engine.prefixes import first_verdict_at, names_subject, prefix_ends, subject_matches
from engine.store import TraceStore
from simulator import simulate


def _verdict(family: str, category: str, start: float, **subject: Any) -> dict[str, Any]:
    subj = {"job": None, "node": None, "gpu": None, "rank": None, "mount": None, **subject}
    return {
        "family": family,
        "category": category,
        "subject": subj,
        "evidence": [
            {"id": "e1", "interval": {"start": start, "end": start + 10}},
            {"id": "e2", "interval": {"start": 0.0, "end": 1.0}},  # clearance: not a detection
        ],
        "cleared": [{"check": "hardware", "result": "clear", "evidence": ["e2"], "note": ""}],
    }


def _truth(
    family: str | None, category: str | None = None, onset: float | None = None, **s: Any
) -> dict[str, Any]:
    subj = {"job": None, "node": None, "gpu": None, "rank": None, "mount": None, **s} if s else None
    return {"family": family, "category": category, "subject": subj, "onset": onset}


def test_score_counts_hits_misses_false_alarms_and_delay() -> None:
    outcomes = [
        Outcome(
            "slow_rank",
            0,
            _truth("slow_rank", "infrastructure", 100.0, job="J", rank=3),
            [_verdict("slow_rank", "infrastructure", 112.0, job="J", rank=3)],
            1.0,
        ),
        Outcome(
            "slow_rank",
            1,
            _truth("slow_rank", "infrastructure", 100.0, job="J", rank=3),
            [_verdict("slow_rank", "job", 100.0, job="J", rank=4)],
            1.0,
        ),
        Outcome(
            "slow_rank", 2, _truth("slow_rank", "infrastructure", 100.0, job="J", rank=3), [], 1.0
        ),
        Outcome(
            "healthy_training",
            0,
            _truth(None),
            [_verdict("sequence_imbalance", "job", 5.0, job="J")],
            1.0,
        ),
    ]
    fams, healthy_verdicts, healthy_runs = score(outcomes)
    s = fams["slow_rank"]
    assert (s.tp, s.fn, s.fp) == (2, 1, 0)
    assert s.category_ok == 1 and s.subject_ok == 1 and s.matched == 2
    assert sorted(s.delays) == [0.0, 12.0]  # the clearance evidence (t=0) is not the detection
    assert fams["sequence_imbalance"].fp == 1 and fams["sequence_imbalance"].precision == 0.0
    assert (healthy_verdicts, healthy_runs) == (1, 1)
    table = format_table(fams, healthy_verdicts, healthy_runs)
    assert "slow_rank" in table and "healthy controls: 1 verdict(s) on 1 run(s)" in table


def test_subject_match_ignores_fields_the_truth_leaves_open() -> None:
    truth = {"job": "J", "node": None, "gpu": None, "rank": None, "mount": "/shared"}
    assert subject_matches(
        truth, {"job": "J", "node": "n1", "gpu": None, "rank": 2, "mount": "/shared"}
    )
    assert not subject_matches(
        truth, {"job": "J", "node": None, "gpu": None, "rank": None, "mount": "/local"}
    )


def test_a_verdict_of_the_family_about_another_subject_is_not_the_verdict() -> None:
    truth = {"job": "J", "node": "n1", "gpu": "G5", "rank": 5, "mount": None}
    right = _verdict("slow_rank", "infrastructure", 0.0, job="J", node="n1", gpu="G5", rank=5)
    wrong = _verdict("slow_rank", "infrastructure", 0.0, job="J", node="n1", gpu="G2", rank=2)
    assert names_subject([right], "slow_rank", truth)
    assert not names_subject([wrong], "slow_rank", truth)
    assert names_subject([wrong, right], "slow_rank", truth)
    assert not names_subject([right], "sequence_imbalance", truth)
    assert names_subject([wrong], "slow_rank", None)  # no truth subject: the family decides


def test_the_rerun_a_divergence_truth_names_diverges_rightly_too() -> None:
    truth = {**_truth("numerical_divergence", "job", 0.0, job="J"), "detail": {"rerun": "R"}}
    rerun = _verdict("numerical_divergence", "job", 0.0, job="R")["subject"]
    other = _verdict("numerical_divergence", "job", 0.0, job="X")["subject"]
    right = right_subjects(truth)
    assert any(subject_matches(s, rerun) for s in right)
    assert not any(subject_matches(s, other) for s in right)
    assert right_subjects(_truth("slow_rank", "infrastructure", 0.0, rank=3)) == [
        _truth("slow_rank", "infrastructure", 0.0, rank=3)["subject"]
    ]


def test_time_to_verdict_waits_for_the_truths_subject(tmp_path: Path) -> None:
    # slow_rank seed 4 (2x4): a power-capped GPU, named within 10 s of the onset
    path = tmp_path / "slow_rank-4.jsonl"
    sim = simulate("slow_rank", seed=4, duration_s=600, nodes=2, gpus_per_node=4)
    sim.write(path)
    store = TraceStore.from_trace(path)
    truth = sim.meta["truth"]
    onset, subj = float(truth["onset"]), truth["subject"]
    at = first_verdict_at(store, "slow_rank", onset, 1, stop=onset + 30, subject=subj)
    assert at is not None and at == first_verdict_at(store, "slow_rank", onset, 1, onset + 30)
    other = {**subj, "rank": (subj["rank"] + 1) % 8, "gpu": None, "node": None}
    assert first_verdict_at(store, "slow_rank", onset, 1, stop=onset + 30, subject=other) is None


def test_time_to_verdict_is_measured_on_prefixes_from_the_onset(tmp_path: Path) -> None:
    # a hardware fault's verdict comes with its XID: on the first prefix, at the onset
    o = run_one("hardware_fault", 0, 300.0, 1, 4, str(tmp_path), prefix_step=5.0)
    assert o.prefixes_scanned and o.time_to_verdict is not None
    assert 0.0 <= o.time_to_verdict <= 5.0
    fams, _hv, _hr = score([o])
    assert fams["hardware_fault"].to_verdict == [o.time_to_verdict]
    table = format_time_to_verdict(fams, 5.0)
    assert "hardware_fault" in table and "p90" in table


def test_prefix_ends_cover_the_range_and_end_at_its_end() -> None:
    assert list(prefix_ends(10.0, 22.0, 5.0)) == [10.0, 15.0, 20.0, 22.0]
    assert list(prefix_ends(10.0, 20.0, 5.0)) == [10.0, 15.0, 20.0]
