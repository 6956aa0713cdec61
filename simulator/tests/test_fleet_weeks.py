"""The fleet-over-weeks simulator: its size, its failures (every mode, at known hours, after
their run-up), healthy GPUs' flat pre-existing counts, resets and moves, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from contract import signals
from simulator.fleet_weeks import MODE_XID, MODES, FleetWeeks, simulate

SBE = signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
REMAPS = signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS


@pytest.fixture(scope="module")
def fleet() -> FleetWeeks:
    return simulate(n_gpus=1024, days=30, seed=3)


def test_size_and_failures_of_every_mode_at_known_hours(fleet: FleetWeeks) -> None:
    assert fleet.n_gpus >= 1000 and fleet.hours == (30 + 14) * 24
    modes = {f.mode for f in fleet.failures}
    assert set(MODES) <= modes and "sudden" in modes
    assert {MODE_XID[m] for m in modes} >= {"XID 48", "XID 79", "XID 94/95", "link down"}
    for f in fleet.failures:
        assert fleet.history_hours + 48 <= f.hour < fleet.hours
        assert f.onset_hour <= f.hour
    # The failed GPU stops reporting after its failure; the run-up is in its counters.
    ecc = next(f for f in fleet.failures if f.mode == "ecc_dbe")
    _, last = fleet.counters[SBE]
    assert np.isnan(last[ecc.unit, ecc.hour + 2 :]).all()
    dbe_last = fleet.counters[signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL][1]
    assert np.nanmax(dbe_last[ecc.unit]) >= 1
    remap_fail = next(f for f in fleet.failures if f.mode == "remap_failure")
    assert np.nanmax(fleet.counters[signals.DCGM_FI_DEV_ROW_REMAP_FAILURE][1][remap_fail.unit]) == 1


def test_healthy_gpus_have_flat_old_counts_and_resets_and_moves_happen(fleet: FleetWeeks) -> None:
    failed = {f.unit for f in fleet.failures}
    first, last = fleet.counters[REMAPS]
    healthy = [i for i in range(fleet.n_gpus) if i not in failed]
    flat_old = [
        i for i in healthy if np.nanmin(first[i]) > 0 and np.nanmax(last[i]) == np.nanmin(first[i])
    ]
    assert len(flat_old) > 50  # pre-existing remaps that never move
    sbe_first, sbe_last = fleet.counters[SBE]
    prev = sbe_last[:, :-1]
    resets = np.nansum(sbe_first[:, 1:] < prev)
    assert resets > 10  # driver reloads restart the volatile counters
    moved = (fleet.node_of[:, 0] != fleet.node_of[:, -1]).sum()
    assert moved > 5


def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="n_gpus=12"):
        simulate(n_gpus=12)
    with pytest.raises(ValueError, match="history_days=2"):
        simulate(n_gpus=8, history_days=2)
