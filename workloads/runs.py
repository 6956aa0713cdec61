"""The recorded runs of the suite: program, injected fault, command and the verdict a user
expects. The tests' session fixtures (workloads/tests/conftest.py) and the report
(`python -m workloads.report`) both take them from here, so the table in docs/detectors.md,
the report and the tests cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workloads.harness import program, torchrun


@dataclass(frozen=True)
class RecordedRun:
    name: str
    program: str
    fault: str
    argv: Callable[[Path], list[str]]  # the command, given the run's output directory
    expected: tuple[str, ...]  # the families a user expects (empty: no verdict)
    timeout_s: float = 300.0
    # False: the family needs GPU-side signals (docs/detectors.md "Real runs"); on CPU the
    # run must get that family or none, and nothing else.
    visible_on_cpu: bool = True


def _out(name: str) -> Callable[[Path], Path]:
    return lambda workdir: workdir / f"{name}-out"


RECORDED: dict[str, RecordedRun] = {
    r.name: r
    for r in (
        RecordedRun(
            "hf-healthy",
            "HF Trainer, tiny GPT-2",
            "none (lr 3e-3, saves at steps 100/200/300)",
            lambda w: program("hf_trainer", "--out-dir", str(_out("hf-healthy")(w))),
            (),
        ),
        RecordedRun(
            "hf-lr0",
            "HF Trainer, tiny GPT-2",
            "learning rate 0",
            lambda w: program("hf_trainer", "--out-dir", str(_out("hf-lr0")(w)), "--lr", "0"),
            ("no_learning",),
        ),
        RecordedRun(
            "hf-exploding",
            "HF Trainer, tiny GPT-2",
            "lr warm-up to 4.0 over 100 steps, no clipping",
            lambda w: program(
                "hf_trainer",
                "--out-dir",
                str(_out("hf-exploding")(w)),
                "--lr",
                "4",
                "--warmup-steps",
                "100",
                "--max-grad-norm",
                "0",
            ),
            ("numerical_divergence",),
        ),
        RecordedRun(
            "hf-nan",
            "HF Trainer, tiny GPT-2",
            "a weight set to NaN before step 150 (the Trainer then logs grad_norm nan, loss 0)",
            lambda w: program(
                "hf_trainer", "--out-dir", str(_out("hf-nan")(w)), "--nan-at-step", "150"
            ),
            ("numerical_divergence",),
        ),
        RecordedRun(
            "lightning-healthy",
            "Lightning",
            "none",
            lambda w: program("lightning_run", "--out-dir", str(_out("lightning-healthy")(w))),
            (),
        ),
        RecordedRun(
            "lightning-rich-healthy",
            "Lightning, rich progress bar (its default when rich is installed)",
            "none",
            lambda w: program(
                "lightning_run",
                "--out-dir",
                str(_out("lightning-rich-healthy")(w)),
                "--progress",
                "rich",
            ),
            (),
        ),
        RecordedRun(
            "lightning-lr0",
            "Lightning",
            "learning rate 0",
            lambda w: program(
                "lightning_run", "--out-dir", str(_out("lightning-lr0")(w)), "--lr", "0"
            ),
            ("no_learning",),
        ),
        RecordedRun(
            "torch-healthy", "plain torch loop", "none", lambda w: program("torch_loop"), ()
        ),
        RecordedRun(
            "torch-nan",
            "plain torch loop",
            "a weight set to NaN at step 150",
            lambda w: program("torch_loop", "--nan-at-step", "150"),
            ("numerical_divergence",),
        ),
        RecordedRun(
            "ddp-healthy",
            "torchrun, 2 gloo ranks",
            "none",
            lambda w: torchrun(2, "ddp_gloo"),
            (),
        ),
        RecordedRun(
            "ddp4-healthy",
            "torchrun, 4 gloo ranks",
            "none",
            lambda w: torchrun(4, "ddp_gloo", "--steps", "100"),
            (),
        ),
        RecordedRun(
            "ddp-rank-stops",
            "torchrun, 2 gloo ranks",
            "rank 1 stops before step 100's all-reduce (gloo timeout 20 s)",
            lambda w: torchrun(
                2, "ddp_gloo", "--stop-rank", "1", "--stop-at-step", "100", "--timeout-s", "20"
            ),
            ("collective_hang",),
            timeout_s=240.0,
            visible_on_cpu=False,
        ),
    )
}
