"""`proof bench screen` runs on a short simulated run and prints its figures."""

from __future__ import annotations

import re

import pytest

from proof_web.cli import main


def test_bench_screen_prints_the_cost_per_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "screen", "--duration", "30", "--gpus-per-node", "2"])
    out = capsys.readouterr().out
    assert code == 0
    m = re.search(r"(\d+) batches of (\d+) series", out)
    assert m is not None and 25 <= int(m.group(1)) <= 31 and int(m.group(2)) > 50
    cost = re.search(r"([\d.]+) ms CPU a batch.*?([\d.]+) cores per 1,000 GPUs", out)
    assert cost is not None and 0 < float(cost.group(1)) < 50 and float(cost.group(2)) > 0
