"""The loss-based families on traces recorded from real training jobs (tiny GPT-2 runs on CPU
under `proof-agent exec`; agent/tests/data/real/README.md says exactly how): a healthy run gets
no verdict, an exploding learning rate `numerical_divergence` only, a learning rate of 0
`no_learning`, NaN weights mid-run `numerical_divergence` — with correct numbers in every
sentence."""

from __future__ import annotations

import io
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.rows import LogRow
from engine.analyze import analyze_trace
from engine.detectors.progress import (
    describe_change,
    detect_no_learning,
    detect_numerical_divergence,
    times,
)
from engine.store import TraceStore
from engine.tests.synthetic import steps, window
from engine.window import StepTable, build_job_window, parse_logs

REAL = Path(__file__).parents[2] / "agent" / "tests" / "data" / "real"


def verdicts(name: str) -> list[dict[str, Any]]:
    return analyze_trace(str(REAL / name), err=io.StringIO())


def steps_of(name: str, job: str) -> StepTable:
    return build_job_window(TraceStore.from_trace(str(REAL / name)), job).steps


@pytest.mark.parametrize(
    "name", ["hf_trainer/healthy.jsonl.gz", "hf_trainer/merged_healthy.jsonl.gz"]
)
def test_healthy_hf_trainer_run_gets_no_verdict(name: str) -> None:
    assert verdicts(name) == []


def test_progress_bars_are_steps_not_missing_losses() -> None:
    st = steps_of("hf_trainer/healthy.jsonl.gz", "123")
    assert st.has_loss is not None
    bars = ~st.has_loss
    # the bar's lines end at the saves (100, 200, 300); its last line repeats step 300
    assert st.step[bars].tolist() == [100.0, 200.0, 300.0]
    with_loss = st.with_loss()
    assert len(with_loss) == 30 and np.isfinite(with_loss.loss).all()
    # the dicts' steps: epoch × steps per epoch (32) read off a bar beside a dict
    assert with_loss.step.tolist() == [10.0 * k for k in range(1, 31)]
    assert with_loss.loss[0] == 2.878 and with_loss.loss[-1] == 0.08552


@pytest.mark.parametrize(
    ("name", "job"),
    [("hf_trainer/explode.jsonl.gz", "123"), ("hf_trainer/merged_explode.jsonl.gz", "125")],
)
def test_exploding_learning_rate_is_divergence_only(name: str, job: str) -> None:
    got = verdicts(name)
    assert [v["family"] for v in got] == ["numerical_divergence"]
    v = got[0]
    assert v["subject"]["job"] == job
    s = v["summary"]
    # 3.466 at step 10 → 12.41 at step 30 (3.58×) → peak 1,385 at step 190 (399.6×)
    assert "low of 3.466 (step 10," in s
    assert "to 12.41 at step 30" in s and "3.6× the low" in s
    assert "1,385 at step 190 (400× the low)" in s
    assert not re.search(r"-\d", s)  # no negative percentages or changes anywhere
    ev = {e["id"]: e for e in v["evidence"]}
    assert ev["e1"]["observed"] == 12.41 and ev["e1"]["baseline"] == 3.466
    assert ev["e2"]["observed"] == 1385.0
    for cited in re.findall(r"\[([^\]]+)\]", s):
        for e in cited.split(", "):
            assert e in ev, e


def test_learning_rate_zero_is_no_learning() -> None:
    got = verdicts("hf_trainer/lr0.jsonl.gz")
    assert [v["family"] for v in got] == ["no_learning"]
    assert "learning rate was 0 on all 30 logged steps" in got[0]["summary"]


def test_nan_weights_mid_run_is_divergence_even_though_the_trainer_prints_loss_0() -> None:
    got = verdicts("hf_trainer/nan.jsonl.gz")
    assert [v["family"] for v in got] == ["numerical_divergence"]
    v = got[0]
    assert v["title"] == "Training diverged: the gradients went non-finite"
    assert "at step 160" in v["summary"]
    assert "stayed so on 15 logged lines in a row" in v["summary"]
    grad = next(e for e in v["evidence"] if e["signal"] == "log: grad norm")
    assert grad["observed"] == "nan"
    assert grad["baseline"] == 0.5901  # median of the 15 logged before


@pytest.mark.parametrize(
    "name",
    [
        "lightning/rich_healthy.jsonl.gz",
        "lightning/tqdm_healthy.jsonl.gz",
        "lightning/rich_explode.jsonl.gz",
        "lightning/tqdm_explode.jsonl.gz",
    ],
)
def test_lightning_in_a_non_terminal_prints_too_little_to_judge(name: str) -> None:
    # Lightning redraws one bar with \r for the whole fit: the agent gets its last state only
    # (one progress line), so no loss history — no verdict, rather than a guess.
    assert verdicts(name) == []
    st = steps_of(name, "124")
    assert len(st.with_loss()) <= 1


def test_change_sentences_have_the_right_sign_and_scale() -> None:
    # the report: "loss went from 5.000 to 3942.500 (-78750.0%)"
    assert describe_change(5.0, 3942.5) == "rose 788× (from 5 to 3,942)"
    assert describe_change(4.05, 4.06) == "rose 0.2% (from 4.05 to 4.06)"
    assert describe_change(3.36, 0.51) == "fell 84.8% (from 3.36 to 0.51)"
    assert describe_change(4.05, 4.05) == "stayed at 4.05"
    assert describe_change(2.0, 5.0) == "rose 2.5× (from 2 to 5)"
    assert times(3.58) == "3.6×" and times(1318.2) == "1,318×"


def test_a_flat_rise_below_explosion_is_still_no_learning_with_a_positive_change() -> None:

    loss = np.linspace(4.0, 4.4, 40)  # never fell; rose 10%, far from an explosion
    f = detect_no_learning(window(steps=steps(loss), state="completed"))
    assert len(f) == 1
    assert "rose 8.7% (from 4.015 to 4.364)" in f[0].summary
    exploding = np.concatenate([np.full(10, 5.0), 5.0 * 2.0 ** np.arange(1, 31)])
    w = window(steps=steps(exploding), state="completed")
    assert detect_no_learning(w) == []


def _rows(lines: list[tuple[float, str]]) -> list[Any]:

    return [LogRow(ts, "n1", 7, 0, "stdout", line) for ts, line in lines]


def _dict(loss: float, epoch: float) -> str:
    return f"{{'loss': '{loss}', 'grad_norm': '1.2', 'learning_rate': '0.001', 'epoch': '{epoch}'}}"


def test_dict_steps_come_only_from_bars_that_end_right_after_a_dict() -> None:

    bar = "\r 33%|███▎      | {n}/300 [00:30<00:28,  1.00it/s]"
    # 32 steps per epoch; logged every 10; saves at 100 (a logging step) and at 155 (not)
    lines = [(1000.0 + k, _dict(3.0 - 0.01 * k, k / 32)) for k in range(10, 301, 10)]
    lines += [(1100.05, bar.format(n=100)), (1155.0, bar.format(n=155))]
    st = parse_logs(_rows(sorted(lines)))[0].with_loss()
    assert st.step.tolist() == [float(k) for k in range(10, 301, 10)]
    # only the off-step save: 5 s after its dict, no pair, no steps rather than wrong ones
    lines = [ln for ln in lines if "100/300" not in ln[1]]
    st = parse_logs(_rows(sorted(lines)))[0].with_loss()
    assert np.isnan(st.step).all()
    # two readings that disagree (a save 3 steps past a dict at fast steps): no steps either
    lines += [(1200.05, bar.format(n=200)), (1250.05, bar.format(n=253))]
    st = parse_logs(_rows(sorted(lines)))[0].with_loss()
    assert np.isnan(st.step).all()


def test_an_epoch_printed_too_coarsely_gives_no_steps() -> None:

    # transformers 4 rounds the epoch to 2 decimals: 10,000 steps per epoch, logged every 10
    lines = [(1000.0 + k, _dict(3.0, round(k / 10000, 2))) for k in range(10, 301, 10)]
    lines.append((1100.05, "\r 33%|███▎      | 100/300 [00:30<00:28,  1.00it/s]"))
    st = parse_logs(_rows(sorted(lines)))[0].with_loss()
    assert np.isnan(st.step).all()  # epochs 0.0, …, 0.01, 0.01, … cannot tell steps apart


def test_a_collapsed_lightning_bar_is_every_refresh_with_its_loss() -> None:
    # What Lightning's tqdm bar writes to a pipe: \r redraws and no newline until the fit
    # ends, each refresh with its train_loss_step (the shape of the workload suite's capture).
    refreshes = [
        f"Epoch {e}:  {k * 25}%|{'█' * k}{' ' * (4 - k)}| {k * 8}/32 "
        f"[00:0{k}<00:0{4 - k}, 12.00it/s, v_num=0, train_loss_step={4.0 - e * 0.5 - k * 0.1:.3f}]"
        for e in range(2)
        for k in range(1, 5)
    ]
    row = LogRow(1_796_154_500.0, "n0", 10, 0, "stderr", "\r".join(refreshes))
    table, _ckpts, _events = parse_logs([row])
    printed = table.with_loss()
    assert len(printed) == 8
    assert list(np.round(printed.loss, 3)) == [3.9, 3.8, 3.7, 3.6, 3.4, 3.3, 3.2, 3.1]
    # a bar without a loss stays one row: its refreshes add nothing its last one does not
    plain = "\r".join(f"{k * 25}%|{'█' * k}| {k}/4 [00:0{k}<00:00, 9.00it/s]" for k in range(1, 5))
    table, _c, _e = parse_logs([LogRow(1_796_154_500.0, "n0", 10, 0, "stderr", plain)])
    assert len(table) == 1


TEXT_LOGS = Path(__file__).parents[2] / "agent" / "tests" / "data" / "training"


def _prefix(st: StepTable, k: int) -> StepTable:
    """The first k rows: the table a live evaluation had after the k-th logged line."""
    cut: dict[str, Any] = {
        f.name: None if (v := getattr(st, f.name)) is None else v[:k] for f in fields(st)
    }
    return StepTable(**cut)


@pytest.mark.parametrize(
    ("name", "spike"),
    [
        # Megatron-LM 7B, iterations 10-100: grad norm 35.9 at iteration 50, 5.9x the median of
        # the lines before, while the loss kept falling (8.52 -> 8.22)
        ("megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log", 5.0),
        # BigScience 104B chronicle lines: grad norm 180,376 then 226,760 (65x the median
        # before) at iterations 16800-16801, the loss at 2.68 -> 2.66, under its low so far
        ("megatron_deepspeed_bigscience_tr8b_104B.log", 50.0),
    ],
)
def test_a_gradient_norm_spike_while_the_loss_falls_is_no_divergence_on_any_prefix(
    name: str, spike: float
) -> None:
    # The bound any earlier divergence rule on the gradient norm must keep (docs/detectors.md,
    # "Verdicts in seconds"): real runs spike their gradient norm 6-65x without diverging.
    lines = (TEXT_LOGS / name).read_text().splitlines()
    st = parse_logs(_rows([(1000.0 + 10 * i, ln) for i, ln in enumerate(lines)]))[0].with_loss()
    g, loss = st.grad_norm, st.loss
    ratio = [g[i] / np.median(g[:i]) for i in range(3, len(st))]
    i = 3 + int(np.argmax(ratio))
    assert ratio[i - 3] >= spike and loss[i] < np.min(loss[:i]) * 1.001, (i, ratio, loss)
    for k in range(5, len(st) + 1):
        assert detect_numerical_divergence(window(steps=_prefix(st, k))) == [], k
