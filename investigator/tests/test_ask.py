"""Questions about an incident: answered from the same checks, held to the same validator, and
refused — plainly — when the evidence cannot answer them. The model is a real chat-completions
server on loopback (investigator/tests/chat_server.py); the default local model's run is in
investigations/tests/test_ask_api.py (slow)."""

from __future__ import annotations

from typing import Any

import pytest

from investigator import validate
from investigator.ask import (
    MAX_QUESTION_CHARS,
    ask,
    check_answer,
    out_of_scope,
    question_error,
    scope_words,
)
from investigator.model import OpenAICompatibleWriter
from investigator.tests.chat_server import chat_server, cited_ids, question_of
from investigator.tests.conftest import Case
from investigator.tools import CHECKS, run_procedure


def _grounded(case: Case) -> str:
    s = case.verdict["subject"]
    return f"Rank {s['rank']} on {s['node']} was the slowest rank in every block [e2]."


@pytest.mark.parametrize(
    ("question", "named"),
    [
        ("What is the customer's credit card number?", "'credit'"),
        ("Will it rain tomorrow?", "'rain'"),
    ],
)
def test_a_question_the_evidence_cannot_answer_is_refused_before_any_model_runs(
    slow_rank: Case, question: str, named: str
) -> None:
    with chat_server(lambda body: pytest.fail("the model was asked")) as server:
        got = ask(question, slow_rank.verdict, slow_rank.window, OpenAICompatibleWriter(server.url))
        assert server.requests == []
    assert got.refused and not got.validated
    assert got.text.startswith("The evidence does not say anything about ")
    assert named in got.text
    assert got.reason == "out of scope" and got.cited == [] and got.attempts == []


def test_questions_about_the_incident_are_in_scope(slow_rank: Case) -> None:
    scope = scope_words(slow_rank.verdict, run_procedure(slow_rank.verdict, slow_rank.window))
    for question in (
        "Which rank is slow, and since when?",
        "Why is the job slower?",
        "Was the storage checked?",
        "How many GPU-hours were lost?",
        f"Is node {slow_rank.verdict['subject']['node']} the problem?",
    ):
        assert out_of_scope(question, scope) == [], question
    assert out_of_scope("What is the GPU's credit card PIN?", scope) == ["credit", "card", "pin"]


def test_an_answer_is_validated_cited_and_published(slow_rank: Case) -> None:
    def respond(body: dict[str, Any]) -> dict[str, Any]:
        assert question_of(body) == "Which rank is slow?"
        assert "e2" in cited_ids(body) and "t1" in cited_ids(body)
        return {"answerable": True, "answer": _grounded(slow_rank), "cited": ["e2"]}

    with chat_server(respond) as server:
        got = ask(
            "Which rank is slow?",
            slow_rank.verdict,
            slow_rank.window,
            OpenAICompatibleWriter(server.url),
        )
        (request,) = server.requests
    assert got.validated and not got.refused, got.attempts[0].complaints
    assert got.text == _grounded(slow_rank)
    assert got.cited == ["e2"]
    # the same procedure as the explanation: its four checks are in the prompt and the record
    assert "PROCEDURE:" in request["body"]["messages"][1]["content"]
    assert [s["check"] for s in got.as_dict()["steps"]] == list(CHECKS)
    assert got.as_dict()["tokens"] == {"prompt": 600, "completion": 40}


def test_an_unbacked_answer_is_retried_once_then_refused_naming_why(slow_rank: Case) -> None:
    answer = "Rank 7 ran 93.1% slower because of a bad cable [e1]."
    with chat_server(lambda body: {"answerable": True, "answer": answer, "cited": ["e1"]}) as s:
        got = ask(
            "Why is rank 7 slow?",
            slow_rank.verdict,
            slow_rank.window,
            OpenAICompatibleWriter(s.url),
        )
        assert len(s.requests) == 2  # the first try and one retry
        retry = s.requests[1]["body"]["messages"][-1]["content"]
    assert "A previous answer was rejected: " in retry
    assert "states the number 93.1, which no evidence backs" in retry
    assert got.refused and not got.validated and got.cited == []
    assert "93.1%" not in got.text  # the unbacked claim is never published
    assert got.text.startswith("The evidence does not back an answer: ")
    assert "failed the evidence check 2 times" in got.text
    assert "states the number 93.1, which no evidence backs" in got.reason
    assert len(got.as_dict()["complaints"]) == 2


def test_the_model_saying_the_facts_do_not_answer_is_a_plain_refusal(slow_rank: Case) -> None:
    reply = {"answerable": False, "answer": "The job belongs to team 42 [e1].", "cited": ["e1"]}
    with chat_server(lambda body: reply) as server:
        got = ask(
            "Which team owns the job's GPU?",
            slow_rank.verdict,
            slow_rank.window,
            OpenAICompatibleWriter(server.url),
        )
    assert got.refused and got.text.startswith("The evidence does not say")
    assert "42" not in got.text  # the model's text is not published when it declines


def test_no_model_refuses_saying_so(slow_rank: Case) -> None:
    got = ask("Which rank is slow?", slow_rank.verdict, slow_rank.window, None)
    assert got.refused and "no model is available" in got.text


def test_an_answer_citing_nothing_or_another_family_is_rejected(slow_rank: Case) -> None:
    steps = run_procedure(slow_rank.verdict, slow_rank.window)
    facts = validate.collect_facts(
        slow_rank.verdict, steps, [r.rank for r in slow_rank.window.ranks]
    )
    assert (
        check_answer({"answer": _grounded(slow_rank), "cited": ["e2"]}, slow_rank.verdict, facts)
        == []
    )
    bare = {"answer": "The rank was slower than the others.", "cited": []}
    assert "the answer cites no evidence id" in check_answer(bare, slow_rank.verdict, facts)
    other = {"answer": "It looks like a checkpoint stall on the job [e1].", "cited": ["e1"]}
    assert any("another family" in c for c in check_answer(other, slow_rank.verdict, facts))
    ghost = {"answer": "Rank 0 was slower [e99].", "cited": ["e99"]}
    assert "cites e99, which does not exist" in check_answer(ghost, slow_rank.verdict, facts)


def test_a_question_is_bounded() -> None:
    assert question_error("   ") == "may not be blank"
    assert question_error("x" * MAX_QUESTION_CHARS) is None
    assert question_error("x" * (MAX_QUESTION_CHARS + 1)) == (
        f"at most {MAX_QUESTION_CHARS} characters, got {MAX_QUESTION_CHARS + 1}"
    )
