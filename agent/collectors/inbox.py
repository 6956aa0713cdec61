"""The agent's inbox: trace files that `proof-agent exec` writes while a job runs.

`proof-agent exec --inbox DIR` (default /var/lib/proof-agent/inbox) writes one plain `.jsonl`
trace per job command into DIR, flushed every second. This collector tails each of them and
passes their records on, so a job's captured output is shipped with everything else the agent
collects. A file is deleted once its `exit` record has been read, or when it has not grown for
`stale_after_s` (its `exec` was killed before it could finish). Invalid lines are counted and
skipped, never fatal.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.trace.records import check_record

log = logging.getLogger(__name__)
Record = dict[str, Any]


@dataclass
class _Tail:
    offset: int = 0
    partial: bytes = b""
    finished: bool = False


class InboxCollector:
    name = "exec_inbox"

    def __init__(
        self,
        inbox_dir: str | os.PathLike[str],
        *,
        max_bytes_per_collect: int = 8 * 1024 * 1024,
        stale_after_s: float = 3600.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.inbox = Path(inbox_dir)
        self.max_bytes = max_bytes_per_collect
        self.stale_after_s = stale_after_s
        self.wall_clock = wall_clock
        self.invalid_lines = 0
        self._tails: dict[Path, _Tail] = {}
        self._warned = False

    def collect(self, now: float) -> list[Record]:
        out: list[Record] = []
        try:
            paths = sorted(self.inbox.glob("*.jsonl"))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("exec inbox %s unreadable: %s", self.inbox, exc)
            return out
        budget = self.max_bytes
        for path in paths:
            if budget <= 0:
                break
            tail = self._tails.setdefault(path, _Tail())
            budget -= self._read(path, tail, budget, out)
            if tail.finished and not tail.partial:
                self._remove(path)
            else:
                self._remove_if_stale(path, tail)
        for gone in [p for p in self._tails if not p.exists()]:
            del self._tails[gone]
        return out

    def _read(self, path: Path, tail: _Tail, budget: int, out: list[Record]) -> int:
        try:
            with path.open("rb") as fh:
                fh.seek(tail.offset)
                data = fh.read(budget)
        except OSError:
            return 0
        tail.offset += len(data)
        data = tail.partial + data
        lines = data.split(b"\n")
        tail.partial = lines.pop()  # an unfinished last line waits for the rest
        for raw in lines:
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                self._invalid(path, "not JSON")
                continue
            if isinstance(rec, dict) and rec.get("type") == "meta":
                continue
            problem = check_record(rec)
            if problem is not None:
                self._invalid(path, problem)
                continue
            out.append(rec)
            if rec.get("type") == "exit":
                tail.finished = True
        return len(data)

    def _invalid(self, path: Path, why: str) -> None:
        self.invalid_lines += 1
        if self.invalid_lines <= 10:
            log.warning("exec inbox %s: skipped a line: %s", path.name, why)

    def _remove_if_stale(self, path: Path, tail: _Tail) -> None:
        try:
            age = self.wall_clock() - path.stat().st_mtime
        except OSError:
            return
        if age > self.stale_after_s:
            log.info("exec inbox %s: no exit record and idle %.0f s; removed", path.name, age)
            self._remove(path)

    def _remove(self, path: Path) -> None:
        try:
            path.unlink()
        except OSError as exc:
            log.warning("exec inbox: cannot remove %s: %s", path, exc)
        self._tails.pop(path, None)
