"""forecast_services.build_batches on rollup rows (pure, no database): a GPU that moved from a
node in a hot spell to a cool one is compared with its node's peers only over the hours it
has been there, so the spell it left behind is not a heating GPU."""

from __future__ import annotations

import numpy as np

from contract import signals
from engine import forecast as fc
from investigations import forecast_services
from investigations.forecast_selectors import RollupRow

HOUR_MS = 3_600_000
HOURS = fc.LOOKBACK_DAYS * fc.HOURS_PER_DAY
TEMP = signals.DCGM_FI_DEV_GPU_TEMP


def _temps(series_id: int, gpu: str, node: str, hours: range, celsius: float) -> list[RollupRow]:
    return [
        RollupRow(series_id, TEMP, gpu, node, {}, h * HOUR_MS, celsius, celsius, celsius, celsius)
        for h in hours
    ]


def test_a_moved_gpu_is_judged_against_its_new_peers_only_since_it_arrived() -> None:
    moved_at = HOURS - 30
    rows: list[RollupRow] = []
    # Node "hot": every GPU at 70 °C, then a spell at 79 °C over the last four days.
    for k in range(3):
        rows += _temps(10 + k, f"GPU-hot-{k}", "hot", range(HOURS - 96), 70.0)
        rows += _temps(10 + k, f"GPU-hot-{k}", "hot", range(HOURS - 96, HOURS), 79.0)
    # The mover: in the spell with its peers, then on node "cool" (70 °C) for the last 30 h.
    rows += _temps(1, "GPU-mover", "hot", range(HOURS - 96), 70.0)
    rows += _temps(1, "GPU-mover", "hot", range(HOURS - 96, moved_at - 6), 79.0)
    rows += _temps(2, "GPU-mover", "cool", range(moved_at, HOURS), 70.0)
    for k in range(3):
        rows += _temps(20 + k, f"GPU-cool-{k}", "cool", range(HOURS), 70.0)
    batch = forecast_services.build_batches(rows, [], 0, HOURS)["gpu"]
    i = batch.keys.index("GPU-mover")
    assert batch.nodes[i] == "cool"
    rel = batch.daily[fc.TEMP_ABOVE_PEERS][i]
    # Only its hours on "cool" count: level with its peers there, no data before.
    assert np.nanmax(np.abs(rel)) == 0.0 and np.isnan(rel[:-2]).all()
    out = fc.forecast_batch(batch)
    assert out.level[i] == 0 and not out.active[i].any()
