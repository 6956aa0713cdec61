"""Decoding a node's blocks together (blocks.decode_many): each run of blocks of one layout is
one block whose series hold the run's samples in order, bit for bit what decoding the blocks
one by one gives, whatever the blocks' shapes, formats and values."""

from __future__ import annotations

import numpy as np
import pytest

from ingest import block_values, blocks
from ingest.tests.test_blocks import SPECIALS

T0 = 1_790_000_000_000


def node_blocks(seed: int, n_blocks: int) -> list[bytes]:
    """One node's blocks in time order: mostly the same series with `per` samples each
    (values whose decimals change from block to block, XOR series, specials now and then),
    and, at random, blocks that differ (a series more, per-sample timestamps, format 2)."""
    rng = np.random.default_rng(seed)
    n_series = int(rng.integers(1, 40))
    ids = np.cumsum(rng.integers(1, 1000, n_series)).astype(np.int64)
    kinds = rng.integers(0, 6, n_series)
    per = int(rng.choice([1, 1, 1, 2, 3, 7, 60]))
    payloads = []
    for b in range(n_blocks):
        ts_row = T0 + 1000 * (b * per + np.arange(per))
        values = np.concatenate([series_values(rng, int(k), per) for k in kinds])
        counts = np.full(n_series, per)
        block_ids = ids
        ts = np.tile(ts_row, n_series)
        odd = rng.random()
        if odd < 0.08:  # one series more
            block_ids = np.append(ids, ids[-1] + 7)
            counts = np.append(counts, per)
            values = np.append(values, rng.normal(0, 1, per))
            ts = np.tile(ts_row, n_series + 1)
        elif odd < 0.14:  # every sample's own timestamp
            ts = ts + rng.integers(0, 3, len(ts))
        if odd > 0.96:
            payloads.append(blocks.encode_v2(block_ids, counts, ts, values))
        else:
            payloads.append(blocks.encode(block_ids, counts, ts, values))
    return payloads


def series_values(
    rng: np.random.Generator, kind: int, per: int, specials: bool = True
) -> np.ndarray:
    k = int(rng.integers(0, 7))  # decimals: a block's scale differs from the last one's
    if kind == 0:  # a temperature
        v = np.round(60 + rng.normal(0, 2, per))
    elif kind == 1:  # watts to k decimals
        v = np.round(rng.normal(300, 20, per), k)
    elif kind == 2:  # a counter
        v = 5e12 + np.cumsum(rng.integers(0, 300_000, per)).astype(np.float64)
    elif kind == 3:  # doubles with every bit used: XOR
        v = rng.normal(0, 1, per) * 10.0 ** rng.integers(-300, 300, per)
    elif kind == 4:  # a constant
        v = np.full(per, 80.0)
    else:  # small ratios, sometimes without a short decimal form
        v = np.round(rng.random(per), k) if rng.random() < 0.9 else rng.random(per) / 3
    if specials and rng.random() < 0.05:
        v[int(rng.integers(0, per))] = rng.choice(SPECIALS)
    return v


def samples_by_series(decoded: list[blocks.DecodedBlock]) -> dict[int, tuple[bytes, bytes]]:
    """Each series' timestamps and values over the blocks, in block order, as bytes."""
    ts: dict[int, list[np.ndarray]] = {}
    values: dict[int, list[np.ndarray]] = {}
    for block in decoded:
        ends = np.cumsum(block.counts)
        for sid, a, b in zip(block.series_ids.tolist(), ends - block.counts, ends, strict=True):
            ts.setdefault(sid, []).append(block.ts_ms[a:b])
            values.setdefault(sid, []).append(block.values[a:b])
    return {
        sid: (np.concatenate(ts[sid]).tobytes(), np.concatenate(values[sid]).tobytes())
        for sid in ts
    }


@pytest.mark.parametrize("seed", range(120))
def test_decoding_together_gives_every_sample_bit_for_bit(seed: int) -> None:
    payloads = node_blocks(seed, int(np.random.default_rng(seed).integers(1, 30)))
    alone = [blocks.decode(p) for p in payloads]
    together = blocks.decode_many(payloads)
    assert samples_by_series(together) == samples_by_series(alone)
    assert sum(int(b.counts.sum()) for b in together) == sum(len(b.values) for b in alone)


def test_a_node_s_one_second_blocks_decode_as_one() -> None:
    # 25 blocks of 500 series × 1 sample, the same series kinds, decimals changing from one
    # block to the next: one block out, its timestamps the 25 seconds.
    rng = np.random.default_rng(7)
    ids = np.arange(100, 600, dtype=np.int64)
    kinds = np.resize(np.array([0, 1, 2, 4, 5]), len(ids))
    payloads = []
    for b in range(25):
        values = np.concatenate([series_values(rng, int(k), 1, False) for k in kinds])
        values[kinds == 5] = np.round(rng.random(int((kinds == 5).sum())), 3)  # stays decimal
        payloads.append(
            blocks.encode(ids, np.ones(len(ids)), np.full(len(ids), T0 + 1000 * b), values)
        )
    together = blocks.decode_many(payloads)
    assert len(together) == 1
    block = together[0]
    assert block.row_ts is not None
    np.testing.assert_array_equal(block.row_ts, T0 + 1000 * np.arange(25))
    np.testing.assert_array_equal(block.counts, np.full(len(ids), 25))
    assert samples_by_series(together) == samples_by_series([blocks.decode(p) for p in payloads])


def test_value_sections_of_different_layouts_are_refused() -> None:
    ids = np.arange(3, dtype=np.int64)
    counts = np.ones(3, dtype=np.int64)
    ts = np.full(3, T0)
    sections = []
    for values in ([1.0, 2.0, 3.0], [1.0, 2.0, np.nan]):  # the NaN makes the third XOR
        body = blocks._open(blocks.encode(ids, counts, ts, np.array(values)))
        sections.append(memoryview(body.body)[body.values_at :])
    with pytest.raises(block_values.BlockError, match="different layouts"):
        block_values.decode_value_rows(sections, counts, 3)


def test_a_corrupt_block_in_a_run_is_reported() -> None:
    ids = np.arange(4, dtype=np.int64)
    payloads = [
        blocks.encode(ids, np.ones(4), np.full(4, T0 + 1000 * b), np.arange(4.0) + b)
        for b in range(3)
    ]
    payloads[1] = payloads[1][:-3]
    with pytest.raises(block_values.BlockError):
        blocks.decode_many(payloads)
