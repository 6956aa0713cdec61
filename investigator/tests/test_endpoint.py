"""The OpenAI-compatible endpoint writer against a real HTTP server on loopback speaking the
chat-completions shape, and the refusal of an endpoint outside loopback/private ranges.

The server answers as a JSON-schema-constrained model would: with a JSON object in the
message content. It builds the answer from the request it received (a cited id from the schema's
enum; the family and category are the detector's, not asked for), so the test shows what the
writer sends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.tests.test_analyze import check_verdict
from investigator.model import EndpointRefused, OpenAICompatibleWriter, endpoint_allowed
from investigator.run import investigate
from investigator.tests.chat_server import ChatServer, chat_server
from investigator.tests.conftest import Case


class _Answer:
    """What the server answers: `text` with one cited id, as a constrained model would."""

    text = ""

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        schema = body["response_format"]["json_schema"]["schema"]["properties"]
        # The family and category are the detector's: the schema does not ask for them.
        assert "family" not in schema and "category" not in schema
        return {"explanation": self.text, "cited": ["e1"], "ruled_out": []}


@pytest.fixture
def answer() -> _Answer:
    return _Answer()


@pytest.fixture(name="chat_server")
def chat_server_fixture(answer: _Answer) -> Iterator[ChatServer]:
    with chat_server(answer) as server:
        yield server


def test_endpoint_writer_explains_through_a_local_chat_completions_server(
    chat_server: ChatServer, answer: _Answer, slow_rank: Case
) -> None:
    v = slow_rank.verdict
    answer.text = (
        f"Rank {v['subject']['rank']} on {v['subject']['node']} was the slowest in every "
        f"block [e2] and computed longer than the median rank each step [e1]."
    )
    url = f"http://127.0.0.1:{chat_server.server_address[1]}"
    writer = OpenAICompatibleWriter(url, "llama-3-8b")
    inv = investigate(v, slow_rank.window, writer)
    assert inv.validated and not inv.fallback, inv.attempts[0].complaints
    assert inv.explanation.startswith(answer.text)
    assert inv.tokens == {"prompt": 600, "completion": 40}  # the server's usage
    (request,) = chat_server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "llama-3-8b"
    assert [m["role"] for m in request["body"]["messages"]] == ["system", "user"]
    assert "PROCEDURE:" in request["body"]["messages"][1]["content"]
    # the verdict it publishes is the contract's, its investigation object typed there
    published = inv.apply(v)
    check_verdict(published)
    for broken in (
        {"validated": "yes"},
        {"steps": [{"check": "disk", "returned": "", "concluded": ""}]},
        {"cited": ["x1"]},
        {"tokens": {"prompt": 700}},
    ):
        with pytest.raises(AssertionError):
            check_verdict({**published, "investigation": {**published["investigation"], **broken}})


def test_an_unbacked_answer_is_retried_once_then_the_template_is_published(
    chat_server: ChatServer, answer: _Answer, slow_rank: Case
) -> None:
    answer.text = "Rank 7 ran 93.1% slower because of a bad cable [e1]."
    url = f"http://127.0.0.1:{chat_server.server_address[1]}/v1"
    inv = investigate(slow_rank.verdict, slow_rank.window, OpenAICompatibleWriter(url))
    assert len(chat_server.requests) == 2  # the first try and one retry
    retry = chat_server.requests[1]["body"]["messages"][-1]["content"]
    assert "A previous answer was rejected: " in retry
    assert "states the number 93.1, which no evidence backs" in retry
    assert inv.fallback and not inv.validated
    assert inv.explanation == slow_rank.verdict["explanation"]
    first = inv.as_dict()["complaints"][0]
    assert "states the number 93.1, which no evidence backs" in first
    assert any(c.startswith("states a cause of its own ('because')") for c in first)
    check_verdict(inv.apply(slow_rank.verdict))


@pytest.mark.parametrize("url", ["http://8.8.8.8:8080", "https://1.1.1.1/v1"])
def test_a_public_endpoint_is_refused_unless_allowed(url: str) -> None:
    with pytest.raises(EndpointRefused, match="outside loopback/private ranges"):
        OpenAICompatibleWriter(url)
    assert OpenAICompatibleWriter(url, allow_remote=True).url.endswith("/chat/completions")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://10.1.2.3:8000", "http://[::1]:1"])
def test_loopback_and_private_endpoints_are_allowed(url: str) -> None:
    assert endpoint_allowed(url) == (True, "loopback/private")


def test_a_url_without_host_is_refused() -> None:
    with pytest.raises(EndpointRefused, match="not an http"):
        OpenAICompatibleWriter("file:///etc/passwd")
