"""The web process's collector settings (proof_web/heap.py): start-up objects frozen, the young
threshold raised, the older generations' ratios kept."""

from __future__ import annotations

import gc

from proof_web import heap


def test_settle_freezes_start_up_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        heap.settle()
        assert gc.get_freeze_count() > 1000  # the loaded modules, Django's included
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, before[1], before[2])
        assert before[0] < heap.YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
