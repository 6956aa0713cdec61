"""The verdict object in the OpenAPI schema: contract/verdict_schema.json itself, not a copy.

The API serves the docs/design.md §7 object as stored (the incident's `verdict`, a revision's
`verdict`, GET /verdicts/), so the schema it publishes is the contract's JSON Schema — the
optional `investigation` object included, every field typed. OpenAPI 3.1's schema objects are
JSON Schema 2020-12, so it goes in as is, with its `$defs` references inlined (a `#/$defs/…`
pointer would resolve against the OpenAPI document, not the contract file).
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from contract.verdicts import verdict_schema


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(copy.deepcopy(defs[ref.removeprefix("#/$defs/")]), defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


@cache
def openapi_verdict_schema() -> dict[str, Any]:
    """The contract's verdict schema as an OpenAPI 3.1 schema object (no $schema/$id/$defs)."""
    contract = verdict_schema()
    defs = contract.get("$defs", {})
    body = {k: v for k, v in contract.items() if k not in ("$schema", "$id", "$defs")}
    body["description"] = "the docs/design.md §7 verdict object (contract/verdict_schema.json)"
    inlined: dict[str, Any] = _inline(body, defs)
    return inlined


def investigation_schema() -> dict[str, Any]:
    """The verdict's optional `investigation` object alone."""
    schema: dict[str, Any] = openapi_verdict_schema()["properties"]["investigation"]
    return schema


@extend_schema_field(openapi_verdict_schema())
class VerdictField(serializers.JSONField):
    """A stored verdict, read-only, described by the contract's schema."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)
