"""A Lightning run on CPU: `LightningModule` + `Trainer.fit`, its own progress bar and logging.

    python -m workloads.programs.lightning_run --out-dir /tmp/pl             # healthy
    python -m workloads.programs.lightning_run --out-dir /tmp/pl --lr 0      # no_learning

The loss is logged with `self.log("train_loss", …, prog_bar=True)`, so Lightning's tqdm bar
carries it (`Epoch 0: 42%|…| 84/200 [00:01<00:01, 60.1it/s, v_num=0, train_loss=1.23]`);
one epoch of `--steps` batches; Lightning's checkpoint callback saves at the end.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from torch.utils.data import DataLoader

from workloads.programs import common


class CharModule(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.model = common.TinyCharLM()
        self.lr = lr

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model.loss(batch["input_ids"])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main(argv: list[str] | None = None) -> int:
    p = common.arguments(__doc__, steps=200, lr=1e-2, out_dir=True)
    p.add_argument(
        "--progress",
        choices=("tqdm", "rich"),
        default="tqdm",
        help="progress bar: tqdm (refreshed every 10 steps) or rich (Lightning's default "
        "when rich is installed; outside a terminal it prints only its last frame)",
    )
    args = p.parse_args(argv)

    common.setup_threads()
    L.seed_everything(0)
    data = DataLoader(
        common.CharWindows(count=args.steps * args.batch_size),
        batch_size=args.batch_size,
        shuffle=True,
    )
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        default_root_dir=args.out_dir,
        log_every_n_steps=10,
        enable_model_summary=True,
        callbacks=[
            TQDMProgressBar(refresh_rate=10) if args.progress == "tqdm" else RichProgressBar()
        ],
    )
    trainer.fit(CharModule(args.lr), data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
