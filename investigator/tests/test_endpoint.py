"""The OpenAI-compatible endpoint writer against a real HTTP server on loopback speaking the
chat-completions shape, and the refusal of an endpoint outside loopback/private ranges.

The server answers as a JSON-schema-constrained model would: with a JSON object in the
message content. It builds the answer from the request it received (a cited id from the schema's
enum; the family and category are the detector's, not asked for), so the test shows what the
writer sends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engine.tests.test_analyze import check_verdict
from investigator.model import EndpointRefused, OpenAICompatibleWriter, endpoint_allowed
from investigator.run import investigate
from investigator.tests.conftest import Case


class _ChatServer(ThreadingHTTPServer):
    answer_text: str = ""
    requests: list[dict[str, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: _ChatServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "body": body})
        schema = body["response_format"]["json_schema"]["schema"]["properties"]
        # The family and category are the detector's: the schema does not ask for them.
        assert "family" not in schema and "category" not in schema
        answer = {
            "explanation": self.server.answer_text,
            "cited": ["e1"],
            "ruled_out": [],
        }
        reply = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps(answer)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 700, "completion_tokens": 60, "total_tokens": 760},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def chat_server() -> Iterator[_ChatServer]:
    server = _ChatServer(("127.0.0.1", 0), _Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_endpoint_writer_explains_through_a_local_chat_completions_server(
    chat_server: _ChatServer, slow_rank: Case
) -> None:
    v = slow_rank.verdict
    chat_server.answer_text = (
        f"Rank {v['subject']['rank']} on {v['subject']['node']} was the slowest in every "
        f"block [e2] and computed longer than the median rank each step [e1]."
    )
    url = f"http://127.0.0.1:{chat_server.server_address[1]}"
    writer = OpenAICompatibleWriter(url, "llama-3-8b")
    inv = investigate(v, slow_rank.window, writer)
    assert inv.validated and not inv.fallback, inv.attempts[0].complaints
    assert inv.explanation.startswith(chat_server.answer_text)
    assert inv.tokens == {"prompt": 700, "completion": 60}
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
    chat_server: _ChatServer, slow_rank: Case
) -> None:
    chat_server.answer_text = "Rank 7 ran 93.1% slower because of a bad cable [e1]."
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
