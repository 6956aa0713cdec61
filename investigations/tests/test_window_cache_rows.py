"""The window cache's held samples (investigations/window_cache.py _splice): a node's series
read as one matrix are spliced as one, and whatever the reads look like (series added to a
node, series gone, a series read alone, nothing read) every series holds exactly what
splicing it on its own gives: its samples before the cutoff, then the fresh ones."""

from __future__ import annotations

import numpy as np
import pytest

from contract.rows import SeriesInfo
from ingest.selectors import SampleRows
from investigations import window_cache
from investigations.window_cache import _Held, _splice, _trim

TOLERANCE = window_cache._MS_TOLERANCE


def info(k: int) -> SeriesInfo:
    return SeriesInfo(f"signal.{k}", "node-a", f"GPU-{k % 3}", k % 3, None, "job", k % 3)


def reference_splice(
    ref: dict[SeriesInfo, tuple[np.ndarray, np.ndarray]],
    fresh: dict[SeriesInfo, tuple[np.ndarray, np.ndarray]],
    order: list[SeriesInfo],
    cutoff: float,
) -> None:
    for i in order:
        ts, values = ref.get(i, (np.zeros(0), np.zeros(0)))
        keep = ts < cutoff - TOLERANCE
        new_ts, new_values = fresh.get(i, (np.zeros(0), np.zeros(0)))
        ref[i] = (np.concatenate((ts[keep], new_ts)), np.concatenate((values[keep], new_values)))


@pytest.mark.parametrize("seed", range(25))
def test_spliced_rows_hold_what_each_series_spliced_alone_holds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    held: dict[SeriesInfo, _Held] = {}
    index: dict[int, window_cache._Rows] = {}
    ref: dict[SeriesInfo, tuple[np.ndarray, np.ndarray]] = {}
    members = list(range(6))
    through = 100.0
    for _refresh in range(12):
        change = rng.random()
        if change < 0.15:
            members.append(max(members) + 1)  # a series new to the node
        elif change < 0.25 and len(members) > 2:
            members.remove(int(rng.choice(members)))  # one no longer in its blocks
        cutoff = through - float(rng.integers(0, 15))
        t1 = through + float(rng.integers(0, 12))
        ts = np.arange(np.ceil(cutoff), t1 + 1)
        infos = [info(k) for k in members]
        fresh: list[SampleRows] = []
        as_dict: dict[SeriesInfo, tuple[np.ndarray, np.ndarray]] = {}
        matrix = rng.normal(0, 1, (len(infos), len(ts)))
        ids = list(members)
        if rng.random() < 0.2:  # one series read alone (an irregular block), the rest as one
            fresh.append(SampleRows(ids[:1], infos[:1], ts[::2], matrix[:1, ::2]))
            as_dict[infos[0]] = (ts[::2], matrix[0, ::2])
            ids, infos, matrix = ids[1:], infos[1:], matrix[1:]
        if infos and rng.random() > 0.05:  # else: nothing read for the node's series
            fresh.append(SampleRows(ids, infos, ts, matrix))
            as_dict.update((i, (ts, row)) for i, row in zip(infos, matrix, strict=True))
        order = [info(k) for k in range(max(members) + 1)]
        _splice(held, fresh, order, cutoff, index)
        reference_splice(ref, as_dict, order, cutoff)
        if rng.random() < 0.3:
            keep_from = cutoff - 20
            _trim(held, keep_from)
            for i, (r_ts, r_values) in ref.items():
                keep = r_ts >= keep_from
                ref[i] = (r_ts[keep], r_values[keep])
        through = t1
        assert list(held) == list(ref)  # the catalog's order, new series where it puts them
        for i, h in held.items():
            view = h.view()
            assert view.info == i
            assert len(h) == len(ref[i][0])
            assert view.ts.tobytes() == ref[i][0].tobytes()
            assert view.values.tobytes() == ref[i][1].tobytes()


def test_a_node_s_series_are_spliced_as_one_until_one_is_replaced() -> None:
    held: dict[SeriesInfo, _Held] = {}
    index: dict[int, window_cache._Rows] = {}
    infos = [info(k) for k in range(4)]
    ids = [0, 1, 2, 3]
    ts = np.arange(10.0)
    _splice(held, [SampleRows(ids, infos, ts, np.ones((4, 10)))], infos, 0.0, index)
    rows = held[infos[0]].rows
    assert all(h.rows is rows for h in held.values())
    _splice(held, [SampleRows(ids, infos, ts + 5, np.zeros((4, 10)))], infos, 5.0, index)
    assert all(h.rows is rows for h in held.values())  # still one matrix
    np.testing.assert_array_equal(held[infos[2]].view().ts, np.arange(15.0))
    np.testing.assert_array_equal(held[infos[2]].view().values, [1.0] * 5 + [0.0] * 10)
    # A series read again over what is held (the cache's added series) replaces its handle:
    # its node's matrix no longer holds every one of them, and each is spliced on its own.
    rows.intact = False
    held[infos[1]] = _Held.of(held[infos[1]].view())
    _splice(held, [SampleRows(ids, infos, ts + 10, np.full((4, 10), 2.0))], infos, 10.0, index)
    assert len({id(h.rows) for h in held.values()}) == 4
    for h in held.values():
        np.testing.assert_array_equal(h.view().ts, np.arange(20.0))
        np.testing.assert_array_equal(h.view().values, [1.0] * 5 + [0.0] * 5 + [2.0] * 10)
