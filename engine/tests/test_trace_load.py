"""engine/trace_load.py: the columns way reads a batch exactly as the general way would.

Each trace here is read twice — as `proof analyze` reads it, and with the columns way switched
off (every batch decoded line by line into dicts) — with batches of 4 KiB so most batches take
the columns way; the two stores and the problems reported must be identical. The traces carry
what could make the two ways differ: lines out of ts order, a repeated key in the rest of a
line, `-0`, integer ts and values, a `true` value, labels, bad JSON, a sample formatted another
way, series first seen late, a gzip stream cut short.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine import trace_load
from engine.store import TraceStore

META = '{"type":"meta","format":"proof-trace","version":1}'


def _sample(ts: Any, name: str, value: Any, rest: str = ',"node":"n1","gpu":"G0"') -> str:
    return f'{{"type":"sample","ts":{ts},"name":"{name}","value":{value}{rest}}}'


def _trace(lines: list[str]) -> str:
    return "\n".join([META, *lines]) + "\n"


def _healthy_lines(n: int, t0: float = 1000.0) -> list[str]:
    out = []
    for k in range(n):
        ts = t0 + k * 0.5
        for g in range(4):
            out.append(
                _sample(ts, "gpu.util", round(0.1 * g + k % 7, 3), f',"node":"n1","gpu":"G{g}"')
            )
            out.append(
                _sample(ts, "host.cpu_util", 0.3, f',"node":"n1","pid":{100 + g},"job":"j1"')
            )
        if k % 9 == 0:
            out.append(json.dumps({"type": "log", "ts": ts, "job": "j1", "line": f"step {k}"}))
    return out


def _read(path: Path, *, columns: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    monkeypatch.setattr(trace_load, "CHUNK", 4096)
    if not columns:
        monkeypatch.setattr(trace_load._Reader, "take_columns", lambda *_a, **_k: None)
    taken: list[int] = []
    original: Callable[..., Any] = trace_load._Reader.take_columns

    def counting(self: Any, *args: Any) -> Any:
        kept = original(self, *args)
        taken.append(kept is not None)
        return kept

    monkeypatch.setattr(trace_load._Reader, "take_columns", counting)
    problems: list[Any] = []
    store = TraceStore.from_trace(path, on_problem=problems.append)
    monkeypatch.undo()
    series = sorted(
        (s.info, s.ts.tolist(), s.values.tolist(), [type(v) for v in s.values.tolist()])
        for s in store._series
    )
    logs = {job: [(r.ts, r.line) for r in rows] for job, rows in store._logs.items()}
    return (series, logs, [(p.line, p.message) for p in problems], store.time_range()), taken


def _same_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    fast, taken = _read(path, columns=True, monkeypatch=monkeypatch)
    slow, _ = _read(path, columns=False, monkeypatch=monkeypatch)
    assert fast == slow
    assert sum(taken) >= 3, "the columns way was not exercised"
    return fast


def test_clean_trace_reads_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_trace(_healthy_lines(300)))
    series, logs, problems, _ = _same_both_ways(path, monkeypatch)
    assert problems == []
    assert len(series) == 8
    assert all(len(ts) == 300 for _info, ts, _v, _t in series)
    assert len(logs["j1"]) == 34


def test_awkward_lines_read_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _healthy_lines(120)
    late = _healthy_lines(120, t0=1063.0)
    lines += [
        _sample(1060.0, "gpu.util", "-0"),  # orjson's int 0, not -0.0
        _sample(1060, "gpu.util", 5),  # integer ts and value
        _sample(1061.0, "gpu.util", "true"),  # not a number
        _sample(1061.0, "gpu.util", 1, ',"node":"n1","gpu":"G0","value":7'),  # repeated key
        _sample(1061.0, "gpu.util", 2, ',"node":"n1","gpu":"G0","labels":{"name":"x"}'),
        '{"ts":1061.0,"type":"sample","name":"gpu.util","value":3,"node":"n1","gpu":"G0"}',
        _sample(1050.0, "gpu.util", 4),  # earlier than the line before: reported, skipped
        "{not json",
        "",
        _sample(1062.0, "new.signal", 1.5, ',"node":"n2"'),  # a series first seen late
    ]
    lines += late[1:]
    lines += [_sample(1130.0, "gpu.util", 1e-7), _sample(1130.0, "gpu.util", "1e999")]
    lines += _healthy_lines(60, t0=1131.0)
    path = tmp_path / "t.jsonl"
    path.write_text(_trace(lines))
    _series, _logs, problems, _ = _same_both_ways(path, monkeypatch)
    messages = " | ".join(m for _line, m in problems)
    assert "earlier than the previous record" in messages
    assert "invalid JSON" in messages
    assert "empty line" in messages


def test_gzip_cut_short_reads_the_same_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = gzip.compress(_trace(_healthy_lines(400)).encode())
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    series, _logs, problems, _ = _same_both_ways(path, monkeypatch)
    assert [m for _line, m in problems if "cut short" in m]
    assert 100 < max(len(ts) for _i, ts, _v, _t in series) < 400


def test_gzip_members_and_padding_are_read_like_gzipfile(tmp_path: Path) -> None:
    text = _trace(_healthy_lines(50))
    half = len(text) // 2
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(
        gzip.compress(text[:half].encode()) + b"\0" * 10 + gzip.compress(text[half:].encode())
    )
    problems: list[Any] = []
    store = TraceStore.from_trace(path, on_problem=problems.append)
    assert problems == []
    assert sum(len(s.ts) for s in store._series) == 50 * 8
    assert np.all(np.diff(store._series[0].ts) > 0)


def test_corrupt_gzip_is_reported_after_the_lines_before_it(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(_trace(_healthy_lines(400)).encode()))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(bytes(data))
    problems: list[Any] = []
    store = TraceStore.from_trace(path, on_problem=problems.append)
    assert any("compressed stream is damaged" in p.message for p in problems)
    assert store._series and all(len(s.ts) < 400 for s in store._series)


def test_the_read_ahead_thread_stops_with_its_reader() -> None:
    def endless() -> Any:
        while True:
            yield b"x" * 1024, None

    ahead = trace_load._ahead(endless())
    assert next(ahead) == (b"x" * 1024, None)
    ahead.close()  # the consumer stops early, the producer is blocked on a full queue
    assert not [t for t in threading.enumerate() if t.name == "trace-read"]

    def failing() -> Any:
        yield b"a", None
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(trace_load._ahead(failing()))
    assert not [t for t in threading.enumerate() if t.name == "trace-read"]
