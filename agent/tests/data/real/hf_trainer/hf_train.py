"""Tiny GPT-2 trained from scratch on CPU with the Hugging Face Trainer (nothing downloaded).

Usage: python hf_train.py --mode {healthy,explode,lr0,nan} --out DIR [--steps 300]
The traces beside this file were recorded from it; README.md has the exact commands.
"""

import argparse
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

ap = argparse.ArgumentParser()
ap.add_argument("--mode", default="healthy")
ap.add_argument("--out", default="/tmp/hf_out")  # noqa: S108 - a throwaway default of a fixture program run by hand (data/real/README.md)
ap.add_argument("--steps", type=int, default=300)
args = ap.parse_args()
torch.manual_seed(0)

# A made-up character vocabulary: the corpus is a repetitive text the model can learn quickly.
TEXT = (
    "the quick brown fox jumps over the lazy dog. " * 40
    + "pack my box with five dozen liquor jugs. " * 40
)
VOCAB = sorted(set(TEXT))
STOI = {c: i for i, c in enumerate(VOCAB)}
IDS = torch.tensor([STOI[c] for c in TEXT])
SEQ = 32


class CharData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        j = (i * 7) % (len(IDS) - SEQ - 1)
        x = IDS[j : j + SEQ]
        return {"input_ids": x, "labels": x.clone()}


cfg = GPT2Config(vocab_size=len(VOCAB), n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(cfg)

lr = {"healthy": 3e-3, "explode": 4.0, "lr0": 0.0, "nan": 3e-3}[args.mode]
targs = TrainingArguments(
    output_dir=args.out,
    max_steps=args.steps,
    per_device_train_batch_size=8,
    learning_rate=lr,
    warmup_steps=100 if args.mode == "explode" else 0,
    max_grad_norm=0.0 if args.mode == "explode" else 1.0,
    lr_scheduler_type="linear" if args.mode != "explode" else "constant_with_warmup",
    logging_steps=10,
    save_steps=100,
    report_to=[],
    use_cpu=True,
    dataloader_num_workers=0,
    seed=0,
)


class InjectNaN(TrainerCallback):
    """At step 150, poison the weights: every later loss is NaN (as a real fp overflow)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 150:
            with torch.no_grad():
                for p in kwargs["model"].parameters():
                    p.fill_(float("nan"))


trainer = Trainer(
    model=model,
    args=targs,
    train_dataset=CharData(),
    callbacks=[InjectNaN()] if args.mode == "nan" else [],
)
trainer.train()
