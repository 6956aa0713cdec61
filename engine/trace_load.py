"""Reading a trace's lines into a `TraceStore` fast (`fast_records`), by the trace reader's rules.

`contract.trace.TraceReader` costs ~10 µs a line, too slow for a 64-GPU, 30-minute trace (5.4 M
lines). This reader applies the same rules (docs/design.md §5; malformed lines reported with
their line numbers and skipped, over-limit identities cleaned) on 8 MiB batches of lines, two
ways:

- **General**: one orjson call decodes the batch (a batch with a bad line falls back to line by
  line, to name it); every record is a dict. A sample — 95% of a trace — is checked inline (ts,
  name, value, order); its identity keys are checked in full by `check_record` the first time
  its series is seen (same series, same identity values), and every other record type always
  is.
- **Columns**: a sample line as the trace writer formats it
  (`{"type":"sample","ts":T,"name":"N","value":V,…identity…}`) whose bytes after `ts` and
  `value` are exactly those of a line the general way already accepted into a series is the
  same series again: one regular expression over the batch splits every such line into its
  series' bytes, `ts` and `value`, and numpy appends them to their series; no dict per sample.
  A batch takes this way only when every sample line in it is of an accepted series and the
  whole batch is in ts order; the other lines of the batch (logs, events, …) are decoded with
  one orjson call and read the general way. Anything else — a series seen for the first time,
  a line out of order, a bad line — sends the whole batch the general way, so what is reported
  and what is kept never depends on which way a batch took.

Measured on a 64-GPU, 30-minute simulated trace: docs/scaling.md, "proof analyze at 64 GPUs".
"""

from __future__ import annotations

import itertools
import queue
import re
import threading
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator
from itertools import compress
from operator import itemgetter
from typing import Any

import numpy as np

from contract.trace import Problem
from contract.trace.reader import GZIP_MAGIC
from contract.trace.records import TYPE_META, check_record, clean_record, read_meta_line

try:
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a base dependency
    from json import loads as _loads  # type: ignore[assignment]

CHUNK = 8 << 20  # bytes of uncompressed trace parsed per batch
_READ = 256 << 10  # compressed bytes decompressed per zlib call

# Every line of a batch, one match each: a sample line as the trace writer formats it, as its
# groups (ts, name, value, the rest of the line), or any other line as the fifth group. Loose on
# purpose (one that checked JSON numbers cost twice as much): the numbers are checked when the
# batch's are decoded together, the rest by its bytes being those of a line already decoded
# (`_Reader.learn`).
_LINES = re.compile(
    rb'^(?:\{"type":"sample","ts":([^,\n]*),"name":("[^"\\\n]*"),"value":([^,}\n]*)(.*)|(.*))$',
    re.MULTILINE,
)
_NUMBER_BYTES = b"0123456789.eE+-,"
# Top-level keys that, repeated in the rest of a line, would override what the groups say.
_OWN_KEYS = frozenset(("type", "ts", "name", "value"))

Col = tuple[list[float], list[float]]
_NUMBER = (int, float)
_G0, _G2 = itemgetter(0), itemgetter(2)
_SERIES = itemgetter(1, 3)  # a sample line's series: (name, the rest of the line)


def _numbers(fields: Iterable[bytes], n: int) -> Any:
    """`n` JSON numbers (the ts or the values of a batch's samples) as float64, decoded by one
    orjson call — the same decoding as a whole line's — or None when any field is not a
    number."""
    joined = b",".join(fields)
    if joined.translate(None, _NUMBER_BYTES):
        return None  # a character no JSON number has (true, a string, a space, …)
    try:
        decoded = _loads(b"[" + joined + b"]")
    except ValueError:
        return None  # an empty field, "1-2", "1e999" (orjson refuses what is not finite)
    if len(decoded) != n:
        return None
    return np.array(decoded, dtype=np.float64)


def data_lines(buf: bytes) -> int:
    return buf.count(b"\n")


def _gzip_pieces(raw: Any) -> Iterator[tuple[bytes, Exception | None]]:
    """The decompressed bytes of a gzip stream (every member, zero padding between them
    skipped, as `gzip.GzipFile` reads), in pieces of at most CHUNK bytes; a last
    (b"", error) when the stream is damaged or cut short. zlib checks each member's CRC and
    length. One zlib call per 256 KiB read (GzipFile makes one, and a crc32 call, per 8 KiB)."""
    d = zlib.decompressobj(wbits=31)
    fresh = True  # `d` has been given nothing yet
    while True:
        buf = raw.read(_READ)
        if not buf:
            if not fresh:
                yield (
                    b"",
                    EOFError("Compressed file ended before the end-of-stream marker was reached"),
                )
            return
        while buf:
            if fresh:
                buf = buf.lstrip(b"\x00")
                if not buf:
                    break
                fresh = False
            before = d.copy()
            try:
                out = d.decompress(buf, CHUNK)
            except zlib.error:
                yield from _up_to_damage(before, buf)
                return
            if out:
                yield out, None
            if d.eof:
                buf = d.unused_data
                d, fresh = zlib.decompressobj(wbits=31), True
            else:
                buf = d.unconsumed_tail


def _up_to_damage(d: Any, buf: bytes) -> Iterator[tuple[bytes, Exception | None]]:
    """What `buf` decompresses to before the damage in it, 8 KiB of input at a time (as
    GzipFile reads, so the same lines before the damage are kept), then the damage."""
    for at in range(0, len(buf), 8192):
        try:
            out = d.decompress(buf[at : at + 8192])
        except zlib.error as exc:
            yield b"", exc
            return
        if out:
            yield out, None
    # The damage is in a later member of `buf` (this one ended first): its lines before the
    # damage are not recovered.
    yield b"", zlib.error("invalid compressed data in a later gzip member")


def read_pieces(raw: Any) -> Iterator[tuple[bytes, Exception | None]]:
    """A trace file's uncompressed bytes in pieces (gzip or plain by its first two bytes)."""
    magic = raw.read(2)
    raw.seek(0)
    if magic == GZIP_MAGIC:
        yield from _gzip_pieces(raw)
        return
    while part := raw.read(CHUNK):
        yield part, None


_DONE = object()


def _ahead(pieces: Iterator[Any], depth: int = 3) -> Generator[Any, None, None]:
    """`pieces`, produced by a thread up to `depth` ahead: zlib and file reads release the
    GIL, so decompressing the next batch overlaps with parsing this one (wall time only; a
    second core's worth at most). Stops the thread when the consumer stops early."""
    box: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        """Hand `item` over; False when the consumer has stopped (never blocks past that)."""
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in pieces:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # re-raised in the consumer
            put(exc)

    worker = threading.Thread(target=run, name="trace-read", daemon=True)
    worker.start()
    try:
        while (item := box.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()


def _order_problem(lineno: int, ts: Any, last_ts: Any) -> Problem:
    return Problem(
        lineno,
        f"ts {ts!r} is earlier than the previous record's {last_ts!r} (records must be in "
        "non-decreasing ts order)",
    )


class _Reader:
    """One trace file's state across its batches: the line number, the last ts accepted, the
    series over the limits, and the series bytes the columns way may append to."""

    def __init__(
        self,
        set_meta: Callable[[dict[str, Any]], None],
        problem: Callable[[Problem], None],
        cols: dict[tuple[Any, ...], Col],
    ) -> None:
        self.set_meta = set_meta
        self.problem = problem
        self.cols = cols
        self.lineno = 0
        self.last_ts: Any = float("-inf")
        self.dirty: set[Any] = set()  # sample series whose identity broke a limit
        # A series' bytes (name, the line after value) -> its index in `series`.
        self.known: dict[tuple[bytes, bytes], int] = {}
        self.series: list[Col] = []
        self.series_index: dict[int, int] = {}  # id(col) -> index in `series`

    # --- the columns way ----------------------------------------------------------------
    def take_columns(self, found: list[Any]) -> list[dict[str, Any]] | None:
        """Given a batch's `_LINES` groups, append its samples to their series when every
        sample line is of a known series and the batch is in ts order, and read its other
        records the general way (one orjson call for them all): the records kept. None
        (nothing read) when the batch does not qualify."""
        n = len(found)
        is_sample = np.fromiter(map(bool, map(_G0, found)), bool, n)
        samples = list(compress(found, is_sample))
        n_samples = len(samples)
        which = list(map(self.known.get, map(_SERIES, samples)))
        if None in which:
            return None  # a series not yet accepted (or one the columns way does not read)
        sample_ts = _numbers(map(_G0, samples), n_samples)
        values = _numbers(map(_G2, samples), n_samples)
        if sample_ts is None or values is None:
            return None
        other_at = np.flatnonzero(~is_sample)
        others: list[Any] = []
        if len(other_at):
            try:
                others = _loads(b"[" + b",".join([found[i][4] for i in other_at]) + b"]")
            except ValueError:
                return None
            if len(others) != len(other_at):
                return None
        other_ts = np.full(len(others), np.nan)
        for j, obj in enumerate(others):
            if type(obj) is not dict or obj.get("type") == "sample":
                return None  # a sample the columns way does not read; the general way names it
            ts = obj.get("ts")
            if type(ts) in _NUMBER:
                other_ts[j] = ts
        every = np.empty(n)
        every[is_sample] = sample_ts
        every[other_at] = other_ts
        timed = every[~np.isnan(every)]
        if len(timed) and (timed[0] < self.last_ts or bool(np.any(timed[1:] < timed[:-1]))):
            return None  # the general way reports the line out of order
        kept: list[dict[str, Any]] = []
        last_kept = -1  # the line of the batch's last kept record
        for i, obj in zip(other_at.tolist(), others, strict=True):
            if self.other(self.lineno + i + 1, obj):
                kept.append(obj)
                last_kept = i
        self.lineno += n
        if n_samples:
            ids = np.array(which, dtype=np.int64)
            order = np.argsort(ids, kind="stable")
            ids, ts_list, val_list = ids[order], sample_ts[order].tolist(), values[order].tolist()
            cuts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), n_samples]
            for a, b in itertools.pairwise(cuts):
                col = self.series[int(ids[a])]
                col[0].extend(ts_list[a:b])
                col[1].extend(val_list[a:b])
            # ts order held over the whole batch: the previous record of the next line is its
            # last sample or its last kept record, whichever comes later (ts as decoded)
            last_sample = int(np.flatnonzero(is_sample)[-1])
            if last_sample > last_kept:
                self.last_ts = _loads(samples[-1][0])
        return kept

    def learn(self, col: Col, g: tuple[bytes, ...], obj: dict[str, Any]) -> None:
        """Let the columns way append lines of this series' bytes to `col`: only when the line
        decoded to exactly what its groups say, and the rest of it repeats none of the keys
        the groups stand for (orjson keeps the last of a repeated key)."""
        key = (g[1], g[3])
        if key in self.known:
            return
        try:
            same = (
                _loads(g[0]) == obj["ts"]
                and _loads(g[2]) == obj["value"]
                and _loads(g[1]) == obj["name"]
            )
            rest = _loads(b"{" + g[3][1:]) if g[3] != b"}" else {}
        except ValueError:
            return
        if not same or type(rest) is not dict or not _OWN_KEYS.isdisjoint(rest):
            return
        at = self.series_index.get(id(col))
        if at is None:
            at = self.series_index[id(col)] = len(self.series)
            self.series.append(col)
        self.known[key] = at

    # --- the general way ----------------------------------------------------------------
    def other(self, lineno: int, obj: Any) -> bool:
        """A record that is not a sample (or one the sample path sent on): checked in full,
        cleaned to the limits, order-checked; True when it is kept."""
        why = check_record(obj)
        if why is None and obj.get("type") == TYPE_META:
            why = "meta record after the first line"
        if why is not None:
            self.problem(Problem(lineno, why))
            return False
        # The limits agent and ingest share (contract/limits.py): an over-long line, a NUL in a
        # label, an over-long id are cleaned the way ingest would store them, and named.
        for msg in clean_record(obj):
            self.problem(Problem(lineno, msg))
        ts = obj.get("ts")
        if type(ts) in _NUMBER:
            if ts < self.last_ts:
                self.problem(_order_problem(lineno, ts, self.last_ts))
                return False
            self.last_ts = ts
        return True

    def general(self, lines: list[bytes], found: list[Any] | None) -> Iterator[dict[str, Any]]:
        """Every line of a batch decoded to a dict; `found` (the batch's `_LINES` groups, one
        per line) lets accepted series be learnt for the columns way."""
        problem, cols, dirty = self.problem, self.cols, self.dirty
        try:
            objs: list[Any] = _loads(b"[" + b",".join(lines) + b"]")
            if len(objs) != len(lines):
                raise ValueError("line count")
        except ValueError:
            objs = []
            for i, line in enumerate(lines):
                try:
                    objs.append(_loads(line))
                except ValueError as exc:
                    what = "empty line" if not line.strip() else f"invalid JSON: {exc}"[:300]
                    problem(Problem(self.lineno + i + 1, what))
                    objs.append(None)
        for i, obj in enumerate(objs):
            self.lineno += 1
            lineno = self.lineno
            if obj is None:
                continue
            if lineno == 1:
                meta, why, as_record = read_meta_line(obj)
                self.set_meta(meta or {})
                if why is not None:
                    problem(Problem(1, why))
                if not as_record:
                    continue
            if type(obj) is dict and obj.get("type") == "sample":
                ts: Any = obj.get("ts")
                value: Any = obj.get("value")
                if type(ts) in _NUMBER and type(value) in _NUMBER and type(obj.get("name")) is str:
                    labels = obj.get("labels")
                    try:
                        key: Any = (
                            obj["name"],
                            obj.get("node"),
                            obj.get("gpu"),
                            obj.get("gpu_index"),
                            obj.get("pid"),
                            obj.get("job"),
                            obj.get("rank"),
                            tuple(labels.items()) if type(labels) is dict else labels,
                        )
                        col = cols.get(key)
                    except TypeError:
                        key, col = None, None
                    if key in dirty:  # a series over the limits: cleaned like its first
                        clean_record(obj)
                        col = None
                    elif col is None:
                        why = check_record(obj)
                        if why is not None:
                            problem(Problem(lineno, why))
                            continue
                        fixed = clean_record(obj)
                        if fixed:
                            # Reported once per series; its samples take the general path
                            # under the cleaned identity, as ingest would store them.
                            for msg in fixed:
                                problem(Problem(lineno, msg))
                            dirty.add(key)
                    if ts < self.last_ts:
                        problem(_order_problem(lineno, ts, self.last_ts))
                        continue
                    self.last_ts = ts
                    if key in dirty:
                        yield obj
                        continue
                    if col is None:
                        if key is None:
                            problem(Problem(lineno, "sample identity values must be scalars"))
                            continue
                        col = cols[key] = ([], [])
                    col[0].append(ts)
                    col[1].append(value)
                    if found is not None and found[i][0]:
                        self.learn(col, found[i], obj)
                    continue
            if self.other(lineno, obj):
                yield obj


def fast_records(
    raw: Any,
    set_meta: Callable[[dict[str, Any]], None],
    problem: Callable[[Problem], None],
    cols: dict[tuple[Any, ...], Col],
) -> Iterator[dict[str, Any]]:
    """Valid records of a trace file (`raw`: opened binary, gzip or plain) other than the
    samples appended to `cols` (series identity as decoded -> (ts list, value list)), read in
    8 MiB batches; malformed lines reported and skipped. `set_meta` gets the first line's
    meta. A stream damaged or cut short is reported once, after its last complete line."""
    reader = _Reader(set_meta, problem, cols)
    pieces = _ahead(read_pieces(raw))
    try:
        yield from _batches(reader, pieces, problem)
    finally:
        pieces.close()
    if reader.lineno == 0:
        problem(Problem(1, "empty trace: no meta line"))


def _batches(
    reader: _Reader, pieces: Iterator[Any], problem: Callable[[Problem], None]
) -> Iterator[dict[str, Any]]:
    tail = b""
    ended = False
    while not ended:
        parts = [tail]
        size = len(tail)
        while size < CHUNK:
            piece, damage = next(pieces, (None, None))
            if piece is None:
                ended = True
                break
            if damage is not None:
                ended = True
                problem(
                    Problem(
                        reader.lineno + sum(data_lines(p) for p in parts) + 1,
                        f"compressed stream is damaged or cut short: {damage}",
                    )
                )
                break
            parts.append(piece)
            size += len(piece)
        data = b"".join(parts)
        if not data:
            break
        # The batch is data[:end], whole lines; the rest is the start of a line whose end is
        # in the next batch — at the end of the file, a last line without a newline, read too.
        end = data.rfind(b"\n") + 1
        if ended:
            end = len(data)
        tail = data[end:]
        if not end:
            continue
        body = end - 1 if data[end - 1] == 10 else end  # without the last newline
        n = data.count(b"\n", 0, body) + 1
        found: list[Any] | None = _LINES.findall(data, 0, body)
        if found is not None and len(found) != n:
            found = None  # cannot be (one match a line), but then the general way only
        if found is not None and reader.lineno > 0:
            kept = reader.take_columns(found)
            if kept is not None:
                yield from kept
                continue
        lines = data[:body].split(b"\n")
        yield from reader.general(lines, found)
