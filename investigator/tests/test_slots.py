"""The explanation as slots (investigator/slots.py) on a real simulated slow_rank verdict: the
clauses offered each pass the validator alone, the text composed from any choice passes it
whole, and a choice of something not offered is rejected, retried once, then the template is
published. Over the endpoint writer (a real chat-completions server on loopback) the same slots
go as a JSON schema of enums."""

from __future__ import annotations

from typing import Any

import pytest

from engine.tests.test_analyze import check_verdict
from investigator import slots, validate
from investigator.model import OpenAICompatibleWriter
from investigator.run import MODE_SLOTS, compose, investigate
from investigator.tests.chat_server import chat_server
from investigator.tests.conftest import Case
from investigator.tools import ToolResult, run_procedure


@pytest.fixture(scope="module")
def checked(slow_rank: Case) -> tuple[dict[str, Any], validate.Facts, list[ToolResult]]:
    steps = run_procedure(slow_rank.verdict, slow_rank.window)
    facts = validate.collect_facts(
        slow_rank.verdict, steps, [r.rank for r in slow_rank.window.ranks]
    )
    return slow_rank.verdict, facts, steps


def _shown(steps: list[ToolResult], facts: validate.Facts) -> dict[str, list[str]]:
    return {s.check: sorted(validate.shown_by(s) & facts.ids) for s in steps if s.result == "clear"}


def test_only_the_findings_own_evidence_and_implicating_checks_are_offered(checked: Any) -> None:
    verdict, facts, steps = checked
    offered = slots.clauses(verdict, steps, facts)
    cleared = slots.clearance_ids(verdict)
    assert cleared and not cleared & set(offered)  # the clearance's ids are ruled_out's
    assert "e1" in offered and slots.lead_ids(offered)[0] == "e1"
    assert all(i.startswith("e") for i in slots.lead_ids(offered))
    node = next(s for s in steps if s.check == "node")
    assert node.result == "implicated"
    restating = {f.id for f in node.findings if "[" in f.text}
    assert restating and not restating & set(offered)  # the evidence item is offered instead
    for c in offered.values():
        assert c.text.endswith(f"[{c.id}]")
        assert validate.check_prose(c.text, verdict["family"], facts, "c") == []


def test_every_choice_composes_a_text_the_validator_passes(checked: Any) -> None:
    verdict, facts, steps = checked
    offered = slots.clauses(verdict, steps, facts)
    ids = list(offered)
    shown = _shown(steps, facts)
    ruled = {c: v[:1] for c, v in shown.items()}
    for lead in slots.lead_ids(offered):
        for also in (ids[:2], ids[-2:], [lead, ids[1]]):
            answer = slots.to_answer({"lead": lead, "also": also, "ruled_out": ruled}, offered)
            answer["ruled_out"] = [{"check": c, "evidence": v} for c, v in ruled.items()]
            answer |= {"family": verdict["family"], "category": verdict["category"]}
            assert validate.check(answer, verdict, facts, steps) == [], answer["explanation"]
            text = compose(answer, verdict, steps, cut=False)
            assert validate.check_text(text, facts) == []
            assert text.lower().startswith(offered[lead].text[:20].lower())
            assert answer["cited"][0] == lead and len(set(answer["cited"])) == len(answer["cited"])


def test_a_node_and_rank_are_said_once(checked: Any) -> None:
    verdict, facts, steps = checked
    offered = slots.clauses(verdict, steps, facts)
    where = [c for c in offered.values() if c.where]
    assert len(where) >= 2 and where[0].where == where[1].where
    answer = slots.to_answer({"lead": where[0].id, "also": [where[1].id]}, offered)
    assert answer["explanation"].count(where[0].where) == 1


def test_the_menu_asks_only_what_is_left_to_choose(checked: Any) -> None:
    verdict, facts, steps = checked
    offered = slots.clauses(verdict, steps, facts)
    shown = _shown(steps, facts)
    texts = {f.id: f.text for s in steps for f in s.findings}
    m = slots.menu(verdict, offered, slots.lead_ids(offered), shown, texts)
    assert m.kinds[:3] == ["lead", "also", "also"]
    assert shown
    for check, ids in shown.items():
        if len(ids) == 1:  # nothing to choose: filled in, no decode step for it
            assert m.forced[check] == ids and f"ruled_out:{check}" not in m.kinds
        else:
            slot = m.slots[m.kinds.index(f"ruled_out:{check}")]
            assert list(slot.options.values()) == ids[: slots.RULED_OPTIONS]
            assert check not in m.forced
    lead = m.slots[0]
    assert set(lead.options.values()) == set(slots.lead_ids(offered))
    content = m.messages[1]["content"]
    assert all(f"{letter}: " in content for letter in lead.options)
    raw = slots.from_choices(m, [lead.options["A"], "e2", None, *[None] * (len(m.slots) - 3)])
    assert raw["lead"] == lead.options["A"] and raw["also"] == ["e2"]
    assert {r["check"] for r in raw["ruled_out"]} == set(m.forced)  # the unpicked: none


def _slot_answer(body: dict[str, Any], pick: dict[str, Any]) -> dict[str, Any]:
    schema = body["response_format"]["json_schema"]["schema"]
    assert set(schema["required"]) >= {"lead", "ruled_out"}
    assert "explanation" not in schema["properties"]  # the model writes no prose here
    ruled = {
        check: spec["items"]["enum"][:1]
        for check, spec in schema["properties"]["ruled_out"]["properties"].items()
    }
    return {"ruled_out": ruled, **pick}


def test_slots_through_the_endpoint_writer_are_validated(slow_rank: Case) -> None:
    with chat_server(lambda body: _slot_answer(body, {"lead": "e2", "also": ["e1"]})) as server:
        inv = investigate(
            slow_rank.verdict, slow_rank.window, OpenAICompatibleWriter(server.url), mode="slots"
        )
    assert inv.mode == MODE_SLOTS
    assert inv.validated and not inv.fallback and inv.first_try_valid, inv.attempts
    assert inv.explanation.startswith("Share of 10-sample blocks")
    assert inv.cited == ["e2", "e1"] and "Ruled out: " in inv.explanation
    check_verdict(inv.apply(slow_rank.verdict))


def test_a_pick_of_something_not_offered_is_retried_then_the_template_published(
    slow_rank: Case,
) -> None:
    with chat_server(lambda body: _slot_answer(body, {"lead": "e99", "also": []})) as server:
        inv = investigate(
            slow_rank.verdict, slow_rank.window, OpenAICompatibleWriter(server.url), mode="slots"
        )
        second = server.requests[-1]["body"]["messages"][-1]["content"]
    assert len(inv.attempts) == 2 and inv.fallback and not inv.validated
    assert "cites e99, which does not exist" in inv.attempts[0].complaints
    assert "A previous answer was rejected: " in second and "e99" in second
    assert inv.explanation == slow_rank.verdict["explanation"]
