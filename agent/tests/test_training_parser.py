"""The training-log parsers against every real log in tests/data/training and tests/data/nccl
(provenance in agent/tests/data/SOURCES.md)."""

import gzip
import json
from pathlib import Path

import pytest

from contract.parsers import training as t
from contract.parsers.training import LogParser, ParsedLine, parse_line

DATA = Path(__file__).parent / "data"
TRAINING = DATA / "training"
NCCL = DATA / "nccl"
DEEPSPEED = DATA / "deepspeed"


def lines(path: Path) -> list[str]:
    return path.read_text().split("\n")


def feed_all(path: Path) -> list[tuple[int, ParsedLine]]:
    """(1-based line number, parsed) for every line the stateful parser understood."""
    lp = LogParser()
    out = []
    for i, line in enumerate(lines(path), 1):
        p = lp.feed(line)
        if p is not None:
            out.append((i, p))
    return out


def at(path: Path, lineno: int) -> ParsedLine:
    p = parse_line(lines(path)[lineno - 1])
    assert p is not None, f"line {lineno} of {path.name} not parsed"
    return p


def test_every_fixture_file_is_covered_by_a_test() -> None:
    covered = {
        "axolotl_checkpoint_save_and_training_completed.log",
        "hf_trainer_gemma_lora_skypilot.log",
        "megatron_checkpoint_save_hyperpod_slurm.log",
        "megatron_deepspeed_bigscience_tr8b_104B.log",
        "megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log",
        "nanogpt_minlora_fp16_nan_loss.log",
        "nanogpt_minlora_fp32_loss_spike.log",
        "nanogpt_shakespeare_char_with_checkpoint_saves.log",
        "pytorch_lightning_fit_test_rtx4090.log",
        "pytorch_lightning_fit_with_checkpoint_saves_cpu.log",
        "torchtitan_llama3_8b_8xH100_torchao_docs.log",
        "nccl_debug_info_bootstrap_topology_p4d_efa_2node.log",
        "nccl_debug_info_init_complete_and_allreduce_perf_p4d_efa_2node.log",
        "pytorch_nccl_watchdog_timeout_deepspeed_launcher.log",
    }
    covered.add("deepspeed_engine_hellodeepspeed_bert_fp16_overflow.log")
    present = {p.name for p in [*TRAINING.iterdir(), *NCCL.iterdir(), *DEEPSPEED.glob("*.log")]}
    assert present == covered


def test_megatron_lm_core() -> None:
    f = TRAINING / "megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log"
    first = at(f, 2)  # iteration 10: every iteration skipped (fp16 overflow), no loss printed
    assert (first.kind, first.framework, first.step) == ("progress", "megatron", 10)
    assert first.total_steps == 500000 and first.loss is None and first.skipped_iters == 10
    assert first.iter_ms == 13035.3 and first.tflops_per_gpu == 812.5
    assert first.loss_scale == 8388608.0
    p = at(f, 8)
    assert p.step == 20 and p.loss == pytest.approx(10.64275) and p.grad_norm == 47.021
    assert p.lr == pytest.approx(6.976744e-07) and p.skipped_iters == 5 and p.nan_iters == 0
    assert p.samples_per_s == pytest.approx(1024 / 12.1378)  # global batch / iteration time
    last = at(f, 17)
    assert last.step == 100 and last.loss == pytest.approx(5.847192) and last.grad_norm == 7.679
    steps = [p.step for _, p in feed_all(f)]
    assert steps == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert parse_line(lines(f)[8]) is None  # "[Rank 0] (after 20 iterations) memory (MB) …"


def test_megatron_deepspeed_grad_norm_spike() -> None:
    f = TRAINING / "megatron_deepspeed_bigscience_tr8b_104B.log"
    parsed = [p for _, p in feed_all(f)]
    assert [p.step for p in parsed] == [6502, 6503, 6504, 8600, 12000, 12001, 14000, 16800, 16801]
    assert parsed[1].loss == pytest.approx(4.023108) and parsed[1].grad_norm == 3670.127
    assert parsed[1].consumed_tokens == 444497920
    assert parsed[4].grad_norm == 79683.827
    assert parsed[8].grad_norm == 226760.401 and parsed[8].samples_per_s == 0.005
    assert parsed[8].tflops_per_gpu == 33.85
    assert parsed[3].step == 8600  # the line with two leading spaces


def test_megatron_checkpoint_under_srun() -> None:
    f = TRAINING / "megatron_checkpoint_save_hyperpod_slurm.log"
    it = at(f, 1)
    assert it.step == 1 and it.rank == 1 and it.iter_ms == 440352.6
    begin, end = at(f, 2), at(f, 3)
    assert (begin.kind, begin.step, begin.path, begin.rank) == (
        "checkpoint_begin",
        1,
        "/fsx/checkpoints",
        0,
    )
    assert (end.kind, end.step, end.path) == ("checkpoint_end", 1, "/fsx/checkpoints")
    assert parse_line(lines(f)[4]) is None  # the save-checkpoint timer


def test_hf_trainer_dicts_and_tqdm() -> None:
    f = TRAINING / "hf_trainer_gemma_lora_skypilot.log"
    p = at(f, 4)
    assert (p.kind, p.framework) == ("progress", "hf_trainer")
    assert p.loss == 0.4633 and p.grad_norm == pytest.approx(1.5081373453140259)
    assert p.lr == pytest.approx(0.00015) and p.epoch == 2.67
    assert at(f, 10).lr == 0.0
    done = at(f, 11)
    assert done.kind == "completed" and done.samples_per_s == 5.427
    assert done.loss == pytest.approx(0.505131047964096)
    bar = at(f, 12)
    assert (bar.step, bar.total_steps) == (10, 10)
    assert bar.iter_ms == pytest.approx(1000 / 1.35)


def test_torchtitan() -> None:
    f = TRAINING / "torchtitan_llama3_8b_8xH100_torchao_docs.log"
    p = at(f, 2)
    assert (p.framework, p.step, p.rank) == ("torchtitan", 10, 0)
    assert p.loss == 10.7069 and p.tokens_per_s == 7034 and p.tflops_per_gpu == 407.35
    assert p.mfu == 41.19 and p.memory_gib == 30.99
    assert at(f, 3).loss == 8.9196  # "loss:  8.9196" (two spaces)
    assert parse_line(lines(f)[9]) is None  # the [GC] line
    assert len(feed_all(f)) == 14


def test_nanogpt_nan_loss() -> None:
    f = TRAINING / "nanogpt_minlora_fp16_nan_loss.log"
    first = at(f, 1)
    assert first.step == 0 and first.mfu is None  # "mfu -100.00%" means not yet measured
    ok = at(f, 11)
    assert ok.step == 100 and ok.loss == 4.8292 and ok.iter_ms == 460.11 and ok.mfu == 48.1
    bad = at(f, 12)
    assert bad.step == 110 and not bad.loss_is_finite
    d = bad.to_dict()
    assert d["loss_nonfinite"] == "nan" and "loss" not in d
    json.dumps(d, allow_nan=False)  # trace JSON stays strict
    assert sum(1 for _, p in feed_all(f) if not p.loss_is_finite) == 8


def test_nanogpt_loss_spike() -> None:
    f = TRAINING / "nanogpt_minlora_fp32_loss_spike.log"
    assert at(f, 11).loss == 4.8186
    spike = at(f, 12)
    assert spike.step == 110 and spike.loss == 270.3931 and spike.iter_ms == 1464.67


def test_nanogpt_eval_and_checkpoint_gets_last_step() -> None:
    f = TRAINING / "nanogpt_shakespeare_char_with_checkpoint_saves.log"
    ev = at(f, 16)
    assert (ev.kind, ev.step, ev.loss, ev.val_loss) == ("eval", 100, 2.4989, 2.5072)
    stateless = at(f, 17)
    assert stateless.kind == "checkpoint_begin" and stateless.path == "out-shakespeare-char"
    assert stateless.step is None
    by_line = dict(feed_all(f))
    assert by_line[17].step == 100  # attributed to the eval step just before it
    ckpts = [p.step for p in by_line.values() if p.kind == "checkpoint_begin"]
    assert ckpts == [100, 200, 300, 400, 500]
    assert parse_line("tokens per iteration will be: 16,384") is None


def test_lightning_progress_completion_and_test_bars() -> None:
    f = TRAINING / "pytorch_lightning_fit_test_rtx4090.log"
    done = at(f, 21)  # "…val_loss`Trainer.fit` stopped: `max_epochs=50` reached."
    assert done.kind == "completed" and done.framework == "lightning"
    bar = at(f, 22)
    assert (bar.framework, bar.epoch, bar.loss) == ("lightning", 49.0, 0.197)
    assert bar.iter_ms == pytest.approx(1000 / 3.90)
    assert parse_line(lines(f)[24]) is None  # "Testing DataLoader 0: 100%|…" is not training
    assert parse_line(lines(f)[1]) is None  # "GPU available: True (cuda), used: True"


def test_lightning_model_checkpoint_lines() -> None:
    f = TRAINING / "pytorch_lightning_fit_with_checkpoint_saves_cpu.log"
    c = at(f, 25)
    assert c.kind == "checkpoint_begin" and c.step == 75 and c.epoch == 2.0
    assert c.val_loss == 0.05822 and c.path == "/app/checkpoints/best-checkpoint-v1.ckpt"
    saves = [p.step for _, p in feed_all(f) if p.kind == "checkpoint_begin"]
    assert saves == [25, 50, 75, 100]  # epoch 4 "was not in top 1": no save
    # two bars \r-collapsed on one line: the newest (epoch 1, 100%) wins
    assert at(f, 24).kind == "checkpoint_begin"
    bar = parse_line(lines(f)[26])
    assert bar is not None and bar.loss == 0.152 and bar.val_loss == 0.0194
    assert any(p.kind == "completed" for _, p in feed_all(f))


def test_axolotl_checkpoint_and_completion() -> None:
    f = TRAINING / "axolotl_checkpoint_save_and_training_completed.log"
    save = at(f, 1)  # glued to the tqdm bar "1124/1124 [2:48:45<00:00, 16.34s/it]"
    assert (save.kind, save.framework, save.rank) == ("checkpoint_begin", "axolotl", 0)
    assert save.path == "models/base/checkpoint-1124" and save.step == 1124
    assert at(f, 2).kind == "completed"
    final = at(f, 3)
    assert final.kind == "checkpoint_end" and final.path == "models/base"


def test_nccl_watchdog_timeout_tracebacks_and_launcher_exit() -> None:
    f = NCCL / "pytorch_nccl_watchdog_timeout_deepspeed_launcher.log"
    assert parse_line(lines(f)[0]) is None  # "Loading extension module cpu_adam..."
    t0 = at(f, 5)
    assert t0.kind == "nccl_timeout" and t0.rank == 0 and t0.op == "BROADCAST"
    assert t0.seq == 1 and t0.timeout_ms == 600000 and t0.ran_ms == 600081
    assert at(f, 6).rank == 1 and at(f, 6).ran_ms == 600088
    parsed = feed_all(f)
    kinds = [p.kind for _, p in parsed]
    assert kinds.count("traceback_start") == 6  # every "Exception raised from" block
    assert kinds.count("traceback_end") == 6
    assert kinds.count("fatal") == 2
    starts = [i for i, p in parsed if p.kind == "traceback_start"]
    assert starts[0] == 16  # "Exception raised from checkTimeout at …"
    frames_after_first = [i for i, p in parsed if p.kind == "traceback_frame" and 16 < i < 24]
    assert frames_after_first == list(range(17, 24))
    exits = [p for _, p in parsed if p.kind == "exit"]
    assert [e.exit_code for e in exits] == [-6]
    assert exits[0].framework == "generic"


def test_nccl_info_init_and_bus_bandwidth() -> None:
    f = NCCL / "nccl_debug_info_init_complete_and_allreduce_perf_p4d_efa_2node.log"
    parsed = [p for _, p in feed_all(f)]
    inits = [p for p in parsed if p.kind == "nccl_init"]
    assert sorted(p.rank for p in inits if p.rank is not None) == list(range(16))
    assert {p.nranks for p in inits} == {16}
    bw = [p for p in parsed if p.kind == "nccl_bandwidth"]
    assert len(bw) == 1 and bw[0].busbw_gbps == 7.80081 and bw[0].rank == 0
    # the bandwidth table rows are not training progress
    assert all(p.kind in ("nccl_init", "nccl_bandwidth") for p in parsed)


def test_nccl_info_bootstrap_has_nothing_to_report() -> None:
    f = NCCL / "nccl_debug_info_bootstrap_topology_p4d_efa_2node.log"
    assert feed_all(f) == []
    body, rank = t.strip_prefix(lines(f)[0])
    assert rank == 9 and body.startswith("nccl-tests-efa-worker-1:26:26 [1] NCCL INFO")


def test_python_traceback_start_frames_end() -> None:
    text = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 10, in <module>',
        "[rank1]:     main()",
        "[rank0]: iter 5: loss 1.0000, time 10.00ms, mfu 1.00%",
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "[rank1]: iter 6: loss 1.5000, time 10.00ms, mfu 1.00%",
    ]
    lp = LogParser()
    got = [lp.feed(x) for x in text]
    kinds = [g.kind if g else None for g in got]
    assert kinds == [
        "traceback_start",
        "traceback_frame",
        "traceback_frame",
        "progress",
        "traceback_end",
        "progress",
    ]
    end = got[4]
    assert end is not None and end.rank == 1
    assert end.error is not None and end.error.startswith("torch.OutOfMemoryError: CUDA out")
    assert (oom := parse_line(text[4])) is not None and oom.kind == "cuda_oom"


def test_unknown_lines_return_none() -> None:
    for line in ["", "hello world", "Epoch", "loss", "{'a': 1}", "iteration", "step: x"]:
        assert parse_line(line) is None, line


def test_deepspeed_engine_timer_and_checkpoints() -> None:
    f = DEEPSPEED / "deepspeed_engine_hellodeepspeed_bert_fp16_overflow.log"
    step = at(f, 3)  # "[Rank 0] step=10, skipped=10, lr=[0.0001], mom=[(0.9, 0.999)]"
    assert (step.kind, step.framework, step.step, step.rank) == ("progress", "deepspeed", 10, 0)
    assert step.skipped_iters == 10 and step.lr == 0.0001
    timer = at(f, 4)
    assert (timer.framework, timer.step, timer.epoch) == ("deepspeed", 10, 0.0)
    assert timer.samples_per_s == pytest.approx(222.88787331278564)
    assert timer.memory_gib == 0.07
    begin, end = at(f, 6), at(f, 15)
    assert (begin.kind, begin.step, begin.rank) == ("checkpoint_begin", 10, 0)
    assert (end.kind, end.step) == ("checkpoint_end", 10)
    parsed = feed_all(f)
    assert [p.step for _, p in parsed if p.kind == "progress"] == [10, 10, 20, 20]
    assert at(f, 24).skipped_iters == 17
    # overflow, warning, per-file "[Torch] Saving/Saved" and loguru lines are kept unparsed
    assert {i for i, _ in parsed} == {3, 4, 6, 15, 24, 25}


# --- real captures: tiny jobs run here under `proof-agent exec` (data/real/README.md) --------
REAL = DATA / "real"


def real_logs(name: str) -> list[tuple[str, str]]:
    """(stream, line) of every log record of a real trace, in order, exactly as recorded."""

    out = []
    with gzip.open(REAL / name, "rt") as fh:
        for raw in fh:
            rec = json.loads(raw)
            if rec["type"] == "log":
                out.append((rec["stream"], rec["line"]))
    return out


def real_line(name: str, contains: str, nth: int = 0) -> str:
    found = [line for _, line in real_logs(name) if contains in line]
    assert len(found) > nth, f"no line {nth} with {contains!r} in {name}"
    return found[nth]


def test_every_real_capture_is_covered_by_a_test() -> None:
    present = {str(p.relative_to(REAL)) for p in REAL.rglob("*.jsonl.gz")}
    assert present == {
        "hf_trainer/healthy.jsonl.gz",
        "hf_trainer/explode.jsonl.gz",
        "hf_trainer/lr0.jsonl.gz",
        "hf_trainer/nan.jsonl.gz",
        "hf_trainer/merged_healthy.jsonl.gz",
        "hf_trainer/merged_explode.jsonl.gz",
        "lightning/rich_healthy.jsonl.gz",
        "lightning/rich_explode.jsonl.gz",
        "lightning/tqdm_healthy.jsonl.gz",
        "lightning/tqdm_explode.jsonl.gz",
    }


def test_hf_trainer_5_prints_metric_values_as_strings() -> None:
    p = parse_line(real_line("hf_trainer/healthy.jsonl.gz", "{'loss'"))
    assert p is not None and (p.kind, p.framework) == ("progress", "hf_trainer")
    assert (p.loss, p.grad_norm, p.lr, p.epoch, p.step) == (2.878, 1.345, 0.00291, 0.3125, None)
    zero = parse_line(real_line("hf_trainer/lr0.jsonl.gz", "{'loss'"))
    assert zero is not None and (zero.loss, zero.lr, zero.grad_norm) == (3.244, 0.0, 1.482)
    done = parse_line(real_line("hf_trainer/healthy.jsonl.gz", "train_runtime"))
    assert done is not None and done.kind == "completed"
    assert (done.loss, done.epoch) == (0.5078, 9.375)


def test_hf_trainer_nan_steps_print_loss_0_and_grad_norm_nan() -> None:
    # logging_nan_inf_filter (on by default) leaves NaN losses out of the logged average.
    lines = [ln for _, ln in real_logs("hf_trainer/nan.jsonl.gz") if ln.startswith("{'loss'")]
    parsed = [parse_line(ln) for ln in lines]
    assert len(parsed) == 30
    first_bad = next(
        i for i, p in enumerate(parsed) if p is not None and p.grad_norm != p.grad_norm
    )
    assert first_bad == 15  # step 160: the first window after the weights went NaN at 150
    p = parsed[first_bad]
    assert p is not None and p.loss == 0.0 and p.loss_is_finite
    assert p.to_dict()["grad_norm_nonfinite"] == "nan" and "grad_norm" not in p.to_dict()
    assert (last_good := parsed[first_bad - 1]) is not None and last_good.loss == 0.1922


def test_collapsed_bar_line_is_a_step_without_a_loss() -> None:
    # stderr: every \r state of the bar from the last newline up to the save at step 100
    line = real_line("hf_trainer/healthy.jsonl.gz", "100/300")
    assert line.count("\r") > 20 and line.startswith("\r")
    p = parse_line(line)
    assert p is not None and (p.kind, p.framework) == ("progress", "hf_trainer")
    assert (p.step, p.total_steps, p.loss, p.grad_norm, p.lr) == (100, 300, None, None, None)
    assert p.iter_ms == pytest.approx(1000 / 101.17)
    assert p.loss_is_finite and "loss_nonfinite" not in p.to_dict()
    # the first bar state shares its line with a warning and has no rate yet: nothing to read
    first = real_line("hf_trainer/healthy.jsonl.gz", "0/300 [00:00<?, ?it/s]")
    assert parse_line(first) is None


def test_writing_model_shards_bar_marks_the_save_at_the_last_step() -> None:
    rows = real_logs("hf_trainer/healthy.jsonl.gz")
    lp = LogParser()
    saves = []
    for _, line in rows:
        p = lp.feed(line)
        if p is not None and p.kind == "checkpoint_begin":
            saves.append((p.step, p.path, p.framework))
    assert saves == [
        (100, None, "hf_trainer"),
        (200, None, "hf_trainer"),
        (300, None, "hf_trainer"),
    ]
    shard = real_line("hf_trainer/healthy.jsonl.gz", "Writing model shards")
    assert "\x1b[A" in shard  # tqdm's cursor-up between the nested bar's two states


def test_metrics_dict_glued_after_bar_text_in_a_merged_log() -> None:
    # stdout and stderr in one file (as Slurm writes them): the bar runs on until the dict.
    line = real_line("hf_trainer/merged_explode.jsonl.gz", "'loss': '5.377'")
    assert line.startswith("\r  3%|") and "|" in line.split("{")[0]
    p = parse_line(line)
    assert p is not None and (p.kind, p.framework) == ("progress", "hf_trainer")
    assert (p.loss, p.grad_norm, p.lr, p.epoch) == (5.377, 8.112, 0.76, 0.625)
    assert p.step is None  # the bar in front lags the dict (rate-limited): not trusted
    losses = [
        q.loss
        for _, ln in real_logs("hf_trainer/merged_explode.jsonl.gz")
        if (q := parse_line(ln)) is not None and q.kind == "progress" and q.loss is not None
    ]
    assert len(losses) == 30 and losses[:5] == [3.466, 5.377, 12.41, 39.14, 121.6]
    assert max(losses) == 1385.0


def test_lightning_bars_as_a_non_terminal_gets_them() -> None:
    tq = parse_line(real_line("lightning/tqdm_explode.jsonl.gz", "Epoch 4: 100%"))
    assert tq is not None and (tq.kind, tq.framework, tq.epoch) == ("progress", "lightning", 4.0)
    assert tq.loss is not None and tq.loss != tq.loss  # printed `nan.0`
    assert tq.iter_ms == pytest.approx(1000 / 2.70)
    ok = parse_line(real_line("lightning/tqdm_healthy.jsonl.gz", "Epoch 4: 100%"))
    assert ok is not None and ok.loss == 0.607
    rich = parse_line(real_line("lightning/rich_healthy.jsonl.gz", "Epoch 4/4"))
    assert rich is not None and (rich.kind, rich.framework, rich.epoch) == (
        "progress",
        "lightning",
        4.0,
    )
    assert rich.iter_ms == pytest.approx(1000 / 2.79)
    assert rich.loss is None  # at 80 columns the value wrapped onto the next line
    wide = "Epoch 4/4  ━━━━━━━━━━━━━━━━━ 32/32 0:00:11 • 0:00:00 2.79it/s train_loss_step: 0.607"
    assert (wide_step := parse_line(wide)) is not None and wide_step.loss == 0.607


def test_torchrun_tee_prefix_is_stripped_without_claiming_a_rank() -> None:
    # What `torchrun --nproc_per_node 2 --tee 3` prints (torch 2.13.0, captured here): the
    # role name and the LOCAL rank, which is not the rank on a multi-node run.
    body, rank = t.strip_prefix("[default1]:iter 5: loss 1.0000, time 10.00ms, mfu 1.00%")
    assert body == "iter 5: loss 1.0000, time 10.00ms, mfu 1.00%" and rank is None
    p = t.parse_line("[trainer0]:iter 7: loss 2.5000, time 10.00ms, mfu 1.00%")
    assert p is not None and p.step == 7 and p.loss == 2.5 and p.rank is None
    # a bracketed word without a number is not a launcher prefix
    assert t.strip_prefix("[INFO]: starting")[0] == "[INFO]: starting"


GLOO_TIMEOUT = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete"
)


def test_gloo_and_nccl_collective_timeouts_are_recognised() -> None:
    # gloo's line as torch 2.13.0 CPU printed it here when a rank never reached its all-reduce
    body, rank = t.strip_prefix(GLOO_TIMEOUT)
    assert rank == 0 and t.collective_timeout(body) == ("recv", 20000)
    p = t.parse_line("[E1201 20:59:22 gloo] " + body.split("RuntimeError: ", 1)[1])
    assert p is not None and p.kind == t.NCCL_TIMEOUT and p.framework == t.GLOO
    assert (p.op, p.timeout_ms) == ("recv", 20000)
    nccl = (
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds"
    )
    assert t.collective_timeout(nccl) == ("ALLREDUCE", 600000)
    assert t.collective_timeout("Timed out waiting for the bus") is None
    # as the message ending a traceback (how torchrun's worker prints it) it is still found
    parser = t.LogParser()
    kinds = [
        parser.feed(line)
        for line in (
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "train.py", line 76, in main',
            GLOO_TIMEOUT,
        )
    ]
    end = kinds[-1]
    assert end is not None and end.kind == t.TRACEBACK_END and end.rank == 0
    assert end.error is not None and t.collective_timeout(end.error) == ("recv", 20000)
