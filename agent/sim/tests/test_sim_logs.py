"""Simulated log lines have exactly the shape of real ones (fixtures copied from
../shared/fixtures/real/ into tests/data/): same text, same fields, same order; only numbers,
dates, paths and op names differ."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from agent.sim import simulate
from agent.sim.logs import StepLog, make_formatter, nccl_watchdog_lines, xid_line

DATA = Path(__file__).parent / "data"
_NUM = re.compile(r"NAN|nan|[-+]?\d[\d,]*(\.\d+)?(E[-+]\d+)?")


def shape(line: str) -> str:
    """The line with numbers, paths and op names blanked and runs of spaces collapsed."""
    line = re.sub(r"OpType=\w+", "OpType=#", line)
    line = re.sub(r"PCI:[0-9a-fA-F:.]+", "PCI:#", line)
    line = re.sub(r"(to|in) /\S+", r"\1 PATH", line)
    line = re.sub(r"to out-\S+", "to PATH", line)
    line = _NUM.sub("#", line)
    return re.sub(r"\s+", " ", line).strip()


def fixture_shapes(name: str) -> set[str]:
    text = (DATA / name).read_text()
    lines = [re.sub(r"^\d+: ", "", ln) for ln in text.splitlines()]  # srun task prefixes
    lines = [ln[ln.index("NVRM:") :] if "NVRM:" in ln else ln for ln in lines]
    return {shape(ln) for ln in lines if ln.strip()}


def _step(step: int = 20, loss: float = 8.9) -> StepLog:
    return StepLog(
        ts=1767600000.25,
        step=step,
        total_steps=500000,
        loss=loss,
        lr=6.9e-07,
        grad_norm=47.021,
        step_time_s=12.1378,
        tflops_per_gpu=872.5,
        tokens_per_s_per_gpu=7034.2,
        mfu=0.4119,
        global_batch=1024,
        seq_len=4096,
        loss_scale=262144.0,
        skipped=5,
        nan_iters=0,
        epoch=1.33,
        mem_gib=30.99,
        mem_pct=32.62,
    )


@pytest.mark.parametrize(
    ("framework", "fixture"),
    [
        ("megatron", "megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log"),
        ("hf_trainer", "hf_trainer_gemma_lora_skypilot.log"),
        ("torchtitan", "torchtitan_llama3_8b_8xH100_torchao_docs.log"),
        ("nanogpt", "nanogpt_shakespeare_char_with_checkpoint_saves.log"),
    ],
)
def test_step_lines_match_the_real_framework(framework: str, fixture: str) -> None:
    fmt = make_formatter(framework, "/fsx/checkpoints", world_size=8)
    lines = [line for _, line in fmt.step(_step())]
    assert lines and all(shape(line) in fixture_shapes(fixture) for line in lines), lines


def test_checkpoint_lines_match_the_real_framework() -> None:
    meg = make_formatter("megatron", "/fsx/checkpoints", world_size=8)
    real = fixture_shapes("megatron_checkpoint_save_hyperpod_slurm.log")
    lines = [ln for _, ln in meg.ckpt_begin(1.0, 1) + meg.ckpt_end(2.0, 1, 81.6)]
    assert all(shape(ln) in real for ln in lines), lines
    nano = make_formatter("nanogpt", "out-shakespeare-char", world_size=1)
    real = fixture_shapes("nanogpt_shakespeare_char_with_checkpoint_saves.log")
    assert shape(nano.ckpt_begin(1.0, 100)[0][1]) in real
    assert shape(nano.eval_line(1.0, 100, 2.4989, 2.5072)[1]) in real  # type: ignore[attr-defined]


def test_nan_loss_prints_as_each_framework_does() -> None:
    meg = make_formatter("megatron", "/x", world_size=8).step(_step(loss=float("nan")))[0][1]
    assert "lm loss: NAN |" in meg
    nano = make_formatter("nanogpt", "out", world_size=8).step(_step(loss=float("nan")))[0][1]
    assert nano.startswith("iter 20: loss nan, time ")


def test_failure_text_matches_real_nccl_and_xid_lines() -> None:
    real = fixture_shapes("pytorch_nccl_watchdog_timeout_deepspeed_launcher.log")
    first = nccl_watchdog_lines(1767600000.5, 3, 12, "ALLREDUCE", 131072000, 600000)[0]
    assert shape(first) in real
    assert shape(xid_line(79, 2, None)) in fixture_shapes(
        "journal_xid_79_fallen_off_bus_driver_535.log"
    )
    # The real XID 63 line has a pid and no name; ours prints pid/name unknown like XID 79.
    x63 = xid_line(63, 0, None)
    assert x63.endswith(
        "63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate."
    )


def test_log_timestamps_agree_with_record_ts() -> None:
    run = simulate("healthy_training", seed=9, duration_s=300, nodes=1)
    checked = 0
    for rec in run.discrete:
        m = re.search(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})", rec.get("line", ""))
        if rec["type"] == "log" and m:
            assert m.group(1) == time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(rec["ts"]))
            checked += 1
    framework = next(r for r in run.discrete if r["type"] == "job")["config"]["framework"]
    assert checked > 0 or framework in ("nanogpt", "hf_trainer")  # they print no dates
