"""Tiny GPT-2 (from scratch, nothing downloaded) trained on CPU with Lightning 2.6.

Usage: python pl_train.py --mode {healthy,explode} [--bar tqdm] --out DIR
The traces beside this file were recorded from it; README.md has the exact commands.
"""

import argparse
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--mode", default="healthy")
ap.add_argument("--out", default="/tmp/pl_out")  # noqa: S108 - a throwaway default of a fixture program run by hand (data/real/README.md)
ap.add_argument("--bar", default="default", help="default (rich when installed) or tqdm")
args = ap.parse_args()
torch.manual_seed(0)
TEXT = (
    "the quick brown fox jumps over the lazy dog. " * 40
    + "pack my box with five dozen liquor jugs. " * 40
)
VOCAB = sorted(set(TEXT))
IDS = torch.tensor([VOCAB.index(c) for c in TEXT])
SEQ = 32


class CharData(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        j = (i * 7) % (len(IDS) - SEQ - 1)
        return IDS[j : j + SEQ]


class LM(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        cfg = GPT2Config(vocab_size=len(VOCAB), n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
        self.model = GPT2LMHeadModel(cfg)

    def training_step(self, batch: torch.Tensor, i: int) -> Any:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        if args.mode == "explode":
            return torch.optim.SGD(self.parameters(), lr=self.lr)
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


lr = {"healthy": 3e-3, "explode": 30.0}[args.mode]
trainer = L.Trainer(
    max_epochs=5,
    accelerator="cpu",
    devices=1,
    log_every_n_steps=10,
    default_root_dir=args.out,
    logger=False,
    enable_checkpointing=True,
    callbacks=[TQDMProgressBar()] if args.bar == "tqdm" else None,
)
trainer.fit(LM(lr), torch.utils.data.DataLoader(CharData(), batch_size=8))
