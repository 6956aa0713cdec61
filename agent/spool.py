"""A bounded on-disk spool of opaque batches for the durable transport (docs/design.md §2, issue 5).

The transport appends each encoded batch before sending it and acknowledges it when ingest has
acked it; what is not yet acked survives agent restarts and ingest outages of hours.

Layout: a directory of segment files `<first seq, 20 digits>.seg`, each a run of frames

    magic b"PSB1" | crc32 u32 | seq u64 | length u32 | payload      (little-endian)

with the crc over seq, length and payload, and `state.json` holding what must outlive the
segments: `acked_through` (the highest acknowledged sequence number; acks are cumulative),
`dropped_through`, `dropped_batches`, `dropped_bytes` and `truncations`.

Durability (the fsync policy): every `append` is one `write(2)` to the segment, so a batch is
in the OS page cache when `append` returns and survives `kill -9` of the agent; what the agent
loses on `kill -9` is only what it had not yet appended — at most the current interval, one
second. The segment is fsync'ed at most once per `fsync_interval_s` (default 1 s: at most the
last second lost on a power cut or kernel crash too), and on `sync()`/`close()`. `state.json`
is replaced atomically (write, rename); losing its latest version on a power cut means
re-sending batches that were already acked, which ingest de-duplicates.

Size cap: segments on disk never exceed `max_bytes` after an `append` returns. When a new batch
would go over, whole segments are deleted oldest first — the oldest data goes, never the new —
and every unacked batch deleted that way is counted in `dropped_batches`/`dropped_bytes`
(persisted, so the count survives restarts and can be reported). Segments roll at
`segment_bytes`, so a drop is one `unlink`, not a rewrite.

Dead letter (`DeadLetter`, beside the spool in `<spool dir>/dead-letter/`): a batch ingest
refused (INVALID_ARGUMENT: it would be refused again) is moved out of the spool's flow into its
own files — `<seq>.batch` (the bytes as sent), `<seq>.json` (sequence, agent id, when, the
server's reason) and, when a renderer is given, `<seq>.jsonl` (the batch as a v1 trace, to
inspect with `proof-agent validate`, analyze or send again with `proof replay`) — so it is never
lost and never resent by itself. Capped at `max_batches`/`max_bytes`: the oldest entries go
first, counted in `dead-letter/state.json`.

Crash recovery: on open every segment is scanned; a frame that is cut short or fails its crc
(the tail of a write interrupted by a crash) is truncated away, with everything after it in
that segment, and counted in `truncations`. Sequence numbers continue after the highest ever
used, so a restarted agent never reuses one.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"PSB1"
_HEADER = struct.Struct("<4sIQI")  # magic, crc32, seq, length
_CRC_PART = struct.Struct("<QI")  # seq, length: what the crc covers before the payload
HEADER_SIZE = _HEADER.size
STATE_FILE = "state.json"
SEGMENT_SUFFIX = ".seg"


class SpoolError(Exception):
    """A batch the spool cannot take, or a spool directory it cannot use."""


@dataclass(slots=True)
class _Segment:
    first_seq: int
    path: Path
    size: int  # bytes on disk
    last_seq: int  # highest seq in it (first_seq - 1 when empty)


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    segment: _Segment
    offset: int  # of the payload
    length: int


def _crc(seq: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(_CRC_PART.pack(seq, len(payload)))) & 0xFFFFFFFF


class Spool:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 1 << 30,
        segment_bytes: int | None = None,
        fsync_interval_s: float = 1.0,
    ) -> None:
        if max_bytes < 4 * HEADER_SIZE:
            raise SpoolError(f"max_bytes {max_bytes} is too small")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(min(max_bytes // 16, 64 << 20), 4096)
        if self.segment_bytes > max_bytes:
            raise SpoolError("segment_bytes must not exceed max_bytes")
        self.fsync_interval_s = fsync_interval_s
        self._lock = threading.RLock()
        self._segments: deque[_Segment] = deque()
        self._pending: deque[_Entry] = deque()
        self._fd: int | None = None  # the active (last) segment, open for appending
        self._last_fsync = time.monotonic()
        self._dirty = False
        self.acked_through = 0
        self.dropped_through = 0
        self.dropped_batches = 0
        self.dropped_bytes = 0
        self.truncations = 0
        self._next_seq = 1
        self._load()

    # --- state --------------------------------------------------------------------------------

    def _state_path(self) -> Path:
        return self.directory / STATE_FILE

    def _load(self) -> None:
        path = self._state_path()
        if path.exists():
            try:
                state = json.loads(path.read_text())
                self.acked_through = int(state.get("acked_through", 0))
                self.dropped_through = int(state.get("dropped_through", 0))
                self.dropped_batches = int(state.get("dropped_batches", 0))
                self.dropped_bytes = int(state.get("dropped_bytes", 0))
                self.truncations = int(state.get("truncations", 0))
                self._next_seq = int(state.get("next_seq", 1))
            except (ValueError, TypeError, AttributeError) as exc:
                raise SpoolError(f"{path} is not a spool state file: {exc}") from exc
        done = max(self.acked_through, self.dropped_through)
        self._next_seq = max(self._next_seq, done + 1)
        truncated = False
        for seg_path in sorted(self.directory.glob("*" + SEGMENT_SUFFIX)):
            try:
                first_seq = int(seg_path.stem)
            except ValueError:
                continue  # not ours
            segment, cut = self._scan(seg_path, first_seq, done)
            truncated = truncated or cut
            if segment.last_seq <= done:
                seg_path.unlink()  # fully acked or dropped before a crash deleted it
                continue
            self._segments.append(segment)
            self._next_seq = max(self._next_seq, segment.last_seq + 1)
        if truncated:
            self._save_state()

    def _scan(self, path: Path, first_seq: int, done: int) -> tuple[_Segment, bool]:
        segment = _Segment(first_seq, path, 0, first_seq - 1)
        data = path.read_bytes()
        offset = 0
        end = len(data)
        while offset < end:
            if end - offset < HEADER_SIZE:
                break
            magic, crc, seq, length = _HEADER.unpack_from(data, offset)
            start = offset + HEADER_SIZE
            if magic != MAGIC or start + length > end:
                break
            payload = memoryview(data)[start : start + length]
            if _crc(seq, payload) != crc or seq <= segment.last_seq:
                break
            if seq > done:
                self._pending.append(_Entry(seq, segment, start, length))
            segment.last_seq = seq
            offset = start + length
        cut = offset < end
        if cut:
            with open(path, "r+b") as fh:
                fh.truncate(offset)
                fh.flush()
                os.fsync(fh.fileno())
            self.truncations += 1
        segment.size = offset
        return segment, cut

    def _save_state(self) -> None:
        state = {
            "acked_through": self.acked_through,
            "dropped_through": self.dropped_through,
            "dropped_batches": self.dropped_batches,
            "dropped_bytes": self.dropped_bytes,
            "truncations": self.truncations,
            "next_seq": self._next_seq,
        }
        tmp = self.directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_path())

    # --- appending ----------------------------------------------------------------------------

    def append(self, data: bytes) -> int:
        """Store one batch; returns its sequence number. Drops the oldest segments if full."""
        frame_size = HEADER_SIZE + len(data)
        if frame_size > self.segment_bytes:
            raise SpoolError(
                f"a batch of {len(data)} bytes does not fit a spool segment "
                f"({self.segment_bytes} bytes); split it"
            )
        with self._lock:
            seq = self._next_seq
            active = self._segments[-1] if self._segments else None
            if active is None or self._fd is None or active.size + frame_size > self.segment_bytes:
                active = self._roll(seq)
            self._make_room(frame_size)
            header = _HEADER.pack(MAGIC, _crc(seq, data), seq, len(data))
            os.write(self._fd, header + data)  # type: ignore[arg-type]
            self._pending.append(_Entry(seq, active, active.size + HEADER_SIZE, len(data)))
            active.size += frame_size
            active.last_seq = seq
            self._next_seq = seq + 1
            self._dirty = True
            if time.monotonic() - self._last_fsync >= self.fsync_interval_s:
                self._fsync()
            return seq

    def _roll(self, first_seq: int) -> _Segment:
        self._close_fd()
        path = self.directory / f"{first_seq:020d}{SEGMENT_SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        segment = _Segment(first_seq, path, 0, first_seq - 1)
        self._segments.append(segment)
        return segment

    def _make_room(self, frame_size: int) -> None:
        total = sum(s.size for s in self._segments)
        while total + frame_size > self.max_bytes and len(self._segments) > 1:
            oldest = self._segments.popleft()
            total -= oldest.size
            while self._pending and self._pending[0].segment is oldest:
                entry = self._pending.popleft()
                self.dropped_batches += 1
                self.dropped_bytes += entry.length
            self.dropped_through = max(self.dropped_through, oldest.last_seq)
            # Persist the counts before the data goes, so a crash cannot lose a drop's record.
            self._save_state()
            oldest.path.unlink(missing_ok=True)

    def _fsync(self) -> None:
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
        self._dirty = False
        self._last_fsync = time.monotonic()

    def _close_fd(self) -> None:
        if self._fd is not None:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            os.close(self._fd)
            self._fd = None

    # --- reading and acking -------------------------------------------------------------------

    def peek(self, max_batches: int = 64, *, after: int | None = None) -> list[tuple[int, bytes]]:
        """Up to `max_batches` unacked batches, oldest first (after seq `after` if given)."""
        with self._lock:
            out: list[tuple[int, bytes]] = []
            handles: dict[Path, Any] = {}
            try:
                for entry in self._pending:
                    if after is not None and entry.seq <= after:
                        continue
                    fh = handles.get(entry.segment.path)
                    if fh is None:
                        fh = handles[entry.segment.path] = open(entry.segment.path, "rb")  # noqa: SIM115 - one per segment, all closed below
                    fh.seek(entry.offset)
                    out.append((entry.seq, fh.read(entry.length)))
                    if len(out) >= max_batches:
                        break
            finally:
                for fh in handles.values():
                    fh.close()
            return out

    def ack(self, through_seq: int) -> int:
        """Acknowledge every batch up to and including `through_seq`; returns how many."""
        with self._lock:
            if through_seq <= self.acked_through:
                return 0
            if through_seq >= self._next_seq:
                raise SpoolError(f"ack of seq {through_seq}, never appended")
            acked = 0
            while self._pending and self._pending[0].seq <= through_seq:
                self._pending.popleft()
                acked += 1
            self.acked_through = through_seq
            self._save_state()
            while self._segments and self._segments[0].last_seq <= through_seq:
                segment = self._segments.popleft()
                if not self._segments:
                    self._close_fd()  # the active segment itself is fully acked
                segment.path.unlink(missing_ok=True)
            return acked

    def pop(self) -> tuple[int, bytes] | None:
        """The oldest unacked batch, acknowledged in the same step (for simple consumers)."""
        with self._lock:
            batch = self.peek(1)
            if not batch:
                return None
            self.ack(batch[0][0])
            return batch[0]

    # --- reporting and lifecycle --------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def pending_batches(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return sum(e.length for e in self._pending)

    @property
    def disk_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "pending_batches": self.pending_batches,
                "pending_bytes": self.pending_bytes,
                "disk_bytes": self.disk_bytes,
                "segments": len(self._segments),
                "next_seq": self._next_seq,
                "acked_through": self.acked_through,
                "dropped_batches": self.dropped_batches,
                "dropped_bytes": self.dropped_bytes,
                "truncations": self.truncations,
            }

    def sync(self) -> None:
        """fsync what was appended now (instead of within `fsync_interval_s`)."""
        with self._lock:
            self._fsync()

    def close(self) -> None:
        with self._lock:
            self._close_fd()
            self._save_state()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


DEAD_LETTER_DIR = "dead-letter"


class DeadLetter:
    """Batches ingest refused, each kept with the reason (see the module docstring).

    `directory` None keeps them in memory only (an agent without a spool directory), the
    newest `max_batches`."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        *,
        max_batches: int = 1000,
        max_bytes: int = 256 << 20,
        render: Callable[[Path, bytes, dict[str, Any]], object] | None = None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.render = render
        self._lock = threading.Lock()
        self._memory: deque[tuple[dict[str, Any], bytes]] = deque(maxlen=max_batches)
        self.dropped = 0
        self.added = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            state = self.directory / STATE_FILE
            if state.exists():
                try:
                    loaded = json.loads(state.read_text())
                    self.dropped = int(loaded.get("dropped", 0))
                    self.added = int(loaded.get("added", 0))
                except (ValueError, TypeError, AttributeError):
                    pass

    def _save_state(self) -> None:
        if self.directory is None:
            raise RuntimeError("the spool has no directory")
        tmp = self.directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps({"added": self.added, "dropped": self.dropped}))
        os.replace(tmp, self.directory / STATE_FILE)

    def add(self, sequence: int, data: bytes, reason: str, *, agent_id: str = "") -> Path | None:
        """Keep batch `sequence` with `reason`; returns its `.batch` file (None in memory)."""
        entry = {
            "sequence": sequence,
            "agent_id": agent_id,
            "refused_at": time.time(),
            "reason": reason,
            "bytes": len(data),
        }
        with self._lock:
            self.added += 1
            if self.directory is None:
                if len(self._memory) == self._memory.maxlen:
                    self.dropped += 1
                self._memory.append((entry, data))
                return None
            stem = self.directory / f"{sequence:020d}"
            batch_path = stem.with_suffix(".batch")
            tmp = stem.with_suffix(".batch.tmp")
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, batch_path)
            entry["batch_file"] = batch_path.name
            if self.render is not None:
                trace_path = stem.with_suffix(".jsonl")
                try:
                    self.render(trace_path, data, {"dead_letter": dict(entry)})
                    entry["trace_file"] = trace_path.name
                except Exception as exc:  # the bytes are kept whatever the rendering does
                    entry["trace_error"] = f"{type(exc).__name__}: {exc}"[:300]
            stem.with_suffix(".json").write_text(json.dumps(entry, indent=1) + "\n")
            self._trim()
            self._save_state()
            return batch_path

    def _trim(self) -> None:
        if self.directory is None:
            raise RuntimeError("the spool has no directory")
        batches = sorted(self.directory.glob("*.batch"))
        total = sum(p.stat().st_size for p in batches)
        while batches and (len(batches) > self.max_batches or total > self.max_bytes):
            oldest = batches.pop(0)
            total -= oldest.stat().st_size
            for suffix in (".batch", ".json", ".jsonl"):
                oldest.with_suffix(suffix).unlink(missing_ok=True)
            self.dropped += 1

    def entries(self) -> list[dict[str, Any]]:
        """What is kept, oldest first: each entry's metadata (sequence, reason, files, …)."""
        with self._lock:
            if self.directory is None:
                return [dict(e) for e, _ in self._memory]
            out = []
            for path in sorted(self.directory.glob("*.json")):
                if path.name == STATE_FILE:
                    continue
                try:
                    out.append(json.loads(path.read_text()))
                except ValueError:
                    continue
            return out

    def read(self, sequence: int) -> bytes | None:
        """The bytes of kept batch `sequence`, as sent."""
        with self._lock:
            if self.directory is None:
                return next((d for e, d in self._memory if e["sequence"] == sequence), None)
            path = self.directory / f"{sequence:020d}.batch"
            return path.read_bytes() if path.exists() else None

    def stats(self) -> dict[str, int]:
        entries = self.entries()
        return {
            "batches": len(entries),
            "bytes": sum(int(e.get("bytes", 0)) for e in entries),
            "added": self.added,
            "dropped": self.dropped,
        }
