"""A tiny GPT-2 trained with the Hugging Face `Trainer`, on CPU, nothing downloaded.

    python -m workloads.programs.hf_trainer --out-dir /tmp/hf                  # healthy
    python -m workloads.programs.hf_trainer --out-dir /tmp/hf --lr 0           # no_learning
    python -m workloads.programs.hf_trainer --out-dir /tmp/hf --lr 4 \\
        --warmup-steps 100 --max-grad-norm 0                                    # diverges
    python -m workloads.programs.hf_trainer --out-dir /tmp/hf --nan-at-step 150  # NaN mid-run

The model comes from a `GPT2Config` built here (2 layers, 32-wide, the character vocabulary
of `common`), the data set is `common.CharWindows`. The Trainer prints what it really prints:
its metric dicts every `--logging-steps`, tqdm bars on stderr, a checkpoint every
`--save-steps` — the lines Proof has to read.
"""

from __future__ import annotations

from typing import Any

from workloads.programs import common


def main(argv: list[str] | None = None) -> int:
    p = common.arguments(__doc__, steps=300, lr=3e-3, out_dir=True)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0 = no clipping")
    p.add_argument("--save-steps", type=int, default=100)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nan-at-step", type=int, default=None, help="poison a weight with NaN")
    args = p.parse_args(argv)

    common.setup_threads()
    # After setup_threads: torch's thread counts are settable only before parallel work starts.
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )

    class PoisonAt(TrainerCallback):
        """The injected fault: before optimizer step N a weight becomes NaN."""

        def __init__(self, step: int) -> None:
            self.step = step

        def on_step_begin(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> None:
            if state.global_step + 1 == self.step:
                common.poison_with_nan(kwargs["model"])

    config = GPT2Config(
        vocab_size=common.VOCAB_SIZE,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    targs = TrainingArguments(
        output_dir=args.out_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        lr_scheduler_type="constant_with_warmup",
        max_grad_norm=args.max_grad_norm,
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        save_total_limit=2,
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        seed=args.seed,
    )
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=common.CharWindows(seed=args.seed),
        callbacks=[PoisonAt(args.nan_at_step)] if args.nan_at_step else None,
    )
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
