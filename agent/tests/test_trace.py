"""Trace format v1: round trips, validation of malformed lines, streaming, the validate command."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract import signals
from contract.names import prefixed
from contract.trace import (
    RECORD_CLASSES,
    RECORD_TYPES,
    Event,
    Exit,
    Job,
    Log,
    Process,
    Sample,
    SampleColumns,
    TraceError,
    TraceOrderError,
    TraceReader,
    TraceWriter,
    check_record,
    from_dict,
    validate_trace,
)

T0 = 1767225600.0
GPU0 = "GPU-5f3c0d2e-8a41-4c1b-9e77-0123456789ab"
TRUTH = {"family": "slow_rank", "category": "infrastructure", "subject": "rank 3", "onset": T0}


def every_record_type() -> list[Any]:
    return [
        Job(
            ts=T0,
            job="4242",
            kind="training",
            name="llama-8b",
            nodes=2,
            world_size=16,
            scheduler="slurm",
            state="running",
            config={"lr": 3e-4, "micro_batch": 2},
        ),
        Process(
            ts=T0,
            node="node-01",
            pid=9001,
            job="4242",
            rank=3,
            local_rank=3,
            world_size=16,
            gpu=GPU0,
            cmd=["python", "train.py"],
        ),
        Sample(
            ts=T0 + 1,
            name=signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
            value=0.1 + 0.2,  # 0.30000000000000004: floats must survive exactly
            node="node-01",
            gpu=GPU0,
            gpu_index=3,
        ),
        Sample(
            ts=T0 + 1,
            name=signals.NCCL_BYTES,
            value=123456789012,
            node="node-01",
            pid=9001,
            labels={"op": "allreduce"},
            extra={"future_key": [1, 2, 3]},
        ),
        Event(ts=T0 + 1.5, name=signals.EVENT_XID, value=79, text="NVRM: Xid (PCI:0000:3b:00): 79"),
        Log(
            ts=T0 + 2,
            line="iteration 10/100 | lm loss: 2.5E+00",
            stream="stdout",
            pid=9001,
            step=10,
        ),
        Exit(ts=T0 + 3, node="node-01", pid=9001, exit_code=1),
        Job(ts=T0 + 3, job="4242", state="failed", exit_code=1, rerun_of="4241"),
    ]


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip_every_record_type(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    records = every_record_type()
    with TraceWriter(path, {"source": "test"}, truth=TRUTH) as w:
        for rec in records:
            w.write(rec)
        w.write({"type": "sample", "ts": T0 + 3, "name": "vendor.custom", "value": 1, "odd": True})
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    reader = TraceReader(path)
    got = list(reader.records())
    assert reader.problems == []
    assert reader.meta == {
        "type": "meta",
        "format": "proof-trace",
        "version": 1,
        "source": "test",
        "truth": TRUTH,
    }
    assert got[: len(records)] == records
    assert got[2].value == 0.30000000000000004  # type: ignore[union-attr]
    assert got[3].extra == {"future_key": [1, 2, 3]}
    last = got[-1]
    assert isinstance(last, Sample) and last.name == "vendor.custom"
    assert last.extra == {"odd": True}
    assert reader.counts == {"job": 2, "process": 1, "sample": 3, "event": 1, "log": 1, "exit": 1}


def test_gzip_detected_by_magic_not_name(tmp_path: Path) -> None:
    path = tmp_path / "misnamed.jsonl"
    with open(path, "wb") as fh, TraceWriter(fh, gzip_compress=True) as w:
        w.write(Sample(ts=T0, name="x", value=1.5))
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert [r["value"] for r in TraceReader(path)] == [1.5]


def test_bulk_samples_match_single_writes(tmp_path: Path) -> None:
    gpus = [f"GPU-{i:04d}" for i in range(4)]
    columns = SampleColumns(
        4, node="node-07", gpu=gpus, gpu_index=np.arange(4), labels={"src": "50%"}
    )
    values = np.array([0.25, 1e-9, 312.123456789, 7.0])
    with TraceWriter(tmp_path / "bulk.jsonl") as w:
        w.write_samples(T0, signals.DCGM_FI_DEV_POWER_USAGE, values, columns)
        w.write_samples(T0 + 1, signals.DCGM_FI_DEV_PCIE_LINK_GEN, np.array([5, 5, 4, 5]), columns)
    with TraceWriter(tmp_path / "single.jsonl") as w:
        for i in range(4):
            w.write(
                Sample(
                    ts=T0,
                    name=signals.DCGM_FI_DEV_POWER_USAGE,
                    value=float(values[i]),
                    node="node-07",
                    gpu=gpus[i],
                    gpu_index=i,
                    labels={"src": "50%"},
                )
            )
    bulk = list(TraceReader(tmp_path / "bulk.jsonl"))
    single = list(TraceReader(tmp_path / "single.jsonl"))
    assert bulk[:4] == single
    assert [r["value"] for r in bulk[4:]] == [5, 5, 4, 5]
    assert all(type(r["value"]) is int for r in bulk[4:])
    assert validate_trace(tmp_path / "bulk.jsonl").ok


def test_writer_rejects_bad_records(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t.jsonl") as w:
        w.write(Sample(ts=T0 + 5, name="x", value=1))
        with pytest.raises(TraceOrderError, match="earlier than the previous"):
            w.write(Sample(ts=T0 + 4, name="x", value=1))
        columns = SampleColumns(2, node="n")
        with pytest.raises(TraceOrderError):
            w.write_samples(T0, "x", np.array([1.0, 2.0]), columns)
        with pytest.raises(TraceError, match="must be finite"):
            w.write_samples(T0 + 6, "x", np.array([1.0, np.nan]), columns)
        with pytest.raises(TraceError, match="2 rows"):
            w.write_samples(T0 + 6, "x", np.array([1.0]), columns)
        with pytest.raises(TraceError, match="'pid' must be an integer"):
            w.write({"type": "process", "ts": T0 + 6, "node": "n", "pid": "12"})
        with pytest.raises(TraceError, match="labels"):
            SampleColumns(1, labels={"op": 3})  # type: ignore[dict-item]
        with pytest.raises(TraceError, match="duplicate"):
            SampleColumns(1, extra={"value": 3})
        with pytest.raises(TraceError, match="unknown identity columns"):
            SampleColumns(1, rack="r1")
        w.write(Sample(ts=T0 + 6, name="x", value=2))
    # What was accepted before the errors is intact.
    assert [r["ts"] for r in TraceReader(tmp_path / "t.jsonl")] == [T0 + 5, T0 + 6]
    with pytest.raises(TraceError, match="fixed"):
        TraceWriter(tmp_path / "u.jsonl", {"version": 2})


def test_malformed_lines_reported_with_line_numbers_and_skipped(tmp_path: Path) -> None:
    good = {"type": "sample", "ts": T0, "name": "x", "value": 1}
    lines = [
        json.dumps({"type": "meta", "format": "proof-trace", "version": 1}),  # 1
        json.dumps(good),  # 2
        '{"type": "sample", "ts": 1767225601.0, "name": "x", "value": ',  # 3 bad JSON
        json.dumps({"type": "sample", "ts": T0 + 1, "name": "x"}),  # 4 missing value
        json.dumps({"type": "sample", "ts": T0 + 1, "name": "x", "value": "3"}),  # 5 wrong type
        json.dumps({**good, "ts": T0 + 1, "labels": ["op", "allreduce"]}),  # 6 labels not obj
        json.dumps([1, 2, 3]),  # 7 not an object
        json.dumps({**good, "ts": T0 + 1, "gpu_index": "3"}),  # 8 identity type
        json.dumps({**good, "ts": T0 + 2, "labels": {"op": 1}}),  # 9 label value not string
        json.dumps({**good, "ts": T0 + 2}),  # 10 good
        json.dumps({**good, "ts": T0 + 1}),  # 11 out of order
        "",  # 12 empty
        '{"type":"sample","ts":1767225603.0,"name":"x","value":NaN}',  # 13 non-finite
        json.dumps({"type": "exit", "ts": T0 + 3, "node": "n", "pid": 1}),  # 14 no exit_code
        json.dumps({"type": "hologram", "ts": T0 + 3, "x": 1}),  # 15 unknown type: kept
        json.dumps({**good, "ts": T0 + 4, "brand_new": {"a": 1}}),  # 16 unknown key: kept
        '{"type":"sample","ts":1767225604.0,"name":"x","value":' + "9" * 5000 + "}",  # 17
        "[" * 100_000 + "]" * 100_000,  # 18 nesting deeper than the parser's recursion
        b"\xff\xfe".decode("latin-1"),  # 19 not UTF-8 once re-encoded below
    ]
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write("\n".join(lines[:-1]).encode() + b"\n\xff\xfe\n")
    seen: list[int] = []
    reader = TraceReader(path, on_problem=lambda p: seen.append(p.line))
    got = list(reader)
    assert [r["ts"] for r in got] == [T0, T0 + 2, T0 + 3, T0 + 4]
    assert got[-1]["brand_new"] == {"a": 1}
    assert got[-2]["type"] == "hologram"
    by_line = {p.line: p.message for p in reader.problems}
    assert sorted(by_line) == [3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 17, 18, 19]
    assert seen == sorted(by_line)
    assert "invalid JSON" in by_line[3] and "at character 63" in by_line[3]
    assert "missing required key 'value'" in by_line[4]
    assert "'value' must be a finite number" in by_line[5]
    assert "'labels' must be an object" in by_line[6]
    assert "must be a JSON object" in by_line[7]
    assert "'gpu_index' must be an integer" in by_line[8]
    assert "labels['op'] must be a string" in by_line[9]
    assert "non-decreasing" in by_line[11]
    assert "empty line" in by_line[12]
    assert "invalid JSON" in by_line[13] or "non-finite" in by_line[13]  # NaN is not JSON
    nan_sample = {**good, "value": float("nan")}  # what json.loads would make of line 13
    assert "non-finite nan" in (check_record(nan_sample) or "")
    assert "exit_code" in by_line[14]
    assert "invalid JSON" in by_line[17] and "invalid JSON" in by_line[18]
    assert "UTF-8" in by_line[19]


def test_meta_problems(tmp_path: Path) -> None:
    path = tmp_path / "nometa.jsonl"
    path.write_text(json.dumps({"type": "sample", "ts": T0, "name": "x", "value": 1}) + "\n")
    report = validate_trace(path)
    assert [p.line for p in report.problems] == [1]
    assert "first line must be the meta record" in report.problems[0].message
    assert report.counts == {"sample": 1}  # the record itself is still read

    path.write_text(json.dumps({"type": "meta", "format": "proof-trace", "version": 2}) + "\n")
    report = validate_trace(path)
    assert "unsupported trace version 2" in report.problems[0].message

    path.write_text("")
    assert "empty trace" in validate_trace(path).problems[0].message


def test_truncated_gzip_reports_and_keeps_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    columns = SampleColumns(8, gpu_index=np.arange(8))
    with TraceWriter(path) as w:
        for s in range(2000):
            w.write_samples(T0 + s, "x", np.full(8, s, dtype=np.int64), columns)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    report = validate_trace(path)
    assert report.problem_count == 1
    assert "cut short" in report.problems[0].message
    assert report.problems[0].line == report.lines + 1
    assert 1000 < report.counts["sample"] < 16000


def test_reader_streams_in_constant_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl.gz"
    n = 64
    columns = SampleColumns(
        n,
        node=[f"node-{i // 8:02d}" for i in range(n)],
        gpu=[f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(n)],
        gpu_index=[i % 8 for i in range(n)],
    )
    rng = np.random.default_rng(1)
    with TraceWriter(path) as w:
        for s in range(600):
            for name in signals.GPU_SIGNALS[:2]:
                w.write_samples(T0 + s, name, rng.random(n), columns)
    with gzip.open(path, "rb") as fh:
        uncompressed = sum(len(line) for line in fh)
    assert uncompressed > 10_000_000
    tracemalloc.start()
    try:
        reader = TraceReader(path)
        count = sum(1 for _ in reader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 600 * 2 * n and reader.problem_count == 0
    assert peak < uncompressed / 20, (peak, uncompressed)


def test_from_dict_ignores_unknown_types() -> None:
    assert from_dict({"type": "hologram", "ts": 1.0}) is None


def test_name_tuples_are_collected_from_their_constants() -> None:
    # RECORD_TYPES is the §5 table's rows (no `meta`), EVENT_NAMES every EVENT_* constant.
    assert (
        RECORD_TYPES
        == tuple(RECORD_CLASSES)
        == ("sample", "event", "log", "process", "exit", "job")
    )
    assert signals.EVENT_NAMES[:2] == (signals.EVENT_XID, signals.EVENT_ECC_DBE)
    assert signals.EVENT_NAMES[-1] == signals.EVENT_BATCH_REFUSED and len(signals.EVENT_NAMES) == 9
    namespace = {"A_ONE": "1", "B_TWO": "2", "A_LIST": ("x",), "A_THREE": "3"}
    assert prefixed(namespace, "A_") == ("1", "3")


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    """`proof-agent validate <path>`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_validate_command(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl.gz"
    with TraceWriter(good, truth=TRUTH) as w:
        for rec in every_record_type():
            w.write(rec)
    run = validate(good)
    assert run.returncode == 0, run.stderr
    assert "sample: 2" in run.stdout and "problems: 0" in run.stdout
    assert '"family": "slow_rank"' in run.stdout

    bad = tmp_path / "bad.jsonl"
    bad.write_text(gzip.decompress(good.read_bytes()).decode() + "{oops\n")
    run = validate(bad)
    assert run.returncode == 1
    assert "line 10: invalid JSON" in run.stderr and "at character 2" in run.stderr
    assert "problems: 1" in run.stdout


def test_records_over_a_limit_are_reported_with_their_line_and_read_cleaned(
    tmp_path: Path,
) -> None:
    """The limits of contract/limits.py, as the reader (validate, replay) applies them."""
    meta = {"type": "meta", "format": "proof-trace", "version": 1}
    long_gpu = "GPU-" + "c" * 196
    records = [
        {"type": "log", "ts": T0, "line": "x" * 26_498},  # 2
        {"type": "log", "ts": T0, "line": "\x00\x00 corrupted", "stream": "stderr"},  # 3
        {"type": "sample", "ts": T0, "name": "x", "value": 1.0, "gpu": long_gpu},  # 4
        {"type": "sample", "ts": T0, "name": "x", "value": 2.0, "labels": {"k": "v\x00"}},  # 5
        {"type": "job", "ts": T0, "job": "j", "config": {"lr": "1\x00"}},  # 6
        {"type": "log", "ts": T0, "line": "fine"},  # 7
    ]
    path = tmp_path / "dirty.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [meta, *records]) + "\n")
    reader = TraceReader(path)
    got = list(reader)
    assert len(got) == 6 and reader.cleaned == 5
    assert sorted({p.line for p in reader.problems}) == [2, 3, 4, 5, 6]
    by_line = {p.line: p.message for p in reader.problems}
    assert "'line': 26498 characters, over the limit of 16384" in by_line[2]
    assert "NUL character" in by_line[3]
    assert "identity key 'gpu': 200 characters, over the limit of 96" in by_line[4]
    assert len(got[0]["line"]) == 16384 and "…[truncated " in got[0]["line"]
    assert got[1]["line"] == "\ufffd\ufffd corrupted"
    assert len(got[2]["gpu"]) == 96 and got[3]["labels"] == {"k": "v\ufffd"}
    assert got[4]["config"] == {"lr": "1\ufffd"} and got[5]["line"] == "fine"
    run = validate(path)
    assert run.returncode == 1
    assert "line 2: log record: 'line': 26498 characters" in run.stderr
    assert "log: 3" in run.stdout and "sample: 2" in run.stdout and "cleaned: 5" in run.stdout
