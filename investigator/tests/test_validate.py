"""The validator on a real verdict (slow_rank, simulated): a text built from the evidence passes;
a made-up number, GPU, rank, node, time or citation, another family, or ruling out a check the
procedure implicated is each rejected, with a complaint naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from investigator import validate
from investigator.run import compose
from investigator.tests.conftest import Case
from investigator.tools import ToolResult, run_procedure


@pytest.fixture(scope="module")
def checked(slow_rank: Case) -> tuple[dict[str, Any], validate.Facts, list[ToolResult]]:
    steps = run_procedure(slow_rank.verdict, slow_rank.window)
    facts = validate.collect_facts(
        slow_rank.verdict, steps, [r.rank for r in slow_rank.window.ranks]
    )
    return slow_rank.verdict, facts, steps


def _answer(verdict: dict[str, Any], text: str, **over: Any) -> dict[str, Any]:
    return {
        "family": verdict["family"],
        "category": verdict["category"],
        "explanation": text,
        "cited": ["e1", "e2"],
        "ruled_out": [],
        **over,
    }


def _good_text(verdict: dict[str, Any]) -> str:
    s = verdict["subject"]
    slow = verdict["impact"]["slowdown_pct"]
    lost = verdict["impact"]["gpu_hours_lost"]
    return (
        f"Rank {s['rank']} on {s['node']} (GPU {s['gpu']}) was the slowest rank in every block "
        f"[e2], so the job ran {slow}% slower [e5] and lost {lost} GPU-hours [e6]."
    )


def test_a_text_built_from_the_evidence_passes(checked: Any) -> None:
    verdict, facts, steps = checked
    assert validate.check(_answer(verdict, _good_text(verdict)), verdict, facts, steps) == []
    # the detector's own summary is backed by construction
    assert validate.check(_answer(verdict, verdict["summary"]), verdict, facts, steps) == []


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda t, v: t.replace(str(v["impact"]["slowdown_pct"]), "31.2"), "number 31.2"),
        (
            lambda t, v: t.replace(v["subject"]["gpu"], "GPU-00000000-1111-2222-3333-444444444444"),
            "GPU GPU-00000000-1111-2222-3333-444444444444",
        ),
        (lambda t, v: t.replace(f"Rank {v['subject']['rank']}", "Rank 9"), "rank 9"),
        (lambda t, v: t.replace(v["subject"]["node"], "gpu999"), "gpu999"),
        (lambda t, v: t.replace("[e6]", "[e99]"), "e99"),
        (lambda t, v: t + " It started at 03:17:45 UTC [e1].", "time 03:17:45"),
        (lambda t, v: t + " The data sampler's sequence imbalance did it.", "another family"),
        # measured from the default model, validated before the vocabulary rule
        (
            lambda t, v: t + " The machine was not upgraded to the latest GPU driver.",
            "uses words no evidence uses ('machine', 'upgraded', 'latest', 'driver')",
        ),
    ],
    ids=["number", "gpu", "rank", "node", "citation", "time", "family-in-text", "words"],
)
def test_a_claim_the_evidence_does_not_back_is_rejected(
    checked: Any, change: Any, complaint: str
) -> None:
    verdict, facts, steps = checked
    text = change(_good_text(verdict), verdict)
    complaints = validate.check(_answer(verdict, text), verdict, facts, steps)
    assert any(complaint in c for c in complaints), complaints


def test_the_family_and_category_must_be_the_detectors(checked: Any) -> None:
    verdict, facts, steps = checked
    wrong = _answer(verdict, _good_text(verdict), family="sequence_imbalance", category="job")
    complaints = validate.check(wrong, verdict, facts, steps)
    assert "family must be slow_rank, not sequence_imbalance" in complaints
    assert "category must be infrastructure, not job" in complaints


def test_ruling_out_what_the_procedure_implicated_is_rejected(checked: Any) -> None:
    verdict, facts, steps = checked
    by_check = {s.check: s for s in steps}
    # slow_rank on a GPU with PCIe replays: the node check implicates it, fabric is clear
    assert by_check["node"].result == "implicated"
    assert by_check["fabric"].result == "clear"
    fabric_ids = [c["evidence"][0] for c in verdict["cleared"] if c["check"] == "fabric"]
    ok = {"check": "fabric", "evidence": fabric_ids}
    bad = {"check": "node", "evidence": ["e7"]}
    elsewhere = {"check": "fabric", "evidence": ["e1"]}
    text = _good_text(verdict)
    assert validate.check(_answer(verdict, text, ruled_out=[ok]), verdict, facts, steps) == []
    complaints = validate.check(_answer(verdict, text, ruled_out=[bad]), verdict, facts, steps)
    assert "rules out node, but the node check implicates it" in complaints
    complaints = validate.check(
        _answer(verdict, text, ruled_out=[elsewhere]), verdict, facts, steps
    )
    assert complaints == ["ruled_out fabric cites e1, which is not fabric evidence"]
    # the published text (explanation + ruled out + could-not-see) stays backed
    composed = compose(_answer(verdict, text, ruled_out=[ok]), verdict, steps)
    assert "Ruled out: fabric: no InfiniBand errors" in composed
    assert validate.check_text(composed, facts) == []


def test_a_looping_answer_is_rejected(checked: Any) -> None:
    verdict, facts, steps = checked
    loop = "rank 7 was slow, job type: job, job type: job, job type: job [e1]."
    complaints = validate.check(_answer(verdict, loop), verdict, facts, steps)
    assert "the explanation repeats 'job type job'" in complaints


def test_an_explanation_cut_inside_a_citation_is_published_up_to_its_last_clause(
    checked: Any,
) -> None:
    verdict, facts, steps = checked
    cut = _good_text(verdict).replace(" and lost", "; and lost").split("[e6]")[0][:-12] + " [e"
    composed = compose(_answer(verdict, cut), verdict, steps)
    assert composed.startswith(_good_text(verdict).split(";")[0].split(" and lost")[0])
    assert "[e." not in composed and validate.check_text(composed, facts) == []


def test_a_cause_of_the_models_own_is_rejected(checked: Any) -> None:
    verdict, facts, steps = checked
    text = _good_text(verdict) + " This is caused by GPUs that are not properly cooled."
    complaints = validate.check(_answer(verdict, text), verdict, facts, steps)
    assert any(c.startswith("states a cause of its own ('caused by')") for c in complaints)
