"""The real price's formula (docs/pricing.md) on hand-made windows, and its aggregation."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
import pytest

from contract import signals
from engine.window import RankInfo
from investigations.pricing import UsageRow, real_price, split_gpu_time


@dataclass
class Window:
    times: np.ndarray
    dt: float
    ranks: list[RankInfo]
    gpu: dict[str, np.ndarray] = field(default_factory=dict)
    proc: dict[str, np.ndarray] = field(default_factory=dict)


def _window(engine: list[list[float]], sync_ms: list[list[float]] | None = None) -> Window:
    e = np.array(engine, dtype=float)
    ranks = [RankInfo(r, "node-a", f"GPU-{r}", r, 100 + r) for r in range(e.shape[0])]
    w = Window(1000.0 + np.arange(e.shape[1]), 1.0, ranks)
    w.gpu[signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE] = e
    if sync_ms is not None:
        w.proc[signals.CUDA_SYNC_MS] = np.array(sync_ms, dtype=float)
    return w


def test_waiting_in_collectives_is_not_compute() -> None:
    # Rank 0 computes the whole time; rank 1's engine is as busy but it spends 400 ms of each
    # second blocked waiting for rank 0 (the NCCL kernel spins: engine active).
    w = _window([[1.0] * 4, [1.0] * 4], [[0.0] * 4, [400.0] * 4])
    fast, slow = split_gpu_time(w)
    assert (fast.gpu_seconds, fast.compute_seconds, fast.wait_seconds) == (4.0, 4.0, 0.0)
    assert slow.compute_seconds == pytest.approx(2.4) and slow.wait_seconds == pytest.approx(1.6)
    assert slow.method == "engine+ebpf"


def test_idle_unsampled_and_the_accounting_range() -> None:
    nan = float("nan")
    w = _window([[0.5, nan, 0.0, 1.0]], [[900.0, 0.0, 0.0, 0.0]])
    [s] = split_gpu_time(w)
    # The unsampled second is not counted; wait can never exceed busy.
    assert s.gpu_seconds == 3.0
    assert s.wait_seconds == pytest.approx(0.5)  # 900 ms of sync capped at 0.5 busy
    assert s.idle_seconds == pytest.approx(0.5 + 1.0)
    assert s.compute_seconds == pytest.approx(1.0)
    # (after, until]: only the samples at 1002 and 1003.
    [s] = split_gpu_time(w, after=1001.0, until=1003.0)
    assert (s.gpu_seconds, s.first_ts, s.last_ts) == (2.0, 1002.0, 1003.0)
    assert split_gpu_time(w, after=1003.0) == []


def test_without_ebpf_or_profiling_the_method_says_so() -> None:
    w = _window([[0.8, 0.8]])
    [s] = split_gpu_time(w)
    assert s.method == "engine" and s.compute_seconds == pytest.approx(1.6)
    w = Window(np.array([0.0, 1.0]), 1.0, [RankInfo(0, "n", "GPU-0", 0, 1)])
    w.gpu[signals.DCGM_FI_DEV_GPU_UTIL] = np.array([[50.0, 100.0]])
    [s] = split_gpu_time(w)
    assert s.method == "util" and s.compute_seconds == pytest.approx(1.5)


def test_effective_price_is_list_price_over_share_and_weights_models() -> None:
    prices = {"H100": (Decimal("2.49"), "USD"), "A100": (Decimal("1.29"), "USD")}
    one = real_price([UsageRow("H100", 4 * 3600.0, 2.92 * 3600, 1.0, 0.1, "engine+ebpf")], prices)
    assert one.productive_share == pytest.approx(0.73)
    assert one.list_cost == Decimal("9.9600")
    assert one.effective_price_per_productive_gpu_hour == Decimal("3.4110")  # 2.49 / 0.73
    mixed = real_price(
        [
            UsageRow("H100", 3600.0, 1800.0, 0.0, 0.0, "engine+ebpf"),
            UsageRow("A100", 3600.0, 3600.0, 0.0, 0.0, "engine+ebpf"),
        ],
        prices,
    )
    # (2.49 + 1.29) list cost over 1.5 productive hours.
    assert mixed.effective_price_per_productive_gpu_hour == Decimal("2.5200")
    unpriced = real_price([UsageRow("B200", 3600.0, 1800.0, 0.0, 0.0, "engine")], prices)
    assert unpriced.list_cost is None and unpriced.unpriced_models == ("B200",)
    assert unpriced.productive_share == 0.5
    two_currencies = real_price(
        [UsageRow("H100", 3600.0, 1800.0, 0, 0, ""), UsageRow("X", 3600.0, 1800.0, 0, 0, "")],
        {**prices, "X": (Decimal("1"), "EUR")},
    )
    assert two_currencies.list_cost is None and two_currencies.currency is None
    assert real_price([], prices).productive_share is None
