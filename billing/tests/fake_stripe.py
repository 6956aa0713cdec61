"""A local fake of the Stripe HTTP endpoints billing uses, on loopback, in a thread: the real
`stripe` library talks to it (its `api_base` pointed here) exactly as it talks to Stripe.

Endpoints: POST /v1/customers, POST /v1/subscriptions, POST /v1/billing/meter_events (one
event per `identifier`: a second is refused as Stripe refuses it), GET
/v1/billing/meters/{id}/event_summaries (per-day sums), POST /v1/billing_portal/sessions.

Faults for the retry storm: `cut_after` (the event is stored, then the connection is closed
before any answer: the client cannot know it landed), `cut_before` (closed before storing),
`fail_5xx` (a 500 answer) — each a count of requests to hit, taken in order.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


def _nest(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Stripe's form encoding (a[b]=1, items[0][price]=x) back into a dict."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        parts = key.replace("]", "").split("[")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


@dataclass
class FakeStripe:
    events: dict[str, dict[str, Any]] = field(default_factory=dict)  # identifier → event
    customers: dict[str, dict[str, Any]] = field(default_factory=dict)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    idempotency: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    duplicates_refused: int = 0
    cut_after: int = 0
    cut_before: int = 0
    fail_5xx: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def totals(self) -> dict[tuple[str, str], int]:
        """(customer, UTC day) → units accepted."""
        out: Counter[tuple[str, str]] = Counter()
        for e in self.events.values():
            day = datetime.fromtimestamp(int(e["timestamp"]), UTC).strftime("%Y-%m-%d")
            out[(e["payload"]["stripe_customer_id"], day)] += int(e["payload"]["value"])
        return dict(out)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", "req_fake")
        self.end_headers()
        self.wfile.write(data)

    def _cut(self) -> None:
        # Close without an answer: the client sees the connection reset mid-request.
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def _error(self, status: int, message: str, code: str = "") -> None:
        self._send(
            status,
            {"error": {"type": "invalid_request_error", "message": message, "code": code}},
        )

    def do_GET(self) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        with fake.lock:
            fake.calls[f"GET {parts[-1]}"] += 1
        if (
            len(parts) == 5
            and parts[:3] == ["v1", "billing", "meters"]
            and parts[4] == "event_summaries"
        ):
            start, end = int(query["start_time"]), int(query["end_time"])
            days: Counter[int] = Counter()
            with fake.lock:
                for e in fake.events.values():
                    ts = int(e["timestamp"])
                    if (
                        e["payload"]["stripe_customer_id"] == query["customer"]
                        and start <= ts < end
                    ):
                        days[ts - ts % 86400] += int(e["payload"]["value"])
            data = [
                {
                    "id": f"mtrsum_{d}",
                    "object": "billing.meter_event_summary",
                    "aggregated_value": float(v),
                    "start_time": d,
                    "end_time": d + 86400,
                    "livemode": False,
                    "meter": parts[3],
                }
                for d, v in sorted(days.items())
            ]
            self._send(200, {"object": "list", "data": data, "has_more": False, "url": url.path})
            return
        self._error(404, f"no such route {url.path}")

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = _nest(parse_qsl(self.rfile.read(length).decode()))
        path = urlsplit(self.path).path
        with fake.lock:
            fake.calls[f"POST {path}"] += 1
            if fake.cut_before:
                fake.cut_before -= 1
                self._cut()
                return
            if fake.fail_5xx:
                fake.fail_5xx -= 1
                self._error(500, "internal error (fake)")
                return
            cut = False
            if fake.cut_after:
                fake.cut_after -= 1
                cut = True
            status, answer = self._apply(fake, path, body)
        if cut:
            self._cut()
            return
        self._send(status, answer)

    def _apply(
        self, fake: FakeStripe, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        key = self.headers.get("Idempotency-Key")
        if key and key in fake.idempotency and path != "/v1/billing/meter_events":
            return 200, fake.idempotency[key]
        if path == "/v1/billing/meter_events":
            ident = body.get("identifier", "")
            if ident in fake.events:
                fake.duplicates_refused += 1
                return 400, {
                    "error": {
                        "type": "invalid_request_error",
                        "code": "resource_already_exists",
                        "message": f"An event with identifier {ident} already exists.",
                    }
                }
            event = {"object": "billing.meter_event", **body, "identifier": ident}
            event["timestamp"] = int(body["timestamp"])
            fake.events[ident] = event
            return 200, event
        if path == "/v1/customers":
            obj = {"id": f"cus_{len(fake.customers) + 1}", "object": "customer", **body}
            fake.customers[obj["id"]] = obj
        elif path == "/v1/subscriptions":
            obj = {
                "id": f"sub_{len(fake.subscriptions) + 1}",
                "object": "subscription",
                "status": "active",
                **body,
            }
            fake.subscriptions[obj["id"]] = obj
        elif path == "/v1/billing_portal/sessions":
            obj = {
                "id": "bps_1",
                "object": "billing_portal.session",
                "url": f"https://billing.example.test/session/{body.get('customer')}",
                **body,
            }
        else:
            return 404, {"error": {"type": "invalid_request_error", "message": f"no route {path}"}}
        if key:
            fake.idempotency[key] = obj
        return 200, obj


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeStripe


def serve() -> tuple[FakeStripe, str, _Server]:
    """Start a fake on an ephemeral loopback port: (its state, its base URL, the server)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = FakeStripe()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.fake, f"http://127.0.0.1:{server.server_address[1]}", server
