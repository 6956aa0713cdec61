"""Small helpers shared by the file- and HTTP-based collectors: record builders, a
log-once warning, and the default HTTP fetch function."""

from __future__ import annotations

import http.client
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

Record = dict[str, Any]
# fetch(url, timeout_s) -> response body text; raises OSError (or a subclass) on failure.
FetchFn = Callable[[str, float], str]


def open_http(
    url: str, timeout_s: float, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    """urlopen for http(s) URLs only: a URL from the config or a process's command line
    cannot make the agent read a local file (file:) or any other scheme urllib knows.
    Raises urllib.error.URLError (an OSError) for any other scheme."""
    if urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https"):
        raise urllib.error.URLError(f"not an http(s) URL: {url!r}")
    req = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - scheme checked above
    resp: http.client.HTTPResponse = urllib.request.urlopen(req, timeout=timeout_s)  # noqa: S310 - scheme checked above
    return resp


def http_get(url: str, timeout_s: float) -> str:
    """GET `url` and return the body as text. Raises OSError on any failure."""
    with open_http(url, timeout_s, headers={"Accept": "text/plain"}) as resp:
        charset = resp.headers.get_content_charset() or "utf-8"
        body: bytes = resp.read()
    return body.decode(charset, errors="replace")


class WarnOnce:
    """Logs a source failure once per key, and again only after it has recovered."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._failing: set[str] = set()

    def fail(self, key: str, message: str, *args: object) -> None:
        if key in self._failing:
            return
        self._failing.add(key)
        self._logger.warning(message, *args)

    def ok(self, key: str) -> None:
        self._failing.discard(key)

    def is_failing(self, key: str) -> bool:
        return key in self._failing


def sample(
    ts: float,
    name: str,
    value: float,
    labels: dict[str, str] | None = None,
    **identity: Any,
) -> Record | None:
    """A `sample` record, or None when the value is not finite (trace v1 forbids NaN/Inf)."""
    if not math.isfinite(value):
        return None
    rec: Record = {"type": "sample", "ts": ts, "name": name, "value": value}
    for key, val in identity.items():
        if val is not None:
            rec[key] = val
    if labels:
        rec["labels"] = labels
    return rec


def event(ts: float, name: str, **fields: Any) -> Record:
    rec: Record = {"type": "event", "ts": ts, "name": name}
    for key, val in fields.items():
        if val is not None:
            rec[key] = val
    return rec


def present(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` without the keys whose value is None (unknown identity is left off a record),
    in their order."""
    return {key: val for key, val in fields.items() if val is not None}


def as_number(value: float) -> float | int:
    """Integral floats become ints so cumulative counters stay exact in JSON."""
    if value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value
