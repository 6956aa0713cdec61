"""Real local HTTP receivers (http.server in a thread) that record what they were sent, and a
Standard Webhooks verifier written from the spec (not from notify's signing code)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers each request with the next of `statuses` (the last one repeats), after
    `delay_s` (a hanging receiver: longer than the sender's timeout)."""

    statuses: list[int] = field(default_factory=lambda: [200])
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # sent with every answer
    received: list[Received] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self) -> int:
        with self.lock:
            index = min(len(self.received), len(self.statuses)) - 1
            return self.statuses[max(index, 0)]

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        raise AssertionError(f"{self.url} got {len(self.received)} requests, wanted {count}")


@contextmanager
def running(receiver: Receiver) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with receiver.lock:
                receiver.received.append(
                    Received(
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        time.monotonic(),
                    )
                )
            status = receiver.answer()
            if receiver.delay_s:
                time.sleep(receiver.delay_s)
            try:
                self.send_response(status)
                self.send_header("Content-Length", "2")
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(b"ok")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the sender timed out and left

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


# --- Standard Webhooks verification, from the spec (standardwebhooks.com) ----------------------

TOLERANCE_S = 5 * 60


class InvalidSignature(Exception):
    pass


def verify(secret: str, request: Received, now: float | None = None) -> dict[str, Any]:
    """What a receiver does: the secret's base64 part decoded is the HMAC-SHA256 key; the
    signed content is `{webhook-id}.{webhook-timestamp}.{body}`; any one of the
    space-separated `v1,<base64>` signatures matching (in constant time) is enough; a
    timestamp more than 5 min off is refused (replays). Returns the body's JSON."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    msg_id = headers["webhook-id"]
    timestamp = headers["webhook-timestamp"]
    if abs((now or time.time()) - int(timestamp)) > TOLERANCE_S:
        raise InvalidSignature("timestamp outside the tolerance")
    key = base64.b64decode(secret.split("_", 1)[1])
    content = msg_id.encode() + b"." + timestamp.encode() + b"." + request.body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    for versioned in headers["webhook-signature"].split(" "):
        version, _, sig = versioned.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            body: dict[str, Any] = json.loads(request.body)
            return body
    raise InvalidSignature("no signature matches")


# --- a real (minimal) SMTP server, for e-mail through Django's SMTP backend --------------------


@dataclass
class SmtpMessage:
    sender: str
    recipients: list[str]
    data: bytes


@contextmanager
def smtp_server() -> Iterator[tuple[int, list[SmtpMessage]]]:
    """Speaks enough SMTP (RFC 5321: EHLO, MAIL, RCPT, DATA, RSET, NOOP, QUIT) for smtplib;
    yields its port and the messages it accepted."""
    import socketserver

    messages: list[SmtpMessage] = []

    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")
            self.wfile.flush()

        def handle(self) -> None:
            self.reply("220 localhost test SMTP")
            sender, recipients = "", list[str]()
            while raw := self.rfile.readline():
                command = raw.decode().strip()
                verb = command[:4].upper()
                if verb in ("EHLO", "HELO"):
                    self.reply("250 localhost")
                elif verb == "MAIL":
                    sender, recipients = command.split(":", 1)[1].strip(" <>"), []
                    self.reply("250 OK")
                elif verb == "RCPT":
                    recipients.append(command.split(":", 1)[1].strip(" <>"))
                    self.reply("250 OK")
                elif verb == "DATA":
                    self.reply("354 end with <CRLF>.<CRLF>")
                    lines = []
                    while (line := self.rfile.readline()) not in (b".\r\n", b""):
                        lines.append(line[1:] if line.startswith(b"..") else line)
                    messages.append(SmtpMessage(sender, recipients, b"".join(lines)))
                    self.reply("250 OK queued")
                elif verb == "QUIT":
                    self.reply("221 bye")
                    return
                else:  # RSET, NOOP
                    self.reply("250 OK")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], messages
    finally:
        server.shutdown()
        server.server_close()
