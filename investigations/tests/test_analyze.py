"""`proof analyze`: JSON exactly {"verdicts": [...]} valid against investigations/verdict_schema.json,
every cited evidence id present, malformed lines reported and skipped, and an end-to-end run
on a small simulated trace finding the injected family."""

from __future__ import annotations

import argparse
import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from agent.sim import simulate
from investigations import analyze

SCHEMA = json.loads((Path(__file__).parent.parent / "verdict_schema.json").read_text())


def _validate(value: Any, schema: dict[str, Any], path: str = "$") -> None:
    """A small JSON-schema subset validator (type, enum, required, properties, items, $ref,
    minimum/maximum, pattern, minLength) — jsonschema is not a dependency."""
    if "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].split("/")[-1]]
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        checks = {
            "string": lambda v: isinstance(v, str),
            "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "null": lambda v: v is None,
        }
        assert any(checks[t](value) for t in names), f"{path}: {value!r} is not {names}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "minimum" in schema:
        assert value >= schema["minimum"], path
    if "maximum" in schema:
        assert value <= schema["maximum"], path
    if "pattern" in schema:
        assert re.match(schema["pattern"], value), f"{path}: {value!r}"
    if "minLength" in schema:
        assert len(value) >= schema["minLength"], path
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: missing {key}"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                _validate(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _validate(item, schema["items"], f"{path}[{i}]")


def check_verdict(v: dict[str, Any]) -> None:
    _validate(v, SCHEMA)
    ids = {e["id"] for e in v["evidence"]}
    assert len(ids) == len(v["evidence"]), "evidence ids are unique"
    for text in (v["summary"], v["explanation"]):
        for cited in re.findall(r"\b(e\d+)\b", text):
            assert cited in ids, f"{cited} cited but not in evidence"
    for c in v["cleared"]:
        assert set(c["evidence"]) <= ids


def test_validator_rejects_a_broken_verdict() -> None:
    with pytest.raises(AssertionError):
        _validate({"id": "x", "family": "not_a_family"}, SCHEMA)


def _run_json(path: Path) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = analyze.run(argparse.Namespace(trace=str(path), json=True, no_progress=True))
    assert rc == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize(
    ("scenario", "family"),
    [("hardware_fault", "hardware_fault"), ("slow_rank", "slow_rank")],
)
def test_end_to_end_simulated_trace(tmp_path: Path, scenario: str, family: str) -> None:
    sim = simulate(scenario, seed=0, duration_s=400, nodes=1, gpus_per_node=4)
    path = tmp_path / "t.jsonl.gz"
    sim.write(path)
    doc = _run_json(path)
    assert list(doc) == ["verdicts"]
    got = [v for v in doc["verdicts"] if v["family"] == family]
    assert got, [v["family"] for v in doc["verdicts"]]
    truth = sim.meta["truth"]
    assert got[0]["category"] == truth["category"]
    assert got[0]["subject"]["gpu"] == truth["subject"]["gpu"]
    for v in doc["verdicts"]:
        check_verdict(v)
        hw = [c for c in v["cleared"] if c["check"] == "hardware"]
        if v["subject"]["job"]:
            assert hw, "every job verdict carries the hardware clearance"


def test_healthy_trace_has_no_verdict(tmp_path: Path) -> None:
    sim = simulate("healthy_preexisting_counter", seed=0, duration_s=300, nodes=1, gpus_per_node=4)
    path = tmp_path / "h.jsonl.gz"
    sim.write(path)
    assert _run_json(path) == {"verdicts": []}


def test_malformed_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    sim = simulate("hardware_fault", seed=0, duration_s=400, nodes=1, gpus_per_node=4)
    good = tmp_path / "g.jsonl"
    sim.write(good)
    lines = good.read_text().splitlines()
    lines.insert(5, "{not json")
    lines.insert(9, '{"type":"sample","ts":"soon"}')
    bad = tmp_path / "b.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    err = io.StringIO()
    verdicts = analyze.analyze_trace(str(bad), err=err)
    assert "line 6" in err.getvalue() and "line 10" in err.getvalue()
    assert any(v["family"] == "hardware_fault" for v in verdicts)


def test_progress_bar_goes_to_stderr_and_reaches_100(tmp_path: Path) -> None:
    sim = simulate("healthy_training", seed=1, duration_s=300, nodes=1, gpus_per_node=2)
    path = tmp_path / "p.jsonl.gz"
    sim.write(path)
    err = io.StringIO()
    analyze.analyze_trace(str(path), progress=True, err=err)
    assert "reading" in err.getvalue() and "100%" in err.getvalue()


def test_human_output_has_the_evidence_table(tmp_path: Path) -> None:
    sim = simulate("hardware_fault", seed=0, duration_s=400, nodes=1, gpus_per_node=4)
    path = tmp_path / "t.jsonl.gz"
    sim.write(path)
    out = io.StringIO()
    with redirect_stdout(out):
        analyze.run(argparse.Namespace(trace=str(path), json=False, no_progress=True))
    text = out.getvalue()
    assert "== hardware_fault (infrastructure" in text
    assert "evidence:" in text and "   e1 " in text and "cleared: hardware: implicated" in text


def test_gzip_cut_short_keeps_the_lines_before_the_damage(tmp_path: Path) -> None:
    from investigations.store import TraceStore

    sim = simulate("healthy_training", seed=2, duration_s=300, nodes=1, gpus_per_node=2)
    whole = tmp_path / "w.jsonl.gz"
    sim.write(whole)
    data = whole.read_bytes()
    cut = tmp_path / "c.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    problems: list[Any] = []
    store = TraceStore.from_trace(cut, on_problem=problems.append)
    assert any("cut short" in p.message for p in problems)
    assert store.jobs(), "records before the damage were read"
