"""Format 3's value coder (ingest/blocks.py frames it): each series as decimal-scaled integers,
differenced and narrowed, or as float64 XOR. Pure numpy, no Django.

Layout of the value section, after the block's timestamps (all little-endian):

    u8[series_count]  mode: 0 = float64 XOR, 1 + d = decimal integers differenced d times
    u8[series_count]  scale k: the values are integers / 10^k (0 for XOR series)
    u8[series_count]  width: bytes per residual, 0..8 (0 for XOR series and constants)
    i64[...]          byte-shuffled: per integer series its base (the residuals' minimum),
                      then per integer series its d head values
    u8[...]           for width w = 1..8, for d = 0..2: the residuals of the series of that
                      width and d, in series order, their low w bytes byte-shuffled
    u64[...]          the XOR series' float64 values XOR the previous, byte-shuffled

Why it compresses: GPU telemetry is integers (°C, MHz, %, MiB, counters) or few decimals (W to
the mW, 3- or 6-decimal ratios), so each value is n / 10^k for a small integer n. Per series
the encoder takes the smallest k in 0..MAX_SCALE at which every value is exactly such a number
(n = rint(v·10^k), |n| ≤ 2^53, and n / 10^k gives back v's 64 bits — so -0.0, NaN, ±inf and
values without a short decimal form fail, and the series is stored as XOR). The integers are
differenced 0, 1 or 2 times, the first d values kept as heads (a counter's steps, a slowly
moving reading's changes: the smallest range of what is left wins, ties to fewer
differences), less their minimum (so all are ≥ 0: a frame of reference, which does what
zigzag does and also removes a counter's steady rate), in the fewest bytes the largest needs
— a constant series in none. Lossless bit for bit: decoding is n / 10^k in float64, the very
division the encoder checked.

Two paths compute the same bytes: one over a (series × samples) matrix when every series has
the same number of samples (the usual block: one collection tick for all), and one over the
concatenated samples for any other shape. Whole-array numpy both; no loop per series.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_SCALE = 6
MAX_ORDER = 2
_POW10 = 10.0 ** np.arange(MAX_SCALE + 1)  # every one exact in float64
_MAX_INT = float(2**53)  # beyond it not every integer is a float64; differences stay in int64
# A residual range r needs searchsorted(_WIDTH_AT, r, "right") bytes: 0 → 0, 1..255 → 1, …
_WIDTH_AT = np.array([1 << (8 * i) for i in range(8)], dtype=np.uint64)
_NO_RANGE = np.iinfo(np.uint64).max  # an order a series has too few samples for
# The first values of a series whose scale is guessed before one pass checks all of them.
_PROBE = 4


class BlockError(ValueError):
    """A stored block could not be decoded (corrupt or of an unknown format)."""


@dataclass(slots=True)
class Coded:
    """A block's values, coded: the per-series bytes and the sections that follow them."""

    modes: np.ndarray  # u8 per series
    scales: np.ndarray  # u8
    widths: np.ndarray  # u8
    extras: np.ndarray  # i64: bases of the integer series, then their heads
    streams: list[bytes]  # the residuals, by (width, order)
    xor: bytes

    def tobytes(self) -> bytes:
        return b"".join(
            (
                self.modes.tobytes(),
                self.scales.tobytes(),
                self.widths.tobytes(),
                shuffle(self.extras.astype("<i8").view("<u8")),
                *self.streams,
                self.xor,
            )
        )


def shuffle(words: np.ndarray, width: int = 8) -> bytes:
    """The low `width` bytes of each 64-bit word, byte 0 of all words first, then byte 1, …"""
    return words.view(np.uint8).reshape(-1, 8)[:, :width].T.tobytes()


def unshuffle(raw: bytes | memoryview, n: int, width: int = 8) -> np.ndarray:
    """uint64[n] from their low `width` bytes, byte-shuffled."""
    words: np.ndarray = unshuffle_rows(np.frombuffer(raw, dtype=np.uint8).reshape(1, -1), n, width)
    return words.reshape(n)


def xor_bytes(values: np.ndarray) -> bytes:
    """float64 values XOR the previous, byte-shuffled (format 1 and 2's values, and format 3's
    XOR series)."""
    bits = np.ascontiguousarray(values, dtype="<f8").view("<u8")
    return shuffle(bits ^ np.concatenate((np.zeros(1, dtype="<u8"), bits[:-1])))


def _starts(counts: np.ndarray) -> np.ndarray:
    starts: np.ndarray = np.cumsum(counts) - counts
    return starts


_GROUPS = 9 * (MAX_ORDER + 1)  # (width 0..8, order 0..MAX_ORDER), in the order streams are stored


def groups(widths: np.ndarray, orders: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(width, order, the series of that group in series order) for each group present, in
    stream order: one stable sort instead of a pass over every series per possible group."""
    key = widths.astype(np.int64) * (MAX_ORDER + 1) + orders
    by_group = np.argsort(key, kind="stable")
    sizes = np.bincount(key, minlength=_GROUPS)
    ends = np.cumsum(sizes).tolist()
    return [
        (g // (MAX_ORDER + 1), g % (MAX_ORDER + 1), by_group[ends[g] - int(sizes[g]) : ends[g]])
        for g in np.flatnonzero(sizes).tolist()
    ]


def _regular(counts: np.ndarray) -> int:
    """Samples per series when every series has the same number (≥ 1), else 0."""
    if not len(counts) or counts[0] < 1 or not np.all(counts == counts[0]):
        return 0
    return int(counts[0])


def _exact(values: np.ndarray, power: np.ndarray | np.floating) -> tuple[np.ndarray, np.ndarray]:
    """rint(values·power) and whether each gives back its value's bits."""
    with np.errstate(over="ignore", invalid="ignore"):
        n = values * power
        np.rint(n, out=n)
        n += 0.0  # -0.0 becomes 0.0, so a -0.0 fails (it must: the integer 0 decodes to 0.0)
        ok = (n / power).view("<u8") == values.view("<u8")
        # Out of range (or NaN: min and max are NaN then) is rare: one check of the whole array
        # first, each value only when it fails.
        if not (n.size == 0 or (n.min() >= -_MAX_INT and n.max() <= _MAX_INT)):
            ok &= np.abs(n) <= _MAX_INT
    return n, ok


def _rows_all(ok: np.ndarray) -> np.ndarray:
    """Per row whether all of it is true: one whole-array check first (the usual answer:
    every row), the per-row reduction (far slower over booleans) only when it fails."""
    if ok.all():
        return np.ones(len(ok), dtype=bool)
    return np.asarray(ok.all(axis=1))


def decimal_scales(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per series the smallest k in 0..MAX_SCALE with every value exactly rint(v·10^k) / 10^k
    (bit for bit, |rint(v·10^k)| ≤ 2^53), or -1: none (the series is stored as XOR)."""
    n_series = len(counts)
    scales = np.full(n_series, -1, dtype=np.int8)
    seg = np.repeat(np.arange(n_series), counts)
    pending = np.ones(n_series, dtype=bool)
    picked: np.ndarray | None = None  # the samples of the pending series (None: all)
    for k, power in enumerate(_POW10):
        v = values if picked is None else values[picked]
        s = seg if picked is None else seg[picked]
        ok = _exact(v, power)[1]
        failed = np.zeros(n_series, dtype=bool)
        failed[s[~ok]] = True
        scales[pending & ~failed] = k
        pending = failed
        if not pending.any():
            break
        keep = failed[s]
        picked = np.flatnonzero(keep) if picked is None else picked[keep]
    return scales


def _row_scales(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """decimal_scales of each row of a (series × samples) matrix, and the rows' integers at
    their scale (rows without one: undefined)."""
    scales = np.full(len(matrix), -1, dtype=np.int8)
    integers = np.empty_like(matrix)
    pending = np.arange(len(matrix))
    for k, power in enumerate(_POW10):
        n, ok = _exact(matrix[pending], power)
        good = _rows_all(ok)
        scales[pending[good]] = k
        integers[pending[good]] = n[good]
        pending = pending[~good]
        if not len(pending):
            break
    return scales, integers


def _matrix_scales(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """_row_scales, fast: the scale of each row's first _PROBE values is a lower bound of the
    row's (and none there means none at all); one pass over every value checks it, and only
    the rows it fails for are searched again."""
    scales, _ = _row_scales(np.ascontiguousarray(matrix[:, :_PROBE]))
    rows = np.flatnonzero(scales >= 0)
    every = len(rows) == len(matrix)
    sub = matrix if every else matrix[rows]
    row_scales = scales[rows]
    single = len(rows) and row_scales.min() == row_scales.max()  # a scalar: faster
    n, ok = _exact(sub, _POW10[row_scales[0]] if single else _POW10[row_scales][:, None])
    good = _rows_all(ok)
    integers = n if every else np.empty_like(matrix)
    if not every:
        integers[rows] = n
    retry = rows[~good]
    if len(retry):
        scales[retry], integers[retry] = _row_scales(matrix[retry])
    return scales, integers


def _pick_orders(
    lows: list[np.ndarray], highs: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per series the order whose residuals span least (ties: fewer differences), their base
    (minimum) and width (bytes of the span). Orders a series is too short for have high < low."""
    spans = np.stack([(h - lo).view(np.uint64) for lo, h in zip(lows, highs, strict=True)])
    for o, (lo, h) in enumerate(zip(lows, highs, strict=True)):
        spans[o, h < lo] = _NO_RANGE
    orders = np.argmin(spans, axis=0).astype(np.uint8)
    chosen = np.arange(spans.shape[1])
    span = spans[orders, chosen]
    span[span == _NO_RANGE] = 0  # a series without samples
    bases = np.stack(lows)[orders, chosen]
    widths = np.searchsorted(_WIDTH_AT, span, side="right").astype(np.uint8)
    return orders, bases, widths


def encode_values(values: np.ndarray, counts: np.ndarray) -> Coded:
    """Code the values (float64, each series' samples contiguous, counts per series)."""
    per = _regular(counts)
    if per:
        return _encode_matrix(values.reshape(len(counts), per))
    return _encode_general(values, counts)


def _assemble(
    scales: np.ndarray,
    orders: np.ndarray,
    widths: np.ndarray,
    extras: np.ndarray,
    streams: list[bytes],
    xor: bytes,
) -> Coded:
    is_int = scales >= 0
    modes = np.zeros(len(scales), dtype=np.uint8)
    modes[is_int] = orders + 1
    width_all = np.zeros(len(scales), dtype=np.uint8)
    width_all[is_int] = widths
    return Coded(modes, np.maximum(scales, 0).astype(np.uint8), width_all, extras, streams, xor)


def _encode_matrix(matrix: np.ndarray) -> Coded:
    scales, integers = _matrix_scales(matrix)
    is_int = scales >= 0
    every = bool(is_int.all())
    x = (integers if every else integers[is_int]).astype(np.int64)
    per = x.shape[1]
    diffs = [x]
    for _ in range(min(MAX_ORDER, per - 1)):
        diffs.append(np.diff(diffs[-1], axis=1))
    lows = [d.min(axis=1) for d in diffs]
    highs = [d.max(axis=1) for d in diffs]
    while len(lows) <= MAX_ORDER:  # too few samples for this order
        lows.append(np.zeros(len(x), dtype=np.int64))
        highs.append(np.full(len(x), -1, dtype=np.int64))
    orders, bases, widths = _pick_orders(lows, highs)
    # Heads: x0, and for two differences x1 - 2·x0 (the second value once differenced twice
    # with each first value kept, as the general path computes it).
    heads = np.empty((len(x), MAX_ORDER), dtype=np.int64)
    heads[:, 0] = x[:, 0]
    heads[:, 1] = (x[:, 1] - 2 * x[:, 0]) if per > 1 else 0
    head_list = heads[np.arange(MAX_ORDER) < orders[:, None]]
    streams = []
    for w, o, rows in groups(widths, orders):
        if w:
            residual = diffs[o][rows] - bases[rows, None]
            streams.append(shuffle(residual.view(np.uint64).ravel(), w))
    xor = b"" if every else xor_bytes(matrix[~is_int].ravel())
    return _assemble(scales, orders, widths, np.concatenate((bases, head_list)), streams, xor)


def _differences(x: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x differenced once and twice within each series, each series' first value kept (the
    second difference's second value is then x1 - 2·x0: a head, like x0)."""
    z1 = x.copy()
    z1[1:] -= x[:-1]
    z1[starts] = x[starts]
    z2 = z1.copy()
    z2[1:] -= z1[:-1]
    z2[starts] = z1[starts]
    return z1, z2


def _segment_range(
    z: np.ndarray, starts: np.ndarray, counts: np.ndarray, order: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per series the minimum and maximum of z after its first `order` values (series with no
    more than `order` values: min 0, max -1)."""
    mins = np.zeros(len(counts), dtype=np.int64)
    maxs = np.full(len(counts), -1, dtype=np.int64)
    valid = counts > order
    if valid.any():
        # Bounds [start + order, start + count) of every valid series, interleaved: reduceat
        # then reduces each series' residuals and, in between, the next one's heads (dropped).
        at = starts[valid]
        bounds = np.empty(2 * len(at), dtype=np.int64)
        bounds[0::2] = at + order
        bounds[1::2] = at + counts[valid]
        if bounds[-1] == len(z):
            bounds = bounds[:-1]
        mins[valid] = np.minimum.reduceat(z, bounds)[0::2]
        maxs[valid] = np.maximum.reduceat(z, bounds)[0::2]
    return mins, maxs


def _encode_general(values: np.ndarray, counts: np.ndarray) -> Coded:
    scales = decimal_scales(values, counts)
    is_int = scales >= 0
    every = bool(is_int.all())
    int_samples = np.repeat(is_int, counts)
    c = counts[is_int]
    power = np.repeat(_POW10[scales[is_int]], c)
    x = np.rint((values if every else values[int_samples]) * power).astype(np.int64)
    starts = _starts(c)
    z1, z2 = _differences(x, starts[c > 0])
    lows, highs = [], []
    for order, z in enumerate((x, z1, z2)):
        lo, hi = _segment_range(z, starts, c, order)
        lows.append(lo)
        highs.append(hi)
    orders, bases, widths = _pick_orders(lows, highs)
    order_s = np.repeat(orders, c)
    z = np.where(order_s == 0, x, np.where(order_s == 1, z1, z2)) if orders.any() else x
    head = (np.arange(len(x)) - np.repeat(starts, c)) < order_s
    residual = (z - np.repeat(bases, c)).view(np.uint64)
    width_s = np.repeat(widths, c)
    width_s[head] = 0
    streams = []
    group_s = width_s.astype(np.int64) * (MAX_ORDER + 1) + order_s
    for w, o, _rows in groups(widths, orders):
        if w:
            streams.append(shuffle(residual[group_s == w * (MAX_ORDER + 1) + o], w))
    xor = b"" if every else xor_bytes(values[~int_samples])
    return _assemble(scales, orders, widths, np.concatenate((bases, z[head])), streams, xor)


# --- decoding ----------------------------------------------------------------------------------


def unshuffle_rows(lanes: np.ndarray, n: int, width: int = 8) -> np.ndarray:
    """uint64[rows, n] from a (rows × width·n) byte matrix, each row `n` words' low `width`
    bytes byte-shuffled: many blocks' sections of one layout in one pass."""
    rows = len(lanes)
    shaped = lanes.reshape(rows, width, n)
    if width == 8:
        return shaped.transpose(0, 2, 1).copy().view("<u8").reshape(rows, n)
    # Narrow: adding the lanes shifted into place is ~3× faster than un-transposing into a
    # zeroed (n, 8) byte matrix.
    out: np.ndarray = shaped[:, 0].astype(np.uint64)
    for i in range(1, width):
        out |= shaped[:, i].astype(np.uint64) << np.uint64(8 * i)
    return out


def _xor_values(lanes: np.ndarray, n: int) -> np.ndarray:
    """float64[rows, n] of each row's XOR stream (a (rows × 8·n) byte matrix)."""
    bits: np.ndarray = np.bitwise_xor.accumulate(unshuffle_rows(lanes, n), axis=1)
    return bits.view("<f8")


def layout_key(raw: bytes | memoryview, n_series: int) -> bytes:
    """What the value sections of blocks with the same counts must share to decode together
    (decode_value_rows): the series' modes and widths, and the section's length. Their
    scales may differ (a reading's decimals change from one second to the next)."""
    return b"".join(
        (raw[:n_series], raw[2 * n_series : 3 * n_series], len(raw).to_bytes(8, "little"))
    )


def decode_values(raw: memoryview, counts: np.ndarray, n: int) -> np.ndarray:
    """The values of a block from its value section (`raw`), `counts` per series."""
    rows: np.ndarray = decode_value_rows([raw], counts, n)[0]
    return rows


def decode_value_rows(raws: Sequence[bytes | memoryview], counts: np.ndarray, n: int) -> np.ndarray:
    """The values of blocks of one layout (the same `counts`, the same layout_key), one row
    of the (blocks × n) result per block, each what decoding that block alone gives: the
    integer reconstruction, the scaling and the XOR are one numpy pass over all of them."""
    n_series = len(counts)
    if int(counts.sum()) != n:
        raise BlockError(f"corrupt sample block: counts add up to {int(counts.sum())}, not {n}")
    size = len(raws[0])
    if size < 3 * n_series:
        raise BlockError("corrupt sample block: truncated series modes")
    if len(raws) == 1:
        stack = np.frombuffer(raws[0], dtype=np.uint8).reshape(1, size)
    elif any(len(r) != size for r in raws):
        raise BlockError("sample blocks of different layouts decoded together")
    else:
        stack = np.frombuffer(b"".join(raws), dtype=np.uint8).reshape(len(raws), size)
    modes = stack[0, :n_series]
    widths = stack[0, 2 * n_series : 3 * n_series]
    if len(stack) > 1 and not (
        np.array_equal(stack[:, :n_series], np.broadcast_to(modes, (len(stack), n_series)))
        and np.array_equal(
            stack[:, 2 * n_series : 3 * n_series],
            np.broadcast_to(widths, (len(stack), n_series)),
        )
    ):
        raise BlockError("sample blocks of different layouts decoded together")
    scales = stack[:, n_series : 2 * n_series]
    is_int = modes > 0
    orders = modes[is_int].astype(np.int64) - 1
    c = counts[is_int]
    w_int = widths[is_int].astype(np.int64)
    if (
        modes.max(initial=0) > MAX_ORDER + 1
        or scales.max(initial=0) > MAX_SCALE
        or widths.max(initial=0) > 8
        or np.any((orders > 0) & (orders >= c))
    ):
        raise BlockError("corrupt sample block: a series mode, scale or width out of range")
    # The residuals of each (width, order) group, in the order the streams are stored.
    present = [
        (w, o, rows, int(c[rows].sum()) - o * len(rows)) for w, o, rows in groups(w_int, orders)
    ]
    n_xor = n - int(c.sum())
    n_extras = len(c) + int(orders.sum())
    stream_bytes = sum(w * m for w, _o, _rows, m in present)
    expected = 3 * n_series + n_extras * 8 + stream_bytes + n_xor * 8
    if size != expected:
        raise BlockError(f"corrupt sample block: {size} value bytes, expected {expected}")
    pos = 3 * n_series
    extras = unshuffle_rows(stack[:, pos : pos + n_extras * 8], n_extras).view(np.int64)
    pos += n_extras * 8
    streams: _Streams = []
    for w, o, rows, m in present:
        residual = None
        if w:
            residual = unshuffle_rows(stack[:, pos : pos + m * w], m, w).view(np.int64)
            pos += m * w
        streams.append((w, o, rows, residual))
    bases, heads = extras[:, : len(c)], extras[:, len(c) :]
    int_scales = scales[:, is_int]
    xor_lanes = stack[:, pos:]
    per = _regular(counts)
    if per:
        return _values_matrix(per, is_int, int_scales, orders, bases, heads, streams, xor_lanes)
    return np.stack(
        [
            _values_general(
                counts,
                is_int,
                int_scales[b],
                orders,
                w_int,
                bases[b],
                heads[b],
                [(w, o, rows, None if r is None else r[b]) for w, o, rows, r in streams],
                xor_lanes[b : b + 1],
            )
            for b in range(len(stack))
        ]
    )


# (width, order, the group's series among the integer ones, its residuals or None: width 0);
# the residuals one row per block (decode_value_rows), or one block's (_values_general).
_Streams = list[tuple[int, int, np.ndarray, np.ndarray | None]]


def _values_general(
    counts: np.ndarray,
    is_int: np.ndarray,
    int_scales: np.ndarray,
    orders: np.ndarray,
    widths: np.ndarray,
    bases: np.ndarray,
    heads: np.ndarray,
    streams: _Streams,
    xor_lanes: np.ndarray,
) -> np.ndarray:
    """One block's values, any number of samples per series."""
    c = counts[is_int]
    x = _integers_general(c, orders, widths, bases, heads, streams)
    v_int: np.ndarray = x.astype(np.float64) / np.repeat(_POW10[int_scales], c)
    n = int(counts.sum())
    n_xor = n - int(c.sum())
    if n_xor == 0:
        return v_int
    values = np.empty(n, dtype=np.float64)
    int_samples = np.repeat(is_int, counts)
    values[int_samples] = v_int
    values[~int_samples] = _xor_values(xor_lanes, n_xor)[0]
    return values


def _values_matrix(
    per: int,
    is_int: np.ndarray,
    int_scales: np.ndarray,
    orders: np.ndarray,
    bases: np.ndarray,
    heads: np.ndarray,
    streams: _Streams,
    xor_lanes: np.ndarray,
) -> np.ndarray:
    """The values (blocks × n) of blocks whose series all have `per` samples. Each (width,
    order) group of rows is summed up and scaled in a slice of its own (no temporaries), the
    XOR rows after them; one row permutation then puts every row in its place. The blocks'
    scales (blocks × integer series) may differ; the rest of their layout is one."""
    n_blocks = len(bases)
    n_series = len(is_int)
    int_rows = np.flatnonzero(is_int)
    lead = np.zeros((n_blocks, len(orders), MAX_ORDER), dtype=np.int64)
    lead[:, np.arange(MAX_ORDER) < orders[:, None]] = heads
    z_all = np.empty((n_blocks, len(orders), per), dtype=np.int64)
    grouped = np.empty((n_blocks, n_series, per), dtype=np.float64)
    placed = []
    at = 0
    for _w, o, rows, residual in streams:
        z = z_all[:, at : at + len(rows)]
        if residual is None:  # width 0: every residual is 0
            z[:, :, o:] = bases[:, rows, None]
        else:
            np.add(
                residual.reshape(n_blocks, len(rows), per - o),
                bases[:, rows, None],
                out=z[:, :, o:],
            )
        if o:
            z[:, :, :o] = lead[:, rows, :o]
            for _ in range(o):
                np.cumsum(z, axis=2, out=z)
        target = grouped[:, at : at + len(rows)]
        target[...] = z
        row_scales = int_scales[:, rows]
        low = int(row_scales.min())
        if low == int(row_scales.max()):  # a scalar divides faster than a column
            if low:  # scale 0 (integers) needs no division
                target /= _POW10[low]
        else:
            target /= _POW10[row_scales][:, :, None]
        placed.append(int_rows[rows])
        at += len(rows)
    if at < n_series:
        xor = _xor_values(xor_lanes, (n_series - at) * per)
        grouped[:, at:] = xor.reshape(n_blocks, n_series - at, per)
        placed.append(np.flatnonzero(~is_int))
    where = np.concatenate(placed)
    if np.array_equal(where, np.arange(n_series)):
        return grouped.reshape(n_blocks, n_series * per)
    source = np.empty(n_series, dtype=np.int64)
    source[where] = np.arange(n_series)
    # A row gather: faster than a scatter.
    return np.take(grouped, source, axis=1).reshape(n_blocks, n_series * per)


def _cumsum_series(z: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Running sums within each series (int64, wrapping as the encoder's differences did)."""
    total = np.cumsum(z)
    ends = np.cumsum(counts)
    before = np.zeros(len(counts), dtype=np.int64)
    inner = (ends - counts > 0) & (counts > 0)
    before[inner] = total[(ends - counts)[inner] - 1]
    return total - np.repeat(before, counts)


def _integers_general(
    counts: np.ndarray,
    orders: np.ndarray,
    widths: np.ndarray,
    bases: np.ndarray,
    heads: np.ndarray,
    streams: _Streams,
) -> np.ndarray:
    """The integer series' integers, concatenated (any number of samples per series)."""
    order_s = np.repeat(orders, counts)
    width_s = np.repeat(widths, counts)
    head = (np.arange(len(order_s)) - np.repeat(_starts(counts), counts)) < order_s
    width_s[head] = 0
    z = np.repeat(bases, counts)
    group_s = width_s.astype(np.int64) * (MAX_ORDER + 1) + order_s
    for w, o, _rows, residual in streams:
        if residual is not None:
            z[group_s == w * (MAX_ORDER + 1) + o] += residual
    if len(heads):
        z[head] = heads
        for times in range(1, MAX_ORDER + 1):
            sel = order_s >= times
            if sel.all():
                z = _cumsum_series(z, counts)
            elif sel.any():
                z[sel] = _cumsum_series(z[sel], counts[orders >= times])
    return z
