"""Streaming trace writer (docs/design.md §5): JSON Lines, gzip when the path ends in `.gz`.

Two ways in:
- `write(record)` for one typed record or dict (validated; ~2-4 µs each);
- `write_samples(ts, name, values, columns)` for many samples of one signal at one instant
  (e.g. one value per GPU of a fleet). The identity part of every row is formatted once into a
  %-template kept on the `SampleColumns` object, so a call costs one `%` per value and one
  `write` — this is what lets the simulator write millions of samples in seconds.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from contract.trace.records import (
    _IDENTITY_ORDER,
    FORMAT,
    TYPE_META,
    TYPE_SAMPLE,
    VERSION,
    _Base,
    check_record,
)

if TYPE_CHECKING:
    import numpy as np

# numpy is not imported with this module: the agent writes traces (`record`, the dead letter)
# through write(), and numpy is ~19 MiB of its RSS (docs/agent.md, issue 17). Its scalars are
# numbers.Real / numbers.Integral (numpy registers them), and write_samples, which takes its
# arrays, imports it there (loaded already when the caller holds an array).

_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


class TraceError(ValueError):
    """A record that cannot be written into a valid trace."""


class TraceOrderError(TraceError):
    """A record earlier than the one written before it (traces are in non-decreasing ts)."""


def _fmt_ts(ts: float) -> str:
    if type(ts) is not float:
        if isinstance(ts, bool) or not isinstance(ts, numbers.Real):
            raise TraceError(f"ts must be a number of seconds since the epoch, got {ts!r}")
        ts = float(ts)
    if not math.isfinite(ts):
        raise TraceError(f"ts must be finite, got {ts!r}")
    return repr(ts)


def _is_column(value: Any) -> bool:
    """One value per row: a sequence (not a string) or a numpy array (a dtype and a length;
    numpy's scalars have no length), told apart without importing numpy."""
    if isinstance(value, str | int):
        return False
    return isinstance(value, Sequence) or (hasattr(value, "dtype") and hasattr(value, "__len__"))


def _plain(value: Any) -> Any:
    """A numpy scalar as its Python value (JSON takes no np.int64); anything else as it is."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


class SampleColumns:
    """The identity of the rows of a bulk sample write, formatted once, reused every call.

    Each identity argument is either one value for every row or a sequence with one value per
    row (None = key absent on that row). `labels` is one dict for all rows or one per row.
    """

    __slots__ = ("_suffixes", "_templates", "n")

    def __init__(
        self,
        n: int,
        *,
        labels: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None,
        extra: Mapping[str, Any] | None = None,
        **identity: Any,
    ) -> None:
        unknown = set(identity) - set(_IDENTITY_ORDER)
        if unknown:
            raise TraceError(f"unknown identity columns {sorted(unknown)}")
        clash = set(extra or ()) & {"type", "ts", "name", "value", "labels", *_IDENTITY_ORDER}
        if clash:
            raise TraceError(f"extra keys {sorted(clash)} would duplicate a sample's own keys")
        self.n = n
        columns: dict[str, Sequence[Any]] = {}
        for key in _IDENTITY_ORDER:
            col = identity.get(key)
            if col is None:
                continue
            if not _is_column(col):
                col = [col] * n
            if len(col) != n:
                raise TraceError(f"identity column {key!r} has {len(col)} rows, expected {n}")
            columns[key] = [_plain(c) for c in col]
        if labels is None or isinstance(labels, Mapping):
            label_rows: Sequence[Mapping[str, str] | None] = [labels] * n
        else:
            label_rows = labels
            if len(label_rows) != n:
                raise TraceError(f"labels has {len(label_rows)} rows, expected {n}")
        suffixes = []
        for i in range(n):
            row: dict[str, Any] = {}
            for key, col in columns.items():
                if col[i] is not None:
                    row[key] = col[i]
            if label_rows[i]:
                row["labels"] = dict(label_rows[i])  # type: ignore[arg-type]
            if extra:
                for k, v in extra.items():
                    row.setdefault(k, v)
            problem = check_record({"type": TYPE_SAMPLE, "ts": 0.0, "name": "x", "value": 0, **row})
            if problem:
                raise TraceError(f"row {i}: {problem}")
            body = _dumps(row)[1:]  # '"node":"n1",...}' or '}' when empty
            suffix = ("," + body if len(body) > 1 else body) + "\n"
            suffixes.append(suffix.replace("%", "%%"))
        self._suffixes: list[str] = suffixes
        self._templates: dict[str, list[str]] = {}

    def templates(self, name: str) -> list[str]:
        """Per-row '%s'-templates (ts, value) for samples of `name`."""
        found = self._templates.get(name)
        if found is None:
            if type(name) is not str or not name:
                raise TraceError(f"sample name must be a non-empty string, got {name!r}")
            head = ('{"type":"sample","ts":%s,"name":' + _dumps(name).replace("%", "%%")) + (
                ',"value":%s'
            )
            found = [head + s for s in self._suffixes]
            self._templates[name] = found
        return found


class TraceWriter:
    """Writes a v1 trace: the meta line first, then records in non-decreasing `ts` order.

    `path` ending in `.gz` is gzip-compressed (level `compresslevel`; 1 keeps the simulator's
    multi-million-record traces fast, at ~20% more bytes than level 6). A binary file object may
    be passed instead of a path (`gzip_compress` then says whether to compress).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | IO[bytes],
        meta: Mapping[str, Any] | None = None,
        *,
        truth: Any = None,
        gzip_compress: bool | None = None,
        compresslevel: int = 1,
    ) -> None:
        meta_line: dict[str, Any] = {"type": TYPE_META, "format": FORMAT, "version": VERSION}
        for key, value in (meta or {}).items():
            if key in meta_line and meta_line[key] != value:
                raise TraceError(f"meta {key!r} is fixed to {meta_line[key]!r}, got {value!r}")
            meta_line[key] = value
        if truth is not None:
            meta_line["truth"] = truth
        self.meta = meta_line
        self.path: str | None
        raw: IO[bytes]
        if isinstance(path, (str, os.PathLike)):
            self.path = os.fspath(path)
            raw = open(self.path, "wb")  # noqa: SIM115 - closed in close()
            self._owns_raw = True
        else:
            self.path = None
            raw = path
            self._owns_raw = False
        if gzip_compress is None:
            gzip_compress = self.path is not None and self.path.endswith(".gz")
        self._raw = raw
        self._gz: gzip.GzipFile | None = None
        sink: IO[bytes] | gzip.GzipFile = raw
        if gzip_compress:
            self._gz = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel)
            sink = self._gz
        self._fh = io.TextIOWrapper(sink, encoding="utf-8", newline="\n", write_through=False)
        self._last_ts = -math.inf
        self.records_written = 0
        self.closed = False
        try:
            self._fh.write(_dumps(meta_line) + "\n")
        except (TypeError, ValueError) as exc:
            self.close()
            raise TraceError(f"meta is not JSON-serialisable: {exc}") from exc

    # --- writing ----------------------------------------------------------------------------

    def _advance(self, ts: float) -> None:
        if ts < self._last_ts:
            raise TraceOrderError(
                f"record ts={ts!r} is earlier than the previous record's ts={self._last_ts!r}; "
                "trace records must be written in non-decreasing ts order"
            )
        self._last_ts = ts

    def write(self, record: _Base | Mapping[str, Any]) -> None:
        """Write one record (a typed record or a trace dict); raises TraceError if invalid."""
        if isinstance(record, _Base):
            obj: Mapping[str, Any] = record.to_dict()
        else:
            obj = record if type(record) is dict else dict(record)
        if obj.get("type") == TYPE_META:
            raise TraceError("the meta record is written once, by the constructor")
        problem = check_record(obj)
        if problem is not None:
            raise TraceError(problem)
        ts = obj.get("ts")
        if type(ts) not in (int, float):
            raise TraceError(f"record has no numeric 'ts': {obj!r}"[:200])
        self._advance(float(ts))  # type: ignore[arg-type]
        try:
            line = _dumps(obj)
        except (TypeError, ValueError) as exc:
            raise TraceError(f"record is not JSON-serialisable: {exc}") from exc
        self._fh.write(line + "\n")
        self.records_written += 1

    def write_many(self, records: Iterable[_Base | Mapping[str, Any]]) -> None:
        for record in records:
            self.write(record)

    def write_samples(
        self, ts: float, name: str, values: np.ndarray | Sequence[float], columns: SampleColumns
    ) -> None:
        """Write `len(values)` samples of `name` at `ts`, row i keyed by `columns` row i.

        Values must be finite; integer arrays are written as JSON integers.
        """
        import numpy as np  # see the note at the top: loaded already by any caller with arrays

        ts_s = _fmt_ts(ts)
        arr = np.asarray(values)
        if arr.ndim != 1 or arr.shape[0] != columns.n:
            raise TraceError(f"{name}: got {arr.shape} values for {columns.n} rows")
        kind = arr.dtype.kind
        if kind == "f":
            if not np.isfinite(arr).all():
                bad = int(np.flatnonzero(~np.isfinite(arr))[0])
                raise TraceError(f"{name}: value of row {bad} is {arr[bad]!r}; must be finite")
        elif kind == "b":
            arr = arr.astype(np.int64)
        elif kind not in "iu":
            raise TraceError(f"{name}: values must be numeric, got dtype {arr.dtype}")
        templates = columns.templates(name)
        self._advance(float(ts_s))
        vals = arr.tolist()
        self._fh.write("".join([t % (ts_s, v) for t, v in zip(templates, vals, strict=True)]))
        self.records_written += len(vals)

    # --- lifecycle --------------------------------------------------------------------------

    def flush(self) -> None:
        """Push what was written to the OS (a gzip sync point; the stream stays readable)."""
        if self.closed:
            return
        self._fh.flush()
        if self._gz is not None:
            self._gz.flush()
        self._raw.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._fh.flush()
        self._fh.detach()
        if self._gz is not None:
            self._gz.close()
        if self._owns_raw:
            self._raw.close()
        else:
            self._raw.flush()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
