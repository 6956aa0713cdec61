"""A window's rank × time matrices, built whole or updated from the last build.

`build_job_window` puts every GPU- and process-scope sample of a job on one grid
(engine/window.py). Offline that happens once; the live pipeline evaluates a job every few
seconds while its data arrives, and rebuilding the matrices from every sample of the window
each time was the largest part of a large job's evaluation (a 200-GPU job: ~28 matrices of
200 × 600+ cells, a third of its CPU, growing with the window). Here the previous build's
matrices are kept by the caller (`Matrices`) and only the cells that new data can touch are
recomputed:

    m = place(groups, grid, n_rows, layout, previous=m_old, changed_from=cutoff)

- `changed_from`: the earliest sample time that may differ from what the previous build saw
  (the live cache's refresh cutoff); None rebuilds whole. Every sample before it is unchanged
  and no series was added (the caller's promise).
- Reused only on the same layout (ranks, signal names) and interval, with the grid's origin
  moved by an even number of cells (0 while the window grows; the live window's start moves
  in whole minutes) on a power-of-two interval: a sample exactly between two grid points is
  rounded half to even, so an odd shift, or an interval whose division rounds, could move it
  to the other cell than a whole build would.
- Cells from one before the first one `changed_from` can reach are recomputed from every
  sample that lands in them, in the same order a whole build places them; the cells before
  are copied, but for column 0 after a shift (see `_copied`). The result is cell for cell
  what a whole build gives (engine/tests/test_window_grid.py checks it on growing and
  sliding windows of jittered samples, ties half way between grid points included).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from contract.rows import SeriesData


@dataclass(frozen=True)
class Grid:
    t0: float
    dt: float
    n_t: int


@dataclass(frozen=True)
class Groups:
    """What to place: per signal the GPU matrices' rows, each with the pieces of its series
    (one GPU's signal arrives under several identities: before the job, with its pid),
    merged in time order; the process matrices' (rows, series), with whether samples landing
    in one cell add up; and the input workers' CPU (per rank the busiest: max over the rank's
    series)."""

    gpu: dict[str, tuple[list[int], list[list[SeriesData]]]]
    proc: dict[str, tuple[list[int], list[SeriesData], bool]]
    worker: tuple[list[int], list[SeriesData]]


@dataclass
class Matrices:
    grid: Grid
    layout: tuple[object, ...]
    gpu: dict[str, np.ndarray]
    proc: dict[str, np.ndarray]
    worker: np.ndarray | None
    # How the last build was made (for the live pipeline's figures and tests).
    reused: bool = False

    def cells(self) -> int:
        n = sum(a.size for a in self.gpu.values()) + sum(a.size for a in self.proc.values())
        return n + (0 if self.worker is None else self.worker.size)


def place(
    groups: Groups,
    grid: Grid,
    n_rows: int,
    layout: tuple[object, ...],
    previous: Matrices | None = None,
    changed_from: float | None = None,
) -> Matrices:
    """The matrices of `groups` on `grid` (see the module docstring)."""
    first = _first_changed_column(grid, layout, previous, changed_from)
    shift = 0
    if first is not None and previous is not None:
        shift = round((grid.t0 - previous.grid.t0) / grid.dt)
    else:
        previous = None
    gpu = {
        name: _matrix(
            grid, n_rows, rows, pieces, first, _old(previous, "gpu", name), shift, add=False
        )
        for name, (rows, pieces) in groups.gpu.items()
    }
    proc = {
        name: _matrix(
            grid,
            n_rows,
            rows,
            [[s] for s in parts],
            first,
            _old(previous, "proc", name),
            shift,
            add,
        )
        for name, (rows, parts, add) in groups.proc.items()
    }
    worker = None
    rows, parts = groups.worker
    if parts:
        old = previous.worker if previous is not None else None
        worker = _worker(grid, n_rows, rows, parts, first, old, shift)
    for a in (*gpu.values(), *proc.values(), *([] if worker is None else [worker])):
        # Detectors read the matrices; the next build copies from them.
        a.flags.writeable = False
    return Matrices(grid, layout, gpu, proc, worker, reused=first is not None)


def _first_changed_column(
    grid: Grid, layout: tuple[object, ...], previous: Matrices | None, changed_from: float | None
) -> int | None:
    """The first column to recompute, or None: build whole."""
    if previous is None or changed_from is None or previous.layout != layout:
        return None
    old = previous.grid
    if old.dt != grid.dt or grid.n_t < 1:
        return None
    moved = (grid.t0 - old.t0) / grid.dt
    shift = round(moved)
    if shift < 0 or abs(moved - shift) > 1e-9:
        return None
    if shift and (shift % 2 or math.frexp(grid.dt)[0] != 0.5):
        return None
    # A sample at or after changed_from lands at column >= floor(x) (rint is monotonic and
    # rint(x) >= floor(x)); one before it stays in the previous build's cells. One column of
    # margin for the float arithmetic.
    x = (changed_from - grid.t0) / grid.dt
    first = max(0, math.floor(x) - 1)
    # Columns before `first` come from the previous build: it must have held them.
    if first + shift > old.n_t:
        return None
    return min(first, grid.n_t)


def _old(previous: Matrices | None, kind: str, name: str) -> np.ndarray | None:
    if previous is None:
        return None
    return (previous.gpu if kind == "gpu" else previous.proc).get(name)


def _tail(parts: list[SeriesData], grid: Grid, first: int) -> list[SeriesData]:
    """Each series from the first sample that can land at column `first` or later."""
    if first <= 0:
        return parts
    t_from = grid.t0 + (first - 1) * grid.dt
    out = []
    for s in parts:
        n = len(s.ts)
        if not n or s.ts[n - 1] < t_from:
            out.append(SeriesData(s.info, s.ts[:0], s.values[:0]))
            continue
        k = 0 if s.ts[0] >= t_from else int(np.searchsorted(s.ts, t_from, side="left"))
        out.append(s if k == 0 else SeriesData(s.info, s.ts[k:], s.values[k:]))
    return out


def _head(parts: list[SeriesData], grid: Grid) -> list[SeriesData]:
    """Each series' samples that can land at column 0."""
    t_to = grid.t0 + grid.dt
    out = []
    for s in parts:
        k = 0 if not len(s.ts) or s.ts[0] >= t_to else int(np.searchsorted(s.ts, t_to))
        out.append(SeriesData(s.info, s.ts[:k], s.values[:k]))
    return out


def _copied(first: int | None, old: np.ndarray | None, shift: int) -> tuple[int, int]:
    """The columns [lo, hi) copied from the previous build; the rest are placed. Column 0 is
    placed again after a shift: the old build's cell there also held samples from before the
    new start, which the store no longer gives (a sample half a cell before the start)."""
    if first is None or old is None:
        return 0, 0
    hi = max(0, min(first, old.shape[1] - shift))
    lo = min(1 if shift else 0, hi)
    return lo, hi


def _matrix(
    grid: Grid,
    n_rows: int,
    rows: list[int],
    pieces: list[list[SeriesData]],
    first: int | None,
    old: np.ndarray | None,
    shift: int,
    add: bool,
) -> np.ndarray:
    out = np.full((n_rows, grid.n_t), np.nan)
    lo, hi = _copied(first, old, shift)
    if hi <= lo or old is None:
        place_many(out, rows, [_merge(p) for p in pieces], grid.t0, grid.dt, add)
        return out
    out[:, lo:hi] = old[:, shift + lo : shift + hi]
    if lo:
        heads = [_merge(_head(p, grid)) for p in pieces]
        place_many(out, rows, heads, grid.t0, grid.dt, add, to_column=lo)
    _place_tail(out, rows, pieces, grid, hi, add)
    return out


def _place_tail(
    out: np.ndarray,
    rows: list[int],
    pieces: list[list[SeriesData]],
    grid: Grid,
    hi: int,
    add: bool,
) -> None:
    """Every sample landing at column `hi` or later, placed as a whole build would: cut from
    one concatenation of the signal (an array pass) rather than series by series (cutting
    13,000 series in Python cost as much as placing the whole window). A row's pieces are
    put in time order by a stable sort on (row, time), which is their merge; added signals
    (one series a row entry, summed) keep the whole build's order, which their sums need to
    be the same to the last bit."""
    flat = [(r, s) for r, p in zip(rows, pieces, strict=True) for s in p if len(s.ts)]
    if not flat:
        return
    ts = np.concatenate([s.ts for _, s in flat])
    values = np.concatenate([s.values for _, s in flat])
    row = np.repeat(np.array([r for r, _ in flat], dtype=np.int64), [len(s.ts) for _, s in flat])
    idx = np.rint((ts - grid.t0) / grid.dt).astype(np.int64)
    ok = (idx >= hi) & (idx < out.shape[1])
    row, idx, values = row[ok], idx[ok], values[ok]
    if add:
        flat_out = out.reshape(-1)
        cells = row * out.shape[1] + idx
        flat_out[cells] = np.where(np.isnan(flat_out[cells]), 0.0, flat_out[cells])
        np.add.at(flat_out, cells, values)
        return
    if any(len(p) > 1 for p in pieces):
        order = np.lexsort((ts[ok], row))
        row, idx, values = row[order], idx[order], values[order]
    out[row, idx] = values


def _merge(parts: list[SeriesData]) -> SeriesData:
    """One series from pieces of one signal, in time order (ties in the pieces' order), as
    engine.window.merge_series; pieces that do not overlap are only concatenated."""
    if len(parts) == 1:
        return parts[0]
    filled = [p for p in parts if len(p.ts)]
    if len(filled) <= 1:
        return filled[0] if filled else parts[0]
    ordered = sorted(filled, key=lambda p: float(p.ts[0]))
    if all(a.ts[-1] < b.ts[0] for a, b in itertools.pairwise(ordered)):
        return SeriesData(
            ordered[0].info,
            np.concatenate([p.ts for p in ordered]),
            np.concatenate([p.values for p in ordered]),
        )
    ts = np.concatenate([p.ts for p in filled])
    values = np.concatenate([p.values for p in filled])
    order = np.argsort(ts, kind="stable")
    return SeriesData(filled[0].info, ts[order], values[order])


def _worker(
    grid: Grid,
    n_rows: int,
    rows: list[int],
    parts: list[SeriesData],
    first: int | None,
    old: np.ndarray | None,
    shift: int,
) -> np.ndarray:
    """Per rank the max over its series (NaN-ignoring); within a series the later sample in a
    cell wins."""
    out = np.full((n_rows, grid.n_t), np.nan)
    lo, hi = _copied(first, old, shift)
    if hi > lo and old is not None:
        out[:, lo:hi] = old[:, shift + lo : shift + hi]
    else:
        lo = hi = 0
    for row, s in zip(rows, parts, strict=True):
        if not len(s.ts):
            continue
        tmp = np.full(grid.n_t, np.nan)
        idx = np.rint((s.ts - grid.t0) / grid.dt).astype(np.int64)
        ok = (idx >= 0) & (idx < grid.n_t) & ((idx < lo) | (idx >= hi))
        tmp[idx[ok]] = s.values[ok]
        out[row, :lo] = np.fmax(out[row, :lo], tmp[:lo])
        out[row, hi:] = np.fmax(out[row, hi:], tmp[hi:])
    return out


def place_many(
    out: np.ndarray,
    rows: list[int],
    parts: list[SeriesData],
    t0: float,
    dt: float,
    add: bool,
    from_column: int = 0,
    to_column: int | None = None,
) -> None:
    """Every sample of `parts` into its row's cell (columns `from_column` on): one
    concatenation and one scatter instead of a few numpy calls per series (a 64-GPU job's
    window has ~2,000 series; placing them one by one was a quarter of its evaluation). Where
    two samples land in one cell the later series' wins (or, with `add`, they add up: NaN
    where none landed)."""
    kept = [(r, s) for r, s in zip(rows, parts, strict=True) if len(s.ts)]
    if not kept:
        return
    ts = np.concatenate([s.ts for _, s in kept])
    values = np.concatenate([s.values for _, s in kept])
    row = np.repeat(np.array([r for r, _ in kept], dtype=np.int64), [len(s.ts) for _, s in kept])
    idx = np.rint((ts - t0) / dt).astype(np.int64)
    ok = (idx >= from_column) & (idx < (out.shape[1] if to_column is None else to_column))
    row, idx, values = row[ok], idx[ok], values[ok]
    if add:
        flat = out.reshape(-1)  # a view: the matrices are built contiguous here
        cells = row * out.shape[1] + idx
        flat[cells] = np.where(np.isnan(flat[cells]), 0.0, flat[cells])  # NaN -> 0, then add
        np.add.at(flat, cells, values)
    else:
        out[row, idx] = values
