"""Training stdout in the real line shapes of Megatron-LM, Hugging Face Trainer, torchtitan and
nanoGPT (the real samples in `agent/tests/data/training/`), plus the NCCL watchdog and CUDA
error text a failing rank prints (`agent/tests/data/nccl/`) and NVRM XID kernel lines
(`agent/tests/data/xid/`; provenance of all three in `agent/tests/data/SOURCES.md`).

A formatter turns one logged step into the line(s) its framework prints; the trace carries the
lines verbatim as `log` records, so detectors must parse them as they would on a real cluster.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

FRAMEWORKS: tuple[str, ...] = ("megatron", "hf_trainer", "torchtitan", "nanogpt")


@dataclass
class StepLog:
    """What a framework knows at a logged iteration (averaged over its log interval)."""

    ts: float
    step: int  # iteration number as the framework counts it
    total_steps: int
    loss: float
    lr: float
    grad_norm: float
    step_time_s: float  # mean wall time per iteration over the interval
    tflops_per_gpu: float
    tokens_per_s_per_gpu: float
    mfu: float  # 0–1
    global_batch: int
    seq_len: int
    loss_scale: float
    skipped: int
    nan_iters: int
    epoch: float
    mem_gib: float
    mem_pct: float


def _utc(ts: float, fmt: str) -> str:
    return time.strftime(fmt, time.gmtime(ts))


def _ms(ts: float) -> str:
    return f"{int((ts % 1) * 1000):03d}"


def _e(x: float) -> str:
    """Megatron's {:.6E}: nan prints as NAN, like Python's formatting of float('nan')."""
    return f"{x:.6E}"


class Formatter:
    name = "base"
    log_interval = 10

    def __init__(self, ckpt_dir: str, *, world_size: int) -> None:
        self.ckpt_dir = ckpt_dir
        self.world_size = world_size

    def preamble(self, ts: float, params_b: float) -> list[tuple[float, str]]:
        return []

    def step(self, s: StepLog) -> list[tuple[float, str]]:
        raise NotImplementedError

    def ckpt_begin(self, ts: float, step: int) -> list[tuple[float, str]]:
        raise NotImplementedError

    def ckpt_end(self, ts: float, step: int, seconds: float) -> list[tuple[float, str]]:
        return []

    def finished(self, ts: float, s: StepLog, runtime_s: float) -> list[tuple[float, str]]:
        return []


class Megatron(Formatter):
    """Megatron-LM core (r0.8): ` [date] iteration       10/  500000 | consumed samples: …`."""

    name = "megatron"
    log_interval = 10

    def preamble(self, ts: float, params_b: float) -> list[tuple[float, str]]:
        return [
            (ts, f"[before the start of training step] datetime: {_utc(ts, '%Y-%m-%d %H:%M:%S')} "),
            (ts, f"Total number of parameters in billions: {params_b:.2f}"),
        ]

    def step(self, s: StepLog) -> list[tuple[float, str]]:
        line = (
            f" [{_utc(s.ts, '%Y-%m-%d %H:%M:%S')}] iteration {s.step:8d}/{s.total_steps:8d} |"
            f" consumed samples: {s.step * s.global_batch:12d} |"
            f" elapsed time per iteration (ms): {s.step_time_s * 1000:.1f} |"
            f" throughput per GPU (TFLOP/s/GPU): {s.tflops_per_gpu:.1f} |"
            f" learning rate: {_e(s.lr)} |"
            f" global batch size: {s.global_batch:5d} |"
            f" lm loss: {_e(s.loss)} |"
            f" loss scale: {s.loss_scale:.1f} |"
            f" grad norm: {s.grad_norm:.3f} |"
            f" number of skipped iterations: {s.skipped:3d} |"
            f" number of nan iterations: {s.nan_iters:3d} |"
        )
        return [(s.ts, line)]

    def ckpt_begin(self, ts: float, step: int) -> list[tuple[float, str]]:
        return [(ts, f"saving checkpoint at iteration {step:7d} to {self.ckpt_dir}")]

    def ckpt_end(self, ts: float, step: int, seconds: float) -> list[tuple[float, str]]:
        ms = seconds * 1000
        return [
            (ts, f"  successfully saved checkpoint at iteration {step:7d} to {self.ckpt_dir}"),
            (ts, "(min, max) time across ranks (ms):"),
            (
                ts,
                f"    save-checkpoint ................................: ({ms * 0.9999:.2f}, {ms:.2f})",
            ),
        ]


# tqdm's bar: 10 cells of eighths, as it draws them on a non-terminal.
_TQDM_CELLS = " ▏▎▍▌▋▊▉█"


def _tqdm_interval(seconds: float) -> str:
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def tqdm_bar(n: int, total: int, elapsed_s: float, s_per_it: float, label: str = "") -> str:
    """One tqdm state: `` 33%|███▎      | 100/300 [00:02<00:03, 58.93it/s]``."""
    frac = min(1.0, n / total) if total else 0.0
    full, part = divmod(int(frac * 10 * 8), 8)
    cells = "█" * full + (_TQDM_CELLS[part] if full < 10 else "")
    cells = cells.ljust(10)
    if s_per_it <= 0:
        rate = "?it/s"
        remaining = "?"
    else:
        rate = f"{1 / s_per_it:5.2f}it/s" if s_per_it <= 1 else f"{s_per_it:5.2f}s/it"
        remaining = _tqdm_interval((total - n) * s_per_it)
    head = f"{label}: " if label else ""
    return (
        f"{head}{frac * 100:3.0f}%|{cells}| {n}/{total} "
        f"[{_tqdm_interval(elapsed_s)}<{remaining}, {rate}]"
    )


def _g4(x: float) -> str:
    """transformers 5 prints logged floats as strings with 4 significant digits."""
    return f"{x:.4g}"


class HFTrainer(Formatter):
    """Hugging Face Trainer: `{'loss': 1.3736, 'grad_norm': 3.41…, 'learning_rate': …, 'epoch': …}`.

    Four real shapes (`variant`, drawn per job from its checkpoint directory when not given;
    the real captures are in agent/tests/data/real/hf_trainer/):
    0. transformers 4 at `--log_level info`: float values, "Saving model checkpoint to" lines.
    1. transformers 5 at its default verbosity, in a Slurm log (stdout and stderr in one
       file): values as strings (`'loss': '4.046'`), the tqdm bar `\r`-collapsed in front of
       every metrics dict, a bar line at every save and a "Writing model shards" bar as the
       only mark of the save; NaN losses are left out of the logged average (the Trainer's
       default `logging_nan_inf_filter`), so a run of NaN steps prints `'loss': '0'` with
       `'grad_norm': 'nan'`.
    2. as 1, at `--log_level info`: the "Saving model checkpoint" lines as well.
    3. transformers 4 with the bar in the same file: floats, bars glued to the dicts.
    """

    name = "hf_trainer"
    log_interval = 10

    def __init__(self, ckpt_dir: str, *, world_size: int, variant: int | None = None) -> None:
        super().__init__(ckpt_dir, world_size=world_size)
        v = zlib.crc32(ckpt_dir.encode()) % 4 if variant is None else variant
        self.variant = v
        self.strings = v in (1, 2)
        self.bars = v != 0
        self.info_lines = v != 1
        self._t_start: float | None = None
        self._last_bar: int | None = None
        self._total = 0
        self._s_per_it = 0.0

    @staticmethod
    def _stamp(ts: float) -> str:
        return f"{_utc(ts, '%Y-%m-%d %H:%M:%S')},{_ms(ts)}"

    def _bar(self, n: int, ts: float) -> str:
        elapsed = max(0.0, ts - (self._t_start if self._t_start is not None else ts))
        return tqdm_bar(n, self._total, elapsed, self._s_per_it)

    def _dict(self, d: dict[str, float]) -> str:
        if not self.strings:
            return repr(d)
        return "{" + ", ".join(f"'{k}': '{_g4(v)}'" for k, v in d.items()) + "}"

    def step(self, s: StepLog) -> list[tuple[float, str]]:
        loss, grad = s.loss, s.grad_norm
        if self.strings and math.isnan(loss):
            loss = 0.0  # every step of the window was NaN: the filtered average is 0
        d = {
            "loss": round(loss, 4),
            "grad_norm": grad,
            "learning_rate": s.lr,
            "epoch": round(s.epoch, 4 if self.strings else 2),
        }
        if not self.bars:
            return [(s.ts, repr(d))]
        if self._t_start is None:
            self._t_start = s.ts - s.step * s.step_time_s
        self._total = s.total_steps
        self._s_per_it = s.step_time_s
        # What tqdm left on the line since the last newline: the redraw after the previous
        # dict, a rate-limited state or two, the clearing before `tqdm.write`, then the dict.
        prev = self._last_bar if self._last_bar is not None else s.step - self.log_interval
        states = [prev, (prev + s.step) // 2, s.step - 1]
        text = "".join(
            "\r" + self._bar(n, s.ts - (s.step - n) * s.step_time_s)
            for n in states
            if 0 <= n < s.step
        )
        self._last_bar = s.step
        return [(s.ts, text + "\r" + " " * 49 + "\r" + self._dict(d))]

    def ckpt_begin(self, ts: float, step: int) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        if self.bars and self._total:
            # The bar's line ends when the save's own bar starts on the next one.
            out.append((ts, "\r" + self._bar(step, ts)))
            self._last_bar = step
        if self.info_lines:
            out.append(
                (
                    ts,
                    f"[INFO|trainer.py:3705] {self._stamp(ts)} >> Saving model checkpoint to "
                    f"{self.ckpt_dir}/checkpoint-{step}",
                )
            )
        return out

    def ckpt_end(self, ts: float, step: int, seconds: float) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        if self.bars:
            # The weights are written first, then the optimizer state: the shard bar's line
            # ends inside the save.
            wrote = max(0.001, 0.6 * seconds)
            shard = (
                "\r"
                + tqdm_bar(0, 1, 0.0, 0.0, "Writing model shards")
                + "\x1b[A\r"
                + tqdm_bar(1, 1, wrote, wrote, "Writing model shards")
            )
            out.append((ts - seconds + wrote, shard))
        if self.info_lines:
            d = f"{self.ckpt_dir}/checkpoint-{step}"
            out += [
                (
                    ts,
                    f"[INFO|configuration_utils.py:472] {self._stamp(ts)} >> Configuration saved in {d}/config.json",
                ),
                (
                    ts,
                    f"[INFO|modeling_utils.py:2702] {self._stamp(ts)} >> Model weights saved in {d}/model.safetensors",
                ),
            ]
        return out

    def finished(self, ts: float, s: StepLog, runtime_s: float) -> list[tuple[float, str]]:
        steps_per_s = s.step / max(runtime_s, 1e-9)
        d = {
            "train_runtime": round(runtime_s, 4),
            "train_samples_per_second": round(steps_per_s * s.global_batch, 3),
            "train_steps_per_second": round(steps_per_s, 3),
            "train_loss": s.loss,
            "epoch": round(s.epoch, 2),
        }
        if not self.bars:
            return [(ts, repr(d))]
        bar = self._bar(s.step, ts)
        return [
            (ts, "\r" + " " * 49 + "\r" + self._dict(d)),
            (ts, "\r" + bar + "\r" + bar),
        ]


class Torchtitan(Formatter):
    """torchtitan: `[rank0]:[titan] <ts> - root - INFO - step: 10  loss: 10.7069  memory: …`."""

    name = "torchtitan"
    log_interval = 10

    @staticmethod
    def _prefix(ts: float) -> str:
        return f"[rank0]:[titan] {_utc(ts, '%Y-%m-%d %H:%M:%S')},{_ms(ts)} - root - INFO - "

    def step(self, s: StepLog) -> list[tuple[float, str]]:
        line = (
            f"{self._prefix(s.ts)}step: {s.step:2}  loss: {s.loss:7.4f}  "
            f"memory: {s.mem_gib:5.2f}GiB({s.mem_pct:.2f}%)  "
            f"tps: {round(s.tokens_per_s_per_gpu):,}  tflops: {s.tflops_per_gpu:,.2f}  "
            f"mfu: {s.mfu * 100:.2f}%"
        )
        return [(s.ts, line)]

    def ckpt_begin(self, ts: float, step: int) -> list[tuple[float, str]]:
        return [(ts, f"{self._prefix(ts)}Saving the checkpoint (or staging if async is enabled).")]

    def ckpt_end(self, ts: float, step: int, seconds: float) -> list[tuple[float, str]]:
        return [
            (
                ts,
                f"{self._prefix(ts)}Finished saving the checkpoint (or staging if async is "
                f"enabled)in {seconds:.2f} seconds.",
            )
        ]


class NanoGPT(Formatter):
    """nanoGPT: `iter 10: loss 3.4788, time 1705.53ms, mfu 0.22%`; `saving checkpoint to out`."""

    name = "nanogpt"
    log_interval = 10

    def __init__(self, ckpt_dir: str, *, world_size: int) -> None:
        super().__init__(ckpt_dir, world_size=world_size)
        self._running_mfu = -1.0

    def step(self, s: StepLog) -> list[tuple[float, str]]:
        mfu = s.mfu
        if self._running_mfu < 0:
            self._running_mfu = mfu
        else:
            self._running_mfu = 0.9 * self._running_mfu + 0.1 * mfu
        loss = "nan" if math.isnan(s.loss) else f"{s.loss:.4f}"
        return [
            (
                s.ts,
                f"iter {s.step}: loss {loss}, time {s.step_time_s * 1000:.2f}ms, "
                f"mfu {self._running_mfu * 100:.2f}%",
            )
        ]

    def ckpt_begin(self, ts: float, step: int) -> list[tuple[float, str]]:
        return [(ts, f"saving checkpoint to {self.ckpt_dir}")]

    def eval_line(
        self, ts: float, step: int, train_loss: float, val_loss: float
    ) -> tuple[float, str]:
        return ts, f"step {step}: train loss {train_loss:.4f}, val loss {val_loss:.4f}"


def make_formatter(
    name: str, ckpt_dir: str, *, world_size: int, variant: int | None = None
) -> Formatter:
    """The formatter of framework `name`; `variant` picks one of its real output shapes
    (HFTrainer's docstring lists them; None draws one per job from `ckpt_dir`)."""
    if name == "hf_trainer":
        return HFTrainer(ckpt_dir, world_size=world_size, variant=variant)
    cls = {
        "megatron": Megatron,
        "torchtitan": Torchtitan,
        "nanogpt": NanoGPT,
    }[name]
    return cls(ckpt_dir, world_size=world_size)


def _torch_stamp(ts: float) -> str:
    # [E1218 20:27:21.426415540 ...] — month/day and time with nanoseconds, as c10 logging prints.
    ns = int((ts % 1) * 1e9)
    return f"{_utc(ts, '%m%d %H:%M:%S')}.{ns:09d}"


def nccl_watchdog_lines(
    ts: float, rank: int, seq: int, op: str, numel: int, timeout_ms: int
) -> list[str]:
    """What ProcessGroupNCCL's watchdog prints on a rank whose collective timed out."""
    ran_ms = timeout_ms + 81
    stamp = _torch_stamp(ts)
    work = (
        f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
        f"Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds before timing out."
    )
    return [
        f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:629] [Rank {rank}] Watchdog caught collective operation timeout: {work}",
        f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {rank}]  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq - 1}",
        f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:681] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:695] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread terminated with exception: [Rank {rank}] Watchdog caught collective operation timeout: {work}",
    ]


def cuda_error_lines(rank: int, message: str) -> list[str]:
    """A rank's Python traceback after a CUDA error (e.g. an uncorrectable ECC error)."""
    return [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 412, in <module>',
        "    main()",
        '  File "/workspace/train.py", line 377, in main',
        "    loss.backward()",
        f"RuntimeError: CUDA error: {message}",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        "",
    ]


# DGX/HGX H100 PCI bus ids, GPU 0–7 (then repeated with a different domain for 16-GPU nodes).
PCI_BUS_IDS: tuple[str, ...] = ("1b", "43", "52", "61", "9d", "c3", "d1", "df")


def pci_of(gpu_index: int) -> str:
    return (
        f"0000:{PCI_BUS_IDS[gpu_index % 8]}:00"
        if gpu_index < 8
        else f"0001:{PCI_BUS_IDS[gpu_index % 8]}:00"
    )


def xid_line(code: int, gpu_index: int, pid: int | None, proc_name: str = "python") -> str:
    """An NVRM kernel line for XID `code`, in the shapes real drivers print."""
    pci = pci_of(gpu_index)
    who = f"pid={pid}, name={proc_name}" if pid is not None else "pid='<unknown>', name=<unknown>"
    text = {
        48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdf0de80 partition 5, subpartition 1",
        63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
        64: "Row Remapper: Failed to remap a row, reset gpu to activate.",
        74: "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
        79: "GPU has fallen off the bus.",
        92: "High single-bit ECC error rate detected on GPU",
        94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
        95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119: f"Timeout after 6s of waiting for RPC response from GPU{gpu_index} GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
    }[code]
    if code in (63, 64, 79):
        who = "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:{pci}): {code}, {who}, {text}"
