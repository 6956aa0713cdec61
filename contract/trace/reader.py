"""Streaming trace reader and validator (docs/design.md §5).

Reads plain or gzip traces (detected by the gzip magic bytes, not the file name) one line at a
time, so memory stays constant whatever the trace's size. Every line is checked against the v1
rules; a malformed line is reported as a `Problem` with its 1-based line number and skipped,
and reading goes on. A gzip stream cut short (a crash while writing) is reported once, after
the last complete line, and ends the reading.

A valid record that breaks a limit of contract/limits.py (a NUL character, a 26 KB line, a GPU id
over 96 characters, …) is reported as a `Problem` with its line number too, but it is not
skipped: it is cleaned (`records.clean_record`, the same rules the agent cleans to and ingest
checks) and read on — so `proof-agent validate` names it and `proof replay` sends it cleaned.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

try:  # 7x faster than json.loads on trace lines; strict JSON too (NaN is an error)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a base dependency; json is the fallback
    from json import loads as _loads  # type: ignore[assignment]

from contract.trace.records import (
    TYPE_META,
    Record,
    check_meta,
    check_record,
    clean_record,
    from_dict,
    read_meta_line,
)

GZIP_MAGIC = b"\x1f\x8b"
MAX_KEPT_PROBLEMS = 1000  # beyond this only the count grows: a garbage file must not eat memory


@dataclass(frozen=True, slots=True)
class Problem:
    line: int  # 1-based line number in the (uncompressed) trace
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def open_trace_bytes(path: str | os.PathLike[str]) -> IO[bytes] | gzip.GzipFile:
    """The trace's uncompressed bytes, gzip or plain by its first two bytes."""
    fh = open(path, "rb")  # noqa: SIM115 - returned to the caller
    magic = fh.read(2)
    fh.seek(0)
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=fh, mode="rb")
    return fh


class TraceReader:
    """Iterate a trace's records (dicts by default, typed records with `typed=True`).

    `meta` is the first line's object once iteration started (or after `read_meta()`);
    `problems` lists what was wrong (at most MAX_KEPT_PROBLEMS; `problem_count` counts all);
    `counts` counts valid records per type; `on_problem` is called for every problem as found.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_problem: Callable[[Problem], None] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.on_problem = on_problem
        self.meta: dict[str, Any] | None = None
        self.problems: list[Problem] = []
        self.problem_count = 0
        self.counts: Counter[str] = Counter()
        self.lines_read = 0
        self.cleaned = 0  # valid records that broke a limit, reported and read on cleaned
        self._started = False

    def _problem(self, line: int, message: str) -> None:
        self.problem_count += 1
        problem = Problem(line, message)
        if len(self.problems) < MAX_KEPT_PROBLEMS:
            self.problems.append(problem)
        if self.on_problem is not None:
            self.on_problem(problem)

    def read_meta(self) -> dict[str, Any] | None:
        """Read just the meta line (None if the first line is not a valid meta record)."""
        with open_trace_bytes(self.path) as fh:
            first = fh.readline()
        try:
            obj = _loads(first)
        except ValueError:
            return None
        return obj if check_meta(obj) is None else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.dicts()

    def records(self) -> Iterator[Record]:
        """Typed records; records of unknown types are counted and ignored."""
        for obj in self.dicts():
            rec = from_dict(obj)
            if rec is not None:
                yield rec

    def dicts(self) -> Iterator[dict[str, Any]]:
        """Every valid record after the meta line, as its JSON object (unknown keys kept)."""
        if self._started:
            raise RuntimeError("a TraceReader iterates once; make a new one to read again")
        self._started = True
        last_ts = float("-inf")
        lineno = 0
        with open_trace_bytes(self.path) as fh:
            try:
                for raw in fh:
                    lineno += 1
                    self.lines_read = lineno
                    try:
                        obj = _loads(raw)
                    except UnicodeDecodeError as exc:
                        self._problem(lineno, f"not UTF-8: {exc}")
                        continue
                    except json.JSONDecodeError as exc:
                        if not raw.strip():
                            what = "empty line"
                        else:
                            what = f"invalid JSON: {exc.msg} at character {exc.pos + 1}"
                        self._problem(lineno, what)
                        continue
                    except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit integer
                        self._problem(lineno, f"invalid JSON: {exc}"[:300])
                        continue
                    if lineno == 1:
                        self.meta, problem, as_record = read_meta_line(obj)
                        if problem is not None:
                            self._problem(1, problem)
                        if not as_record:
                            continue
                    problem = check_record(obj)
                    if problem is None and obj.get("type") == TYPE_META:
                        problem = "meta record after the first line"
                    if problem is not None:
                        self._problem(lineno, problem)
                        continue
                    ts = obj.get("ts")
                    if type(ts) in (int, float):
                        if ts < last_ts:
                            self._problem(
                                lineno,
                                f"ts {ts!r} is earlier than the previous record's {last_ts!r} "
                                "(records must be in non-decreasing ts order)",
                            )
                            continue
                        last_ts = ts
                    cleaned = clean_record(obj)
                    if cleaned:
                        self.cleaned += 1
                        for message in cleaned:
                            self._problem(lineno, message)
                    self.counts[obj["type"]] += 1
                    yield obj
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                self._problem(lineno + 1, f"compressed stream is damaged or cut short: {exc}")
        if lineno == 0:
            self._problem(1, "empty trace: no meta line")


@dataclass
class ValidationReport:
    path: str
    meta: dict[str, Any] | None
    lines: int
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    cleaned: int = 0

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def records(self) -> int:
        return sum(self.counts.values())


def validate_trace(
    path: str | os.PathLike[str], *, on_problem: Callable[[Problem], None] | None = None
) -> ValidationReport:
    """Read the whole trace, checking every line; constant memory."""
    reader = TraceReader(path, on_problem=on_problem)
    for _ in reader.dicts():
        pass
    return ValidationReport(
        path=reader.path,
        meta=reader.meta,
        lines=reader.lines_read,
        counts=dict(reader.counts),
        problems=list(reader.problems),
        problem_count=reader.problem_count,
        cleaned=reader.cleaned,
    )
