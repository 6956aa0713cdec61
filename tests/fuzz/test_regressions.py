"""Inputs the fuzz targets (tests/fuzz/) crashed on, each now refused or read as its API says."""

from __future__ import annotations

from contract.parsers import training


def test_a_progress_line_with_a_corrupted_number_is_no_progress() -> None:
    # Found by the `parsers` target in a real nanoGPT log (agent/tests/data/training/): two
    # bytes of the loss replaced, decoded with U+FFFD. `float()` raised ValueError out of
    # parse_line and LogParser.feed, which the agent's job-output collector calls per line.
    line = "iter 50: loss 6\ufffd\ufffd871, time 459.38ms, mfu 48.12%"
    assert training.parse_line(line) is None
    assert training.LogParser().feed(line) is None
    # The line it was cut from still parses, and so does an eval line with a bad number.
    good = training.parse_line("iter 50: loss 6.5871, time 459.38ms, mfu 48.12%")
    assert good is not None and good.step == 50 and good.loss == 6.5871
    assert training.parse_line("step 250: train loss 1.0x, val loss 1.2") is None
