"""The verdict's shape, shared by whoever builds verdicts (the engine), whoever states the
truth they are scored against (the simulator) and whoever serves them (the API).

`verdict_schema.json` beside this module is the normative JSON Schema of one verdict
(docs/design.md §7, "Verdict JSON"); `subject()` builds the `subject` object every verdict and
every scenario's ground truth carries.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("verdict_schema.json")


@cache
def verdict_schema() -> dict[str, Any]:
    """The verdict JSON Schema (parsed once)."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return schema


def subject(
    job: str | None = None,
    node: str | None = None,
    gpu: str | None = None,
    rank: int | None = None,
    mount: str | None = None,
) -> dict[str, Any]:
    """What a verdict is about: every key present, None where it does not apply."""
    return {"job": job, "node": node, "gpu": gpu, "rank": rank, "mount": mount}
