"""`proof analyze`: JSON {"verdicts": [...], "jobs": [...]}, the verdicts valid against
contract/verdict_schema.json, every cited evidence id present, every job seen summarised
(so "no verdict" is told apart from "saw nothing"), malformed lines reported and skipped, and an
end-to-end run on a small simulated trace finding the injected family."""

from __future__ import annotations

import argparse
import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from contract import limits
from contract.parsers.training import PROGRESS, LogParser
from contract.verdicts import verdict_schema
from engine import analyze
from engine.store import TraceStore
from simulator import simulate

SCHEMA = verdict_schema()


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
            "boolean": lambda v: isinstance(v, bool),
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
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


@pytest.mark.parametrize(
    ("scenario", "family"),
    [("hardware_fault", "hardware_fault"), ("slow_rank", "slow_rank")],
)
def test_end_to_end_simulated_trace(tmp_path: Path, scenario: str, family: str) -> None:
    sim = simulate(scenario, seed=0, duration_s=400, nodes=1, gpus_per_node=4)
    path = tmp_path / "t.jsonl.gz"
    sim.write(path)
    doc = _run_json(path)
    assert list(doc) == ["verdicts", "jobs"]
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
    doc = _run_json(path)
    assert doc["verdicts"] == []
    # ...and the job was seen: no verdict is not "saw nothing"
    (job,) = doc["jobs"]
    records = list(sim.records())
    job_ids = {r["job"] for r in records if r.get("job")}
    assert [job["job"]] == sorted(job_ids)
    ranks = {r["rank"] for r in records if r.get("rank") is not None}
    assert job["ranks"] == sorted(ranks) and len(ranks) == 4
    parser = LogParser()
    parsed = [parser.feed(r["line"]) for r in records if r["type"] == "log"]
    steps = {p.step for p in parsed if p is not None and p.kind == PROGRESS and p.step is not None}
    assert len(steps) > 10
    assert job["steps"] == {
        "first": min(steps),
        "last": max(steps),
        "count": len(steps),
        "logged": sum(
            1 for p in parsed if p is not None and p.kind == PROGRESS and p.loss is not None
        ),
    }
    assert job["kind"] == "training" and job["verdicts"] == []
    assert (
        job["interval"]["start"] >= records[0]["ts"]
        and job["interval"]["end"] > 250 + records[0]["ts"]
    )


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


# --- the jobs seen ---------------------------------------------------------------------------


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    meta = {"type": "meta", "format": "proof-trace", "version": 1}
    path.write_text("\n".join(json.dumps(r) for r in [meta, *records]) + "\n")
    return path


T0 = 1_800_000_000.0


def _progress(ts: float, step: int, loss: float, **keys: Any) -> dict[str, Any]:
    line = f"iter {step}: loss {loss:.4f}, time 100.00ms, mfu 10.00%"
    return {"type": "log", "ts": ts, "line": line, "node": "n1", "step": step, **keys}


def test_a_trace_without_any_job_says_so(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "empty.jsonl",
        [{"type": "sample", "ts": T0, "name": "host.cpu_util", "value": 0.5, "node": "n1"}],
    )
    assert _run_json(path) == {"verdicts": [], "jobs": []}
    out = io.StringIO()
    with redirect_stdout(out):
        analyze.run(argparse.Namespace(trace=[str(path)], json=False, no_progress=True))
    assert out.getvalue().startswith("No job seen:")


def test_per_rank_traces_are_one_run(tmp_path: Path) -> None:
    """The per-rank files `torchrun --no-python proof-agent exec` writes: one job, both
    ranks, the steps rank 0 printed, completed because every rank exited 0."""
    job = "torchelastic-abc"
    files = []
    for rank in (0, 1):
        keys = {"job": job, "pid": 100 + rank, "rank": rank}
        recs: list[dict[str, Any]] = [
            {"type": "process", "ts": T0 + rank * 0.1, "node": "n1", "world_size": 2, **keys}
        ]
        if rank == 0:
            recs += [_progress(T0 + 4 + s, s, 3.0 - s / 10, **keys) for s in (10, 20, 30)]
            recs.append({"type": "job", "ts": T0 + 4, "job": job, "kind": "training"})
        recs.append({"type": "exit", "ts": T0 + 111 - rank, "node": "n1", "exit_code": 0, **keys})
        files.append(_write(tmp_path / f"run.rank{rank}.jsonl", recs))
    doc = _run_json_many(files)
    assert doc["jobs"] == [
        {
            "job": job,
            "kind": "training",
            "state": "completed",
            "exit_code": 0,
            "nodes": ["n1"],
            "world_size": 2,
            "ranks": [0, 1],
            "processes": 2,
            "steps": {"first": 10, "last": 30, "count": 3, "logged": 3},
            "interval": {"start": T0, "end": T0 + 111},
            "verdicts": [],
        }
    ]
    out = io.StringIO()
    with redirect_stdout(out):
        analyze.run(argparse.Namespace(trace=[str(f) for f in files], json=False, no_progress=True))
    assert (
        f"  job {job}: training, 2 ranks (0, 1), steps 10–30 (3 seen), 00:00:00–00:01:51, "
        "completed, exit 0 — no verdict"
    ) in out.getvalue().splitlines()


def _run_json_many(paths: list[Path]) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = analyze.run(
            argparse.Namespace(trace=[str(p) for p in paths], json=True, no_progress=True)
        )
    assert rc == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def test_job_state_and_kind_from_what_was_seen(tmp_path: Path) -> None:
    """Without a job record: a failed rank fails the job; processes seen gone without an exit
    code (the node agent is not their parent) ended; one still there is running; an
    inference server's command line makes the job inference; nothing said: unknown."""
    gone = {"type": "event", "name": "process_gone", "node": "n1", "text": "ended"}
    recs: list[dict[str, Any]] = [
        {"type": "process", "ts": T0, "node": "n1", "pid": 1, "job": "a", "rank": 0},
        {"type": "process", "ts": T0, "node": "n1", "pid": 2, "job": "a", "rank": 1},
        {"type": "process", "ts": T0, "node": "n1", "pid": 3, "job": "b", "cmd": ["vllm", "serve"]},
        {"type": "process", "ts": T0, "node": "n1", "pid": 4, "job": "c"},
        {"type": "exit", "ts": T0 + 5, "node": "n1", "pid": 1, "job": "a", "exit_code": 0},
        {"type": "exit", "ts": T0 + 6, "node": "n1", "pid": 2, "job": "a", "exit_code": 3},
        {**gone, "ts": T0 + 7, "pid": 3, "job": "b"},
    ]
    jobs = {j["job"]: j for j in _run_json(_write(tmp_path / "s.jsonl", recs))["jobs"]}
    assert {k: (j["kind"], j["state"], j["exit_code"]) for k, j in jobs.items()} == {
        "a": ("unknown", "failed", 3),
        "b": ("inference", "ended", None),
        "c": ("unknown", "running", None),
    }
    assert jobs["a"]["interval"] == {"start": T0, "end": T0 + 6}
    assert jobs["a"]["steps"] == {"first": None, "last": None, "count": 0, "logged": 0}


def test_analyze_applies_the_shared_limits_and_names_each_line(tmp_path: Path) -> None:
    """The limits the agent cleans to and ingest checks (contract/limits.py) hold in `proof
    analyze` too: an over-long log line, a NUL in a label, an over-long GPU id are cleaned
    the way ingest stores them and reported with their line numbers; nothing else is lost."""
    sim = simulate("healthy_training", seed=1, duration_s=120, nodes=1, gpus_per_node=2)
    good = tmp_path / "g.jsonl"
    sim.write(good)
    lines = good.read_text().splitlines()
    li = next(i for i, x in enumerate(lines) if json.loads(x).get("type") == "log")
    si = next(i for i, x in enumerate(lines) if json.loads(x).get("type") == "sample")
    log, smp = json.loads(lines[li]), json.loads(lines[si])
    log["line"] = "A" * 26_498
    smp["labels"] = {"port": "mlx5\x00_0"}
    smp["gpu"] = "GPU-" + "a" * 200
    lines[li], lines[si] = json.dumps(log), json.dumps(smp)
    bad = tmp_path / "b.jsonl"
    bad.write_text("\n".join(lines) + "\n")

    problems: list[Any] = []
    store = TraceStore.from_trace(bad, on_problem=problems.append)
    by_line = {(p.line, p.message.split(":")[0]) for p in problems}
    assert (si + 1, "identity key 'gpu'") in by_line
    assert (si + 1, "'labels'") in by_line
    assert (li + 1, "log record") in by_line
    lo, hi = store.time_range()
    stored = [r.line for j in store.jobs() for r in store.job_logs(j, lo, hi)]
    longest = max(stored, key=len)
    assert len(longest) == limits.MAX_LOG_LINE_CHARS and longest.endswith("chars]")
    assert sum(len(x) for x in stored) > 0 and "\x00" not in "".join(stored)
    cleaned_gpu = [g for g, _node, _i in store.gpus() if "…#" in g]
    assert len(cleaned_gpu) == 1 and len(cleaned_gpu[0]) == limits.MAX_GPU_CHARS
    # the clean trace loads with no problem at all, and the same number of log lines
    clean_problems: list[Any] = []
    clean = TraceStore.from_trace(good, on_problem=clean_problems.append)
    assert clean_problems == []
    assert len([1 for j in clean.jobs() for _ in clean.job_logs(j, lo, hi)]) == len(stored)
