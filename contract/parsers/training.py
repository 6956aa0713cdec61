"""Training-progress parsers: what the frameworks print on stdout, as structured fields.

`parse_line(line)` auto-detects the framework and returns a `ParsedLine` or None (the line is
not one we understand; the log collector still keeps it as a plain log record). One function
per framework is exported too (`parse_megatron`, `parse_deepspeed`, `parse_hf_trainer`,
`parse_torchtitan`, `parse_nanogpt`, `parse_lightning`, `parse_axolotl`) plus the
framework-independent lines (`parse_common`: checkpoints, NCCL watchdog timeouts, CUDA OOM,
"training completed", launcher/srun exit codes, NCCL init and bus bandwidth).

Launcher prefixes are stripped first and give the rank: `[rank3]:` (torchrun), `[1,9]<stdout>:`
(Open MPI), `12: ` (srun --label).

Multi-line tracebacks need state: `LogParser.feed(line)` wraps `parse_line` and marks Python
tracebacks (`Traceback (most recent call last):` … indented frames … `SomeError: msg`) and C++
stacks (`Exception raised from … (most recent call first):` then `frame #N:` lines, ended by a
blank line) as `traceback_start` / `traceback_frame` / `traceback_end`, the end carrying the
exception text in `error`; it also remembers the last step seen so that lines without one
(a checkpoint save, an error) can be attributed to a step.

Kinds (`ParsedLine.kind`): progress, eval, checkpoint_begin, checkpoint_end, nccl_timeout,
nccl_error, nccl_init, nccl_bandwidth, cuda_oom, fatal (C++ terminate), completed, exit,
traceback_start,
traceback_frame, traceback_end.

Cost: every pattern is precompiled and gated by a plain substring test, so a line that is none
of these costs a handful of `in` checks. Measured with
`python -m agent.tests.bench_training_parser`: ~180,000 lines/s on the fixtures.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

PROGRESS = "progress"
EVAL = "eval"
CHECKPOINT_BEGIN = "checkpoint_begin"
CHECKPOINT_END = "checkpoint_end"
NCCL_TIMEOUT = "nccl_timeout"
NCCL_ERROR = "nccl_error"
NCCL_INIT = "nccl_init"
NCCL_BANDWIDTH = "nccl_bandwidth"
CUDA_OOM = "cuda_oom"
COMPLETED = "completed"
EXIT = "exit"
TRACEBACK_START = "traceback_start"
TRACEBACK_FRAME = "traceback_frame"
TRACEBACK_END = "traceback_end"
FATAL = "fatal"

MEGATRON = "megatron"
DEEPSPEED = "deepspeed"
HF_TRAINER = "hf_trainer"
TORCHTITAN = "torchtitan"
NANOGPT = "nanogpt"
LIGHTNING = "lightning"
AXOLOTL = "axolotl"
PYTORCH = "pytorch"
NCCL = "nccl"
GLOO = "gloo"
GENERIC = "generic"


@dataclass(slots=True)
class ParsedLine:
    kind: str
    framework: str
    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    val_loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    iter_ms: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None  # percent, as printed
    loss_scale: float | None = None
    skipped_iters: int | None = None
    nan_iters: int | None = None
    consumed_samples: int | None = None
    consumed_tokens: int | None = None
    global_batch_size: int | None = None
    memory_gib: float | None = None
    path: str | None = None  # checkpoint path
    rank: int | None = None  # from a launcher prefix or the line itself
    nranks: int | None = None
    op: str | None = None  # NCCL collective (watchdog timeout)
    seq: int | None = None
    timeout_ms: int | None = None
    ran_ms: int | None = None
    busbw_gbps: float | None = None
    exit_code: int | None = None
    error: str | None = None

    @property
    def loss_is_finite(self) -> bool:
        return self.loss is None or math.isfinite(self.loss)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of the fields that are set. A NaN/Inf loss (or other value) is not
        representable in trace JSON, so it becomes `<field>_nonfinite: "nan" | "inf" | "-inf"`
        with the field itself left out."""
        out: dict[str, Any] = {}
        for f in _FIELD_NAMES:
            v = getattr(self, f)
            if v is None:
                continue
            if type(v) is float and not math.isfinite(v):
                out[f + "_nonfinite"] = "nan" if v != v else ("inf" if v > 0 else "-inf")
                continue
            out[f] = v
        return out


_FIELD_NAMES = tuple(f.name for f in fields(ParsedLine))


def _num(text: str) -> float:
    """A printed number: `7,034`, `1.064275E+01`, `nan`, `NAN`, `inf`, `-inf`."""
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


# --- launcher prefixes -----------------------------------------------------------------------
_PREFIX_TORCHRUN = re.compile(r"\[(?:rank|Rank|RANK)\s*(\d+)\]:\s?")
_PREFIX_MPI = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr)>:")
_PREFIX_SRUN = re.compile(r"\s{0,8}(\d+): ")
# `torchrun --tee 3` (and --redirects with a log dir) prefixes `[<role><local rank>]:`, e.g.
# `[default0]:` or `[trainer1]:`. The number is the LOCAL rank: on one node it equals the rank,
# but across nodes it does not, and the line does not say which node it came from, so the
# prefix is stripped and no rank is claimed (the caller keys the line from its process).
_PREFIX_TORCHRUN_TEE = re.compile(r"\[[A-Za-z_][\w-]*?\d+\]:")


def strip_prefix(line: str) -> tuple[str, int | None]:
    """The line without its launcher prefix, and the rank the prefix names (or None)."""
    if not line:
        return line, None
    c = line[0]
    if c == "[":
        m = _PREFIX_TORCHRUN.match(line) or _PREFIX_MPI.match(line)
        if m:
            return line[m.end() :], int(m.group(1))
        m = _PREFIX_TORCHRUN_TEE.match(line)
        if m:
            return line[m.end() :], None
    elif c.isdigit() or c == " ":
        m = _PREFIX_SRUN.match(line)
        if m:
            return line[m.end() :], int(m.group(1))
    return line, None


# --- Megatron-LM / Megatron-DeepSpeed --------------------------------------------------------
_MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|(.*)")
_MEGATRON_KEYS: dict[str, str] = {
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "elapsed time per iteration (ms)": "iter_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "TFLOPs": "tflops_per_gpu",
    "learning rate": "lr",
    "global batch size": "global_batch_size",
    "lm loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "number of skipped iterations": "skipped_iters",
    "number of nan iterations": "nan_iters",
    "samples per second": "samples_per_s",
    "tokens per second": "tokens_per_s",
    "tokens per second per GPU": "tokens_per_s",
}
_INT_FIELDS = frozenset(
    {"skipped_iters", "nan_iters", "consumed_samples", "consumed_tokens", "global_batch_size"}
)


def parse_megatron(line: str) -> ParsedLine | None:
    if "iteration" not in line:
        return None
    m = _MEGATRON_ITER.search(line)
    if m is None:
        return None
    p = ParsedLine(PROGRESS, MEGATRON, step=int(m.group(1)), total_steps=int(m.group(2)))
    for part in m.group(3).split("|"):
        key, sep, value = part.partition(":")
        if not sep:
            continue
        key = key.strip()
        attr = _MEGATRON_KEYS.get(key)
        if attr is None and key.endswith("loss") and p.loss is None:
            attr = "loss"  # other objectives print e.g. "mlm loss"
        if attr is None:
            continue
        try:
            num = _num(value.strip())
        except ValueError:
            continue
        setattr(p, attr, int(num) if attr in _INT_FIELDS else num)
    if p.samples_per_s is None and p.global_batch_size and p.iter_ms:
        p.samples_per_s = p.global_batch_size / (p.iter_ms / 1000.0)
    return p


# --- DeepSpeed engine ------------------------------------------------------------------------
# `steps: 100 loss: 2.1234 iter time (s): 0.512 samples/sec: 62.500` (engine, steps_per_print)
_DS_STEPS = re.compile(r"\bsteps: (\d+) loss: (\S+) iter time \(s\): (\S+) samples/sec: (\S+)")
# `[Rank 0] step=100, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]`
_DS_STEP = re.compile(r"\bstep=(\d+), skipped=(\d+), lr=\[([^\],]+)")
# timer: `epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=220.69,
#         CurrSamplesPerSec=222.88, MemAllocated=0.07GB, MaxMemAllocated=1.36GB`
_DS_TIMER = re.compile(
    r"epoch=(\d+)/micro_step=\d+/global_step=(\d+), RunningAvgSamplesPerSec=\S+,"
    r" CurrSamplesPerSec=([\d.eE+-]+)(?:, MemAllocated=([\d.]+)GB)?"
)
_DS_RANK = re.compile(r"\[Rank (\d+)\]")


def parse_deepspeed(line: str) -> ParsedLine | None:
    if "steps: " in line:
        m = _DS_STEPS.search(line)
        if m:
            try:
                return ParsedLine(
                    PROGRESS,
                    DEEPSPEED,
                    step=int(m.group(1)),
                    loss=_num(m.group(2)),
                    iter_ms=_num(m.group(3)) * 1000.0,
                    samples_per_s=_num(m.group(4)),
                )
            except ValueError:
                return None
    if "step=" in line:
        m = _DS_STEP.search(line)
        if m:
            try:
                lr = _num(m.group(3))
            except ValueError:
                lr = None
            rk = _DS_RANK.search(line)
            return ParsedLine(
                PROGRESS,
                DEEPSPEED,
                step=int(m.group(1)),
                skipped_iters=int(m.group(2)),
                lr=lr,
                rank=int(rk.group(1)) if rk else None,
            )
        m = _DS_TIMER.search(line)
        if m:
            return ParsedLine(
                PROGRESS,
                DEEPSPEED,
                epoch=float(m.group(1)),
                step=int(m.group(2)),
                samples_per_s=float(m.group(3)),
                memory_gib=float(m.group(4)) if m.group(4) else None,
            )
    return None


# --- Hugging Face Trainer --------------------------------------------------------------------
_HF_PAIR = re.compile(r"'(\w+)': '?([-+\w.]+)'?")
_HF_KEYS: dict[str, str] = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "epoch": "epoch",
    "eval_loss": "val_loss",
    "train_loss": "loss",
    "train_samples_per_second": "samples_per_s",
    "eval_samples_per_second": "samples_per_s",
    "step": "step",
}


def parse_hf_trainer(line: str) -> ParsedLine | None:
    """`{'loss': 1.3736, …}` (transformers 4) or `{'loss': '4.046', …}` (5: values as strings).

    The dict may sit at the end of a progress-bar line: where stdout and stderr share one file
    (a Slurm job log, `2>&1`), tqdm's `\r` bar text runs on until the next newline, which is
    the dict's."""
    start = line.find("{'")
    if start < 0:
        return None
    s = line[start:].rstrip()
    if not s.endswith("}"):
        return None
    values: dict[str, str] = dict(_HF_PAIR.findall(s))
    if "train_runtime" in values:
        kind = COMPLETED
    elif "eval_loss" in values:
        kind = EVAL
    elif "loss" in values or "grad_norm" in values:
        kind = PROGRESS
    else:
        return None
    p = ParsedLine(kind, HF_TRAINER)
    for key, attr in _HF_KEYS.items():
        text = values.get(key)
        if text is None or (attr == "loss" and p.loss is not None):
            continue
        try:
            num = _num(text)
        except ValueError:
            continue
        setattr(p, attr, int(num) if attr == "step" else num)
    return p


# --- tqdm progress bars (HF Trainer, axolotl, Lightning) -------------------------------------
_TQDM = re.compile(
    r"(?:([A-Z][\w ]*?\d*):\s*)?\s*(\d+)%\|[^|]*\|\s*(\d+)/(\d+) \[([\d:]+)<([\d:?]+),\s*([\d.]+)(it/s|s/it)(?:, ([^\]]*))?"
)
_LIGHTNING_METRIC = re.compile(r"(\w+)=([-+\w.]+)")
# Lightning's rich bar (the default when `rich` is installed), as a non-terminal gets it:
# `Epoch 4/4  ━━━━━━━━━━━━━━━━━ 32/32 0:00:06 • 0:00:00 5.16it/s train_loss_step: 0.607`
# (at 80 columns the metric values wrap onto the next lines, which say nothing on their own).
_RICH_EPOCH = re.compile(
    r"Epoch (\d+)/(\d+)\s+[━╸╺ ]*\s*(\d+)/(\d+) [\d:]+ • [\d:-]+ ([\d.]+)(it/s|s/it)(.*)"
)
_RICH_METRIC = re.compile(r"(\w+): ([-+\w.]+)")
# Bars that are not training progress but say a save is being written (transformers 5 prints
# "Writing model shards" at every checkpoint; at its default verbosity nothing else marks it).
_SAVE_BARS = ("Writing model shards",)


def _metric(text: str) -> float | None:
    """A metric as a bar prints it; Lightning's tqdm bar prints a NaN loss as `nan.0`."""
    try:
        return _num(text)
    except ValueError:
        if text.endswith(".0"):
            with contextlib.suppress(ValueError):
                return _num(text[:-2])
    return None


def _lightning_loss(p: ParsedLine, metrics: dict[str, str]) -> None:
    for key in ("train_loss_step", "train_loss", "loss"):
        if key in metrics:
            p.loss = _metric(metrics[key])
            break
    if "val_loss" in metrics:
        p.val_loss = _metric(metrics["val_loss"])


def _rich(line: str) -> ParsedLine | None:
    if "Epoch " not in line:
        return None
    m = _RICH_EPOCH.search(line)
    if m is None:
        return None
    rate = float(m.group(5))
    p = ParsedLine(PROGRESS, LIGHTNING, epoch=float(m.group(1)))
    p.iter_ms = 1000.0 / rate if m.group(6) == "it/s" and rate > 0 else rate * 1000.0
    _lightning_loss(p, dict(_RICH_METRIC.findall(m.group(7))))
    return p


def _tqdm(line: str) -> ParsedLine | None:
    if "it/s" not in line and "s/it" not in line:
        return None
    # \r-collapsed bars: the last one on the line is the newest state
    last = None
    for found in _TQDM.finditer(line):
        last = found
    if last is None:
        return _rich(line)
    rate = float(last.group(7))
    iter_ms = 1000.0 / rate if last.group(8) == "it/s" and rate > 0 else rate * 1000.0
    label = last.group(1)
    if label:
        if label.startswith(_SAVE_BARS):
            # A save in progress; LogParser gives it the step of the last progress line.
            return ParsedLine(CHECKPOINT_BEGIN, HF_TRAINER)
        if not label.startswith("Epoch "):
            return None  # "Validation DataLoader 0:", "Loading checkpoint shards:", "Map:"…
        # Lightning: "Epoch N: ... v_num=0, train_loss_step=1.310"
        p = ParsedLine(PROGRESS, LIGHTNING, epoch=float(label.split()[1]))
        p.iter_ms = iter_ms
        _lightning_loss(p, dict(_LIGHTNING_METRIC.findall(last.group(9) or "")))
        return p
    return ParsedLine(
        PROGRESS,
        HF_TRAINER,
        step=int(last.group(3)),
        total_steps=int(last.group(4)),
        iter_ms=iter_ms,
    )


# --- torchtitan ------------------------------------------------------------------------------
_TITAN = re.compile(
    r"\bstep:\s*(\d+)\s+loss:\s*(\S+)(?:\s+grad_norm:\s*(\S+))?\s+memory:\s*([\d.]+)GiB"
    r"(?:\([^)]*\))?\s+tps:\s*([\d,]+)(?:\s+tflops:\s*([\d.]+))?(?:\s+mfu:\s*([\d.]+)%)?"
)


def parse_torchtitan(line: str) -> ParsedLine | None:
    if "step:" not in line:
        return None
    m = _TITAN.search(line)
    if m is None:
        return None
    try:
        return ParsedLine(
            PROGRESS,
            TORCHTITAN,
            step=int(m.group(1)),
            loss=_num(m.group(2)),
            grad_norm=_num(m.group(3)) if m.group(3) else None,
            memory_gib=float(m.group(4)),
            tokens_per_s=_num(m.group(5)),
            tflops_per_gpu=float(m.group(6)) if m.group(6) else None,
            mfu=float(m.group(7)) if m.group(7) else None,
        )
    except ValueError:
        return None


# --- nanoGPT ---------------------------------------------------------------------------------
_NANO_ITER = re.compile(r"^iter (\d+): loss (\S+), time ([\d.]+)ms(?:, mfu (-?[\d.]+)%)?")
_NANO_EVAL = re.compile(r"^step (\d+): train loss (\S+), val loss (\S+)")


def parse_nanogpt(line: str) -> ParsedLine | None:
    if line.startswith("iter "):
        m = _NANO_ITER.match(line)
        if m:
            mfu = float(m.group(4)) if m.group(4) else None
            return ParsedLine(
                PROGRESS,
                NANOGPT,
                step=int(m.group(1)),
                loss=_num(m.group(2).rstrip(",")),
                iter_ms=float(m.group(3)),
                # nanoGPT prints -100% until its running MFU estimate has data
                mfu=mfu if mfu is not None and mfu >= 0 else None,
            )
    elif line.startswith("step "):
        m = _NANO_EVAL.match(line)
        if m:
            return ParsedLine(
                EVAL,
                NANOGPT,
                step=int(m.group(1)),
                loss=_num(m.group(2).rstrip(",")),
                val_loss=_num(m.group(3).rstrip(",")),
            )
    return None


# --- Lightning -------------------------------------------------------------------------------
_LIGHTNING_CKPT = re.compile(
    r"Epoch (\d+), global step (\d+): '(\w+)' reached (\S+) \(best \S+\), saving model to '([^']+)'"
)
_LIGHTNING_STOPPED = re.compile(r"`Trainer\.fit` stopped: (.*)")


def parse_lightning(line: str) -> ParsedLine | None:
    if "global step" in line:
        m = _LIGHTNING_CKPT.search(line)
        if m:
            return ParsedLine(
                CHECKPOINT_BEGIN,
                LIGHTNING,
                epoch=float(m.group(1)),
                step=int(m.group(2)),
                path=m.group(5),
                val_loss=_num(m.group(4)) if m.group(3) == "val_loss" else None,
            )
    if "Trainer.fit` stopped" in line:
        m = _LIGHTNING_STOPPED.search(line)
        if m:
            return ParsedLine(COMPLETED, LIGHTNING, error=None)
    return None


# --- axolotl ---------------------------------------------------------------------------------
_AXOLOTL_RANK = re.compile(r"\[RANK:(\d+)\]")


def parse_axolotl(line: str) -> ParsedLine | None:
    if "[axolotl." not in line:
        return None
    p = parse_common(line)
    if p is None:
        return None
    p.framework = AXOLOTL
    m = _AXOLOTL_RANK.search(line)
    if m:
        p.rank = int(m.group(1))
    return p


# --- framework-independent lines -------------------------------------------------------------
_CKPT_BEGIN = (
    # Megatron: "saving checkpoint at iteration     100 to /ckpt"
    re.compile(r"(?<!successfully )saving checkpoint (?:at|from) iteration\s+(\d+) to (\S+)"),
    # HF Trainer / axolotl: "Saving model checkpoint to out/checkpoint-500"
    re.compile(r"Saving model checkpoint to (\S+)"),
    # nanoGPT: "saving checkpoint to out-shakespeare-char"
    re.compile(r"^saving checkpoint to (\S+)"),
    # DeepSpeed: "[Torch] Checkpoint global_step100 is about to be saved!"
    re.compile(r"Checkpoint global_step(\d+) is about to be saved"),
    # torchtitan: "Saving the checkpoint (or staging if async is enabled)."
    re.compile(r"Saving (?:the|a full) checkpoint"),
)
_CKPT_END = (
    re.compile(r"successfully saved checkpoint (?:at|from) iteration\s+(\d+) to (\S+)"),
    re.compile(r"Checkpoint global_step(\d+) is ready now"),
    re.compile(r"Finished saving the checkpoint"),
    re.compile(r"Model successfully saved to (\S+)"),
)
_CKPT_STEP_IN_PATH = re.compile(r"(?:checkpoint-|global_step|iter_0*)(\d+)")
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
    r".*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds"
)
# gloo (the CPU backend) when a collective's peer never comes: the line torch 2.13 raises,
# recorded here with a rank that stopped before its all-reduce:
# `RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out
# waiting 20000ms for recv operation to complete`
_GLOO_TIMEOUT = re.compile(r"gloo/.*\] Timed out waiting (\d+)ms for (\w+) operation to complete")


def collective_timeout(text: str) -> tuple[str, int] | None:
    """(operation, timeout in ms) when `text` is a collective-communication timeout: NCCL's
    watchdog or gloo's, as a line or as the message ending a traceback; else None."""
    if "Timed out waiting" in text:
        m = _GLOO_TIMEOUT.search(text)
        if m:
            return m.group(2), int(m.group(1))
    if "Watchdog caught" in text:
        w = _WATCHDOG.search(text)
        if w:
            return w.group(2), int(w.group(3))
    return None


_RANK_IN_LINE = re.compile(r"\[(?:PG ID \d+ PG GUID \S+ )?Rank (\d+)\]")
_NCCL_INIT = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nranks (\d+) .*Init COMPLETE")
_NCCL_BW = re.compile(r"# Avg bus bandwidth\s*:\s*([\d.]+)")
_NCCL_ERR = re.compile(
    r"NCCL WARN|NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError"
)
_EXIT_CODE = (
    re.compile(r"exits with return code = (-?\d+)"),  # DeepSpeed launcher
    re.compile(r"\bexitcode\s*:\s*(-?\d+)"),  # torchrun failure summary
    re.compile(r"Exited with exit code (\d+)"),  # srun
)
_TERMINATE = re.compile(
    r"terminate called (?:after throwing an instance of '[^']+'|recursively|without an active exception)"
)
_COMPLETED = re.compile(
    r"Training completed|training completed|Training finished|\[after training is done\]"
)


def parse_common(line: str) -> ParsedLine | None:
    if "heckpoint" in line or "saved" in line:
        for pat in _CKPT_END:
            m = pat.search(line)
            if m:
                return _checkpoint(CHECKPOINT_END, m, line)
        for pat in _CKPT_BEGIN:
            m = pat.search(line)
            if m:
                return _checkpoint(CHECKPOINT_BEGIN, m, line)
    if "Watchdog caught" in line:
        m = _WATCHDOG.search(line)
        if m:
            rk = _RANK_IN_LINE.search(line)
            return ParsedLine(
                NCCL_TIMEOUT,
                PYTORCH,
                seq=int(m.group(1)),
                op=m.group(2),
                timeout_ms=int(m.group(3)),
                ran_ms=int(m.group(4)),
                rank=int(rk.group(1)) if rk else None,
            )
    if "Timed out waiting" in line:
        gloo = collective_timeout(line)
        if gloo is not None:
            return ParsedLine(NCCL_TIMEOUT, GLOO, op=gloo[0], timeout_ms=gloo[1])
    if "NCCL" in line or "nccl" in line:
        if "Init COMPLETE" in line:
            m = _NCCL_INIT.search(line)
            if m:
                return ParsedLine(NCCL_INIT, NCCL, rank=int(m.group(1)), nranks=int(m.group(2)))
        m = _NCCL_ERR.search(line)
        if m:
            return ParsedLine(NCCL_ERROR, NCCL, error=line.strip()[:500])
    if "bus bandwidth" in line:
        m = _NCCL_BW.search(line)
        if m:
            return ParsedLine(NCCL_BANDWIDTH, NCCL, busbw_gbps=float(m.group(1)))
    if "terminate called" in line:
        m = _TERMINATE.search(line)
        if m:
            return ParsedLine(FATAL, GENERIC, error=m.group(0))
    if "out of memory" in line and "CUDA" in line:
        return ParsedLine(CUDA_OOM, PYTORCH, error=line.strip()[:500])
    if "xit" in line or "return code" in line:
        for pat in _EXIT_CODE:
            m = pat.search(line)
            if m:
                return ParsedLine(EXIT, GENERIC, exit_code=int(m.group(1)))
    if ("ompleted" in line or "inished" in line or "after training" in line) and _COMPLETED.search(
        line
    ):
        return ParsedLine(COMPLETED, GENERIC)
    return None


def _checkpoint(kind: str, m: re.Match[str], line: str) -> ParsedLine:
    groups = [g for g in m.groups() if g is not None]
    p = ParsedLine(kind, GENERIC)
    rk = _DS_RANK.search(line)
    if rk:
        p.rank = int(rk.group(1))
    for g in groups:
        if g.isdigit():
            p.step = int(g)
        else:
            p.path = g.strip("'\".,")
    if p.step is None and p.path:
        sm = _CKPT_STEP_IN_PATH.search(p.path)
        if sm:
            p.step = int(sm.group(1))
    return p


# --- auto-detection --------------------------------------------------------------------------
_FRAMEWORK_PARSERS: tuple[Callable[[str], ParsedLine | None], ...] = (
    parse_megatron,
    parse_nanogpt,
    parse_torchtitan,
    parse_hf_trainer,
    parse_deepspeed,
    parse_axolotl,
    parse_lightning,
)


def _parse_body(line: str) -> ParsedLine | None:
    try:
        return _parse_known(line)
    except ValueError:
        # A line shaped like a framework's progress line whose number does not parse (a
        # corrupted byte: `iter 50: loss 6\ufffd\ufffd871, …`, found by tests/fuzz): not a line
        # we know. It is still kept as the job's output; only no progress is read from it.
        return None


def _parse_known(line: str) -> ParsedLine | None:
    if line.startswith(_PY_TB_START) or (
        line.startswith("Exception raised from") and _CPP_TB_START.match(line)
    ):
        return ParsedLine(TRACEBACK_START, PYTORCH)
    # Order: most specific and most frequent first; every parser starts with a substring gate.
    for parse in _FRAMEWORK_PARSERS:
        p = parse(line)
        if p is not None:
            return p
    p = parse_common(line)
    if p is not None:
        if p.kind in (CHECKPOINT_BEGIN, CHECKPOINT_END, COMPLETED) and p.step is None:
            bar = _tqdm(line)  # a bar glued before the message (\r-collapsed output)
            if bar is not None:
                p.step = bar.step
        return p
    return _tqdm(line)


def parse_line(line: str) -> ParsedLine | None:
    """Parse one stdout/stderr line (without its newline); None when it says nothing we know."""
    body, rank = strip_prefix(line)
    p = _parse_body(body)
    if p is not None and rank is not None and p.rank is None:
        p.rank = rank
    return p


# --- multi-line state ------------------------------------------------------------------------
_PY_TB_START = "Traceback (most recent call last):"
_CPP_TB_START = re.compile(r"^Exception raised from .* \(most recent call first\):")
_PY_CHAINED = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
_PY = "py"
_CPP = "cpp"


class LogParser:
    """Stateful wrapper for one stream: tracebacks across lines and the last step seen.

    Tracebacks are tracked per launcher rank prefix, because ranks' output interleaves.
    """

    __slots__ = ("_in_tb", "last_step")

    def __init__(self) -> None:
        self._in_tb: dict[int | None, str] = {}
        self.last_step: int | None = None

    def feed(self, line: str) -> ParsedLine | None:
        body, rank = strip_prefix(line)
        state = self._in_tb.get(rank)
        if state is not None:
            tb = self._continue_traceback(state, body, rank)
            if tb is not None:
                return tb
        if body.startswith(_PY_TB_START):
            self._in_tb[rank] = _PY
            return ParsedLine(TRACEBACK_START, PYTORCH, rank=rank, step=self.last_step)
        if body.startswith("Exception raised from") and _CPP_TB_START.match(body):
            self._in_tb[rank] = _CPP
            return ParsedLine(TRACEBACK_START, PYTORCH, rank=rank, step=self.last_step)
        p = _parse_body(body)
        if p is None:
            return None
        if rank is not None and p.rank is None:
            p.rank = rank
        if p.step is not None:
            if p.kind in (PROGRESS, EVAL) and p.framework != LIGHTNING:
                self.last_step = p.step
        elif p.kind != PROGRESS:
            p.step = self.last_step
        return p

    def _continue_traceback(self, state: str, body: str, rank: int | None) -> ParsedLine | None:
        if state == _CPP:
            if body.startswith("frame #"):
                return ParsedLine(TRACEBACK_FRAME, PYTORCH, rank=rank)
            del self._in_tb[rank]
            if not body.strip():
                return ParsedLine(TRACEBACK_END, PYTORCH, rank=rank, step=self.last_step)
            return None  # the stack ended without a blank line; parse this line normally
        # Python: frames are indented; chained-exception banners and blank lines stay inside.
        if not body.strip() or body[0] in " \t" or body.startswith(_PY_CHAINED):
            return ParsedLine(TRACEBACK_FRAME, PYTORCH, rank=rank)
        if body.startswith(_PY_TB_START):
            return ParsedLine(TRACEBACK_FRAME, PYTORCH, rank=rank)
        del self._in_tb[rank]
        return ParsedLine(
            TRACEBACK_END, PYTORCH, rank=rank, step=self.last_step, error=body.strip()[:500]
        )
