"""A real HTTP server on loopback speaking the OpenAI chat-completions shape, answering as a
JSON-schema-constrained model would: `respond(request body) -> answer object` decides each
answer (it may read the schema the writer sent). What cannot run here is a bigger model behind
an endpoint; this stands in for it, over the real HTTP path the endpoint writer uses."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Respond = Callable[[dict[str, Any]], dict[str, Any]]


class ChatServer(ThreadingHTTPServer):
    respond: Respond
    requests: list[dict[str, Any]]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "body": body})
        answer = self.server.respond(body)
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
            "usage": {"prompt_tokens": 600, "completion_tokens": 40, "total_tokens": 640},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def chat_server(respond: Respond) -> Iterator[ChatServer]:
    server = ChatServer(("127.0.0.1", 0), _Handler)
    server.respond = respond
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def cited_ids(body: dict[str, Any]) -> list[str]:
    """The ids the writer's schema lets an answer cite."""
    schema = body["response_format"]["json_schema"]["schema"]["properties"]
    return list(schema["cited"]["items"]["enum"])


def question_of(body: dict[str, Any]) -> str:
    content = str(body["messages"][-1]["content"])
    line = next(x for x in content.splitlines() if x.startswith("QUESTION: "))
    return line.removeprefix("QUESTION: ")
