"""Hostile input against every operation of /api/v1/ (its own published schema), on the real
server (pytest-django's live server on loopback), as an operator admin on real ids of a seeded
world (the schemathesis test's): one test per class of bad input, each answered 4xx in the one
error shape with a message naming what was wrong, never a 5xx (tenants/api/limits.py).

The classes (issue 16's reproductions): non-object JSON bodies, JSON nested 50,000 deep,
integers beyond their column's range (bodies and query parameters, `page_size`, cursors), NUL
in query filters, path ids and bodies, lone surrogates in strings, a body over the size limit.
The same requests by another operator's admin and by a customer of this operator are refused
too (never 2xx on a write, never 5xx).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tenants.api.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH
from tenants.testing import make_tenant
from tests.api.test_schemathesis import (
    World,
    _operations,
    _real_ids,
    _request_example,
    _required_query,
    _seed,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WRITES = ("POST", "PUT", "PATCH")
BIG_INTEGERS = (2**31, 2**63, -(2**63) - 1, 10**40)
NUL = "a\x00b"
SURROGATE = "a\ud800b"


@dataclass
class Operation:
    path: str
    method: str
    spec: dict[str, Any]
    ids: dict[str, Any]

    @property
    def url_path(self) -> str:
        return self.path.format(**self.ids)


@dataclass
class Run:
    world: World
    document: dict[str, Any]
    operations: list[Operation]
    cases: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)

    def send(
        self,
        operation: Operation,
        *,
        principal: str = "operator",
        body: str | bytes | None = None,
        query: dict[str, Any] | str | None = None,
        path: str | None = None,
    ) -> requests.Response:
        params = query if query is not None else _required_query(operation.spec)
        headers = self.world.headers(principal)
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.cases += 1
        return requests.request(
            operation.method,
            self.world.base_url + (path or operation.url_path),
            headers=headers,
            params=params,
            data=body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
            timeout=60,
        )

    def check(
        self,
        label: str,
        response: requests.Response,
        *,
        refused: bool = True,
        words: tuple[str, ...] = (),
    ) -> None:
        """No 5xx; `refused`: a 4xx; any 4xx in the error shape, and a 400 naming one of
        `words` (in its message or its fields)."""
        status = response.status_code
        if status >= 500:
            self.failures.append(f"{label}: {status} {response.text[:200]!r}")
            return
        if refused and not 400 <= status < 500:
            self.failures.append(f"{label}: {status}, not refused")
            return
        if status < 400:
            return
        self.refused += 1
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            self.failures.append(f"{label}: {status} not in the error shape: {response.text[:200]}")
            return
        if error.get("status") != status or not error.get("message") or not error.get("code"):
            self.failures.append(f"{label}: incomplete error {error}")
            return
        told = json.dumps(error).lower()
        if status == 400 and words and not any(word.lower() in told for word in words):
            self.failures.append(f"{label}: 400 names none of {words}: {error}")

    def done(self, name: str, started: float) -> None:
        print(
            f"\nhostile {name}: {len(self.operations)} operations, {self.cases} requests, "
            f"{self.refused} refused 4xx, {time.monotonic() - started:.1f} s, "
            f"{len(self.failures)} failures"
        )
        assert self.cases > 0
        assert not self.failures, "\n".join(self.failures)

    def writes(self) -> Iterator[Operation]:
        for operation in self.operations:
            if operation.method in WRITES:
                self.world.mint()
                yield operation


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    found = set(kind) if isinstance(kind, list) else {kind}
    for option in schema.get("oneOf", []) + schema.get("anyOf", []) + schema.get("allOf", []):
        found |= _types(option)
    return {k for k in found if k}


def _body_properties(document: dict[str, Any], spec: dict[str, Any]) -> dict[str, set[str]]:
    """The request body's writable top-level properties and their JSON types."""
    content = spec.get("requestBody", {}).get("content", {})
    media = content.get("application/json")
    if media is None:
        return {}
    schema = _resolve(document, media.get("schema", {}))
    return {
        name: _types(_resolve(document, prop))
        for name, prop in schema.get("properties", {}).items()
        if not _resolve(document, prop).get("readOnly")
    }


def _example(world: World, spec: dict[str, Any]) -> dict[str, Any]:
    """The operation's request example, its customer one of the world's (so a bad field is
    what the answer is about, not the example's made-up customer id)."""
    example = _request_example(spec)
    body = dict(example) if isinstance(example, dict) else {}
    if isinstance(body.get("customer"), int):
        body["customer"] = world.a.customer.pk
    return body


def _query_parameters(spec: dict[str, Any]) -> dict[str, set[str]]:
    return {
        parameter["name"]: _types(parameter.get("schema", {}))
        for parameter in spec.get("parameters", [])
        if parameter.get("in") == "query"
    }


@pytest.fixture
def run(live_server: Any) -> Run:
    a, b = make_tenant("hia"), make_tenant("hib")
    _seed(a, "hia")
    _seed(b, "hib")
    world = World(a=a, b=b, base_url=live_server.url)
    world.mint()
    document = requests.get(f"{live_server.url}/api/v1/schema/?format=json", timeout=30).json()
    operations: list[Operation] = []
    for path, method, spec in _operations(document):
        ids = _real_ids(world, path) if "{" in path else {}
        assert ids is not None, f"no real id for {path}"
        operations.append(Operation(path, method, spec, ids))
    # Reads first; deletes last (a delete of the real row would turn later cases into 404s).
    operations.sort(key=lambda op: (op.method == "DELETE", op.method != "GET", op.path))
    return Run(world=world, document=document, operations=operations)


def test_non_object_json_bodies(run: Run) -> None:
    started = time.monotonic()
    for operation in run.writes():
        for body in ("[]", '[{"name": "x"}]', '"text"', "42", "null", "true"):
            label = f"{operation.method} {operation.path} body {body}"
            response = run.send(operation, body=body)
            run.check(label, response, words=("JSON object",))
        response = run.send(operation, body="{not json")
        run.check(f"{operation.method} {operation.path} malformed", response, words=("JSON",))
    run.done("non-object bodies", started)


def test_json_nested_50000_deep(run: Run) -> None:
    started = time.monotonic()
    depth = 50_000
    bodies = {
        "list": "[" * depth + "]" * depth,
        "object": '{"a":' * depth + "1" + "}" * depth,
        # Under the parser's recursion limit, over the API's own.
        "just too deep": '{"a":' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1),
    }
    for operation in run.writes():
        for name, body in bodies.items():
            response = run.send(operation, body=body)
            words = ("nested",) if name != "list" else ("nested", "JSON object")
            run.check(f"{operation.method} {operation.path} {name}", response, words=words)
        too_big = json.dumps({"name": "x" * (MAX_BODY_BYTES + 10)})
        response = run.send(operation, body=too_big)
        run.check(f"{operation.method} {operation.path} {len(too_big)} bytes", response)
        if response.status_code not in (403, 404, 405, 413):
            run.failures.append(f"{operation.path}: an over-large body got {response.status_code}")
    run.done("deep JSON", started)


def _cursor(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def test_integers_beyond_their_range(run: Run) -> None:
    started = time.monotonic()
    for operation in run.operations:
        if operation.method == "GET":
            query = _required_query(operation.spec)
            params = _query_parameters(operation.spec)
            for name, kinds in params.items():
                if "integer" not in kinds:
                    continue
                for number in BIG_INTEGERS[1:]:
                    response = run.send(operation, query={**query, name: str(number)})
                    run.check(f"GET {operation.path} ?{name}={number}", response, words=(name,))
            if "cursor" in params:
                for position in (
                    "p=99999999999999999999",
                    "o=99999999999999999999&p=1",
                    "p=abc",
                    "p=%00",
                    "r=1&p=2026-13-45",
                    "o=-1",
                ):
                    query_with = {**query, "cursor": _cursor(position)}
                    response = run.send(operation, query=query_with)
                    run.check(
                        f"GET {operation.path} cursor {position}",
                        response,
                        refused=False,
                        words=("cursor",),
                    )
        if operation.method not in WRITES:
            continue
        run.world.mint()
        base = _example(run.world, operation.spec)
        for name, kinds in _body_properties(run.document, operation.spec).items():
            if not kinds & {"integer", "number"}:
                continue
            for number in BIG_INTEGERS:
                body = json.dumps({**base, name: number})
                response = run.send(operation, body=body)
                # 2^31 fits a 64-bit column: it may be accepted there.
                run.check(
                    f"{operation.method} {operation.path} {name}={number}",
                    response,
                    refused=abs(number) > 2**63 - 1 and "integer" in kinds,
                    words=(name,),
                )
    run.done("integers", started)


def test_nul_in_filters_ids_and_bodies(run: Run) -> None:
    started = time.monotonic()
    for operation in run.operations:
        if operation.method == "GET":
            query = _required_query(operation.spec)
            for name in (*_query_parameters(operation.spec), "job"):
                response = run.send(operation, query={**query, name: NUL})
                run.check(f"GET {operation.path} ?{name}=a%00b", response, words=(name, "NUL"))
            # The raw form of the reproduction.
            raw = "&".join(f"{k}={quote(str(v))}" for k, v in query.items())
            response = run.send(operation, query=f"job=%00&{raw}")
            run.check(f"GET {operation.path} ?job=%00", response, words=("job",))
        if operation.ids:
            bad_ids = {name: quote(NUL) for name in operation.ids}
            response = run.send(operation, path=operation.path.format(**bad_ids), body=None)
            run.check(f"{operation.method} {operation.path} ids a%00b", response)
        if operation.method not in WRITES:
            continue
        run.world.mint()
        base = _example(run.world, operation.spec)
        for name, kinds in _body_properties(run.document, operation.spec).items():
            if "string" in kinds:
                response = run.send(operation, body=json.dumps({**base, name: NUL}))
                run.check(
                    f"{operation.method} {operation.path} {name}=a\\u0000b",
                    response,
                    words=("NUL",),
                )
        response = run.send(operation, body=json.dumps({**base, "a\x00": 1}))
        run.check(f"{operation.method} {operation.path} NUL key", response, words=("NUL",))
    run.done("NUL", started)


def test_lone_surrogates_in_strings(run: Run) -> None:
    started = time.monotonic()
    for operation in run.operations:
        if operation.method == "GET":
            query = _required_query(operation.spec)
            for name in _query_parameters(operation.spec):
                # Not UTF-8 in the URL (a surrogate's CESU-8 bytes): Django replaces them.
                raw = "&".join(f"{k}={quote(str(v))}" for k, v in query.items() if k != name)
                response = run.send(operation, query=f"{name}=%ED%A0%80&{raw}")
                run.check(f"GET {operation.path} ?{name}=%ED%A0%80", response, refused=False)
        if operation.method not in WRITES:
            continue
        run.world.mint()
        base = _example(run.world, operation.spec)
        for name, kinds in _body_properties(run.document, operation.spec).items():
            if "string" in kinds:
                # json.dumps escapes it: the body is ASCII, "\ud800" inside a JSON string.
                response = run.send(operation, body=json.dumps({**base, name: SURROGATE}))
                run.check(
                    f"{operation.method} {operation.path} {name}=\\ud800",
                    response,
                    words=("surrogate",),
                )
        # Raw surrogate bytes in the body are not UTF-8.
        response = run.send(operation, body=b'{"name": "\xed\xa0\x80"}')
        run.check(f"{operation.method} {operation.path} raw bytes", response, words=("UTF-8",))
    run.done("surrogates", started)


def test_other_tenants_and_customers_refused_alike(run: Run) -> None:
    """The hostile bodies from another operator's admin and a customer of this operator: never
    a 2xx write on these rows, never a 5xx."""
    started = time.monotonic()
    bodies = ("[]", '{"a":' * 50_000 + "1" + "}" * 50_000, json.dumps({"name": NUL}))
    for operation in run.writes():
        for principal in ("other operator", "customer"):
            for body in bodies:
                response = run.send(operation, principal=principal, body=body)
                run.check(f"{operation.method} {operation.path} as {principal}", response)
            if operation.ids and principal == "other operator":
                valid = json.dumps(_example(run.world, operation.spec))
                response = run.send(operation, principal=principal, body=valid)
                if response.status_code != 404:
                    run.failures.append(
                        f"{operation.path}: another operator's valid body got "
                        f"{response.status_code}, not 404"
                    )
    run.done("other principals", started)
