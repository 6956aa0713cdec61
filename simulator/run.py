"""`SimRun`: a simulated trace held as columns, streamed out as trace v1 records.

A scenario builder fills a SimRun with
- sample blocks: one signal for a set of rows (GPUs, processes, ports, mounts) over a range of
  sample instants, as a 2-D array — the bulk of a trace, written with the vectorised
  `TraceWriter.write_samples`;
- discrete records (job, process, exit, log, event) as dicts, at any time.
`records()` and `write()` merge both in non-decreasing `ts` order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import signals
from contract.trace import SampleColumns, TraceWriter

Identity = Mapping[str, Any]

# Sources an agent may be unable to read on a real node, and what goes missing without them:
# (sample-name prefixes, record types).
WITHHOLDABLE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ebpf": (
        (signals.CUDA_PREFIX, signals.NCCL_PREFIX),
        (),
    ),  # no BPF permission / unsupported kernel
    "dcgm_prof": ((signals.DCGM_PROF_PREFIX,), ()),  # no DCGM profiling (NVML-only node)
    "logs": ((), ("log",)),  # job stdout not captured
    "ib": ((signals.IB_PREFIX,), ()),  # no InfiniBand counters readable
    "storage": ((signals.STORAGE_PREFIX,), ()),
    "kernel_log": ((), ("event",)),  # no kmsg access: no XID / throttle / link events
}


@dataclass
class _Block:
    name: str
    values: np.ndarray  # (n_instants, n_rows), time-major so a column per instant is contiguous
    valid: np.ndarray | None  # same shape, False = no reading at that instant
    rows: list[dict[str, Any]]  # identity (and labels) per row
    start: int  # first sample index covered
    _columns: dict[bytes, SampleColumns] = field(default_factory=dict)

    def columns(self, mask: np.ndarray | None) -> SampleColumns:
        key = b"" if mask is None else np.packbits(mask).tobytes()
        found = self._columns.get(key)
        if found is None:
            rows = (
                self.rows
                if mask is None
                else [r for r, m in zip(self.rows, mask, strict=True) if m]
            )
            ident: dict[str, list[Any]] = {}
            for k in {k for r in rows for k in r if k != "labels"}:
                ident[k] = [r.get(k) for r in rows]
            labels = [r.get("labels") for r in rows]
            found = SampleColumns(len(rows), labels=labels, **ident)  # type: ignore[arg-type]
            self._columns[key] = found
        return found


class SimRun:
    """One simulated trace. `meta` is the trace's meta line (with `truth`)."""

    def __init__(
        self, meta: dict[str, Any], *, start_ts: float, n_samples: int, interval_s: float = 1.0
    ) -> None:
        self.meta = meta
        self.start_ts = float(start_ts)
        self.n_samples = int(n_samples)
        self.interval_s = float(interval_s)
        self.ts = self.start_ts + self.interval_s * np.arange(self.n_samples)
        self._blocks: list[_Block] = []
        self._discrete: list[dict[str, Any]] = []
        # Instants at which the agent recorded nothing (it stalled), and sources it lacked.
        self.stalled: set[int] = set()
        self._withheld_prefixes: tuple[str, ...] = ()
        self._withheld_types: frozenset[str] = frozenset()

    def withhold(self, sources: Sequence[str]) -> None:
        """Record as an agent that cannot read `sources` would (see `WITHHOLDABLE`)."""
        unknown = [src for src in sources if src not in WITHHOLDABLE]
        if unknown:
            raise ValueError(
                f"unknown source(s) {', '.join(map(repr, unknown))}; known: "
                + ", ".join(sorted(WITHHOLDABLE))
            )
        prefixes = tuple(p for src in sources for p in WITHHOLDABLE[src][0])
        types = frozenset(t for src in sources for t in WITHHOLDABLE[src][1])
        self._withheld_prefixes += prefixes
        self._withheld_types |= types
        missing = self.meta.setdefault("missing_sources", [])
        missing.extend(src for src in sources if src not in missing)

    def _withheld(self, name: str) -> bool:
        return bool(self._withheld_prefixes) and name.startswith(self._withheld_prefixes)

    # --- building ---------------------------------------------------------------------------

    def add_samples(
        self,
        name: str,
        values: np.ndarray,
        rows: Sequence[Identity],
        *,
        start: int = 0,
        valid: np.ndarray | None = None,
    ) -> None:
        """Samples of `name`: `values[r, i]` for row `rows[r]` at instant `start + i`.

        A row is an identity dict (`node`, `gpu`, `gpu_index`, `pid`, `job`, `rank`, …) with an
        optional `labels` dict. NaN values (float arrays) and `valid == False` are skipped.
        """
        arr = np.asarray(values)
        if arr.ndim != 2 or arr.shape[0] != len(rows):
            raise ValueError(f"{name}: values {arr.shape} do not match {len(rows)} rows")
        if start < 0 or start + arr.shape[1] > self.n_samples:
            raise ValueError(f"{name}: instants {start}..{start + arr.shape[1]} outside the run")
        if arr.shape[1] == 0 or arr.shape[0] == 0:
            return
        mask = None if valid is None else np.asarray(valid, dtype=bool)
        if arr.dtype.kind == "f":
            finite = np.isfinite(arr)
            mask = finite if mask is None else (mask & finite)
            if not finite.all():
                arr = np.where(finite, arr, 0.0)
        if mask is not None and mask.all():
            mask = None
        self._blocks.append(
            _Block(
                name=name,
                values=np.ascontiguousarray(arr.T),
                valid=None if mask is None else np.ascontiguousarray(mask.T),
                rows=[dict(r) for r in rows],
                start=start,
            )
        )

    @property
    def end_ts(self) -> float:
        """End of the trace window: nothing at or after it is recorded."""
        return self.start_ts + self.interval_s * self.n_samples

    def add(self, record: dict[str, Any]) -> None:
        """A discrete record (job, process, exit, log, event) with its `ts`; a record outside
        the trace window (before the recording started or after it stopped) is dropped."""
        if self.start_ts <= record["ts"] < self.end_ts:
            self._discrete.append(record)

    # --- reading ----------------------------------------------------------------------------

    def _sorted_discrete(self) -> list[dict[str, Any]]:
        # Stable sort: records at the same ts keep the order they were added in.
        kept = [
            r
            for r in self._discrete
            if r["type"] not in self._withheld_types
            and not (r["type"] == "sample" and self._withheld(r["name"]))
        ]
        return sorted(kept, key=lambda r: r["ts"])

    def _active_blocks(self) -> list[list[_Block]]:
        per_instant: list[list[_Block]] = [[] for _ in range(self.n_samples)]
        for b in self._blocks:
            if self._withheld(b.name):
                continue
            for i in range(b.start, b.start + b.values.shape[0]):
                if i not in self.stalled:
                    per_instant[i].append(b)
        return per_instant

    def _walk(self) -> Iterator[tuple[str, Any]]:
        """('discrete', record) and ('samples', (ts, block, row index i)) in ts order."""
        discrete = self._sorted_discrete()
        di = 0
        per_instant = self._active_blocks()
        for i in range(self.n_samples):
            ts = float(self.ts[i])
            # Records at exactly a sample instant go first: a process is announced before the
            # samples that carry its pid.
            while di < len(discrete) and discrete[di]["ts"] <= ts:
                yield "discrete", discrete[di]
                di += 1
            for block in per_instant[i]:
                yield "samples", (ts, block, i - block.start)
        while di < len(discrete):
            yield "discrete", discrete[di]
            di += 1

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record after the meta line, as trace dicts, in non-decreasing ts."""
        for kind, item in self._walk():
            if kind == "discrete":
                yield item
                continue
            ts, block, j = item
            col = block.values[j].tolist()
            ok = None if block.valid is None else block.valid[j]
            for r, (row, value) in enumerate(zip(block.rows, col, strict=True)):
                if ok is not None and not ok[r]:
                    continue
                yield {"type": "sample", "ts": ts, "name": block.name, "value": value, **row}

    def write(self, path: str | os.PathLike[str], *, compresslevel: int = 1) -> int:
        """Write the trace (gzip when `path` ends in .gz); returns the records written."""
        meta = {k: v for k, v in self.meta.items() if k != "truth"}
        with TraceWriter(
            path, meta, truth=self.meta.get("truth"), compresslevel=compresslevel
        ) as w:
            for kind, item in self._walk():
                if kind == "discrete":
                    w.write(item)
                    continue
                ts, block, j = item
                col = block.values[j]
                mask = None if block.valid is None else block.valid[j]
                if mask is not None and not mask.all():
                    if not mask.any():
                        continue
                    w.write_samples(ts, block.name, col[mask], block.columns(mask))
                else:
                    w.write_samples(ts, block.name, col, block.columns(None))
            return w.records_written

    @property
    def sample_count(self) -> int:
        total = 0
        for b in self._blocks:
            total += int(b.valid.sum()) if b.valid is not None else b.values.size
        return total

    def series(
        self, name: str, key: Sequence[str] = ("node", "gpu"), **match: Any
    ) -> list[tuple[dict[str, Any], np.ndarray]]:
        """For tests and the agent's sim backend: (identity, values over the whole run, NaN where
        absent) per distinct `key` of the rows of `name` whose identity contains `match`."""
        out: dict[tuple[Any, ...], tuple[dict[str, Any], np.ndarray]] = {}
        if self._withheld(name):
            return []
        stalled = np.zeros(self.n_samples, dtype=bool)
        stalled[list(self.stalled)] = True
        for b in self._blocks:
            if b.name != name:
                continue
            for r, row in enumerate(b.rows):
                if any(row.get(k) != v for k, v in match.items()):
                    continue
                row_key = (*(str(row.get(k)) for k in key), str(row.get("labels")))
                if row_key not in out:
                    out[row_key] = (row, np.full(self.n_samples, np.nan))
                vals = b.values[:, r].astype(float)
                if b.valid is not None:
                    vals = np.where(b.valid[:, r], vals, np.nan)
                vals = np.where(stalled[b.start : b.start + len(vals)], np.nan, vals)
                seg = out[row_key][1][b.start : b.start + len(vals)]
                np.copyto(seg, vals, where=~np.isnan(vals))
        return list(out.values())

    @property
    def discrete(self) -> list[dict[str, Any]]:
        return self._sorted_discrete()
