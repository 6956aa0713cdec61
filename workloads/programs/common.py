"""What every workload program shares: one CPU thread, a tiny character vocabulary built in
code, a small learnable corpus, and the faults the suite injects.

Nothing is downloaded: the "tokenizer" is a character table and the data set is windows of a
corpus of a few sentences in a seeded random order — a character model learns it in a few
hundred steps (loss from ln(vocab) ≈ 3.3 to well under 1), which is what a healthy run must
show and a broken one must not.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import time

# One thread per process (the suite runs on a shared 2-core machine and the programs are
# tiny: more threads only add contention; `setup_threads` also sets torch's own), and no
# network: the programs import transformers only after this module.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from torch.utils.data import Dataset

SENTENCES = (
    "the quick brown fox jumps over the lazy dog. ",
    "a tiny model learns a tiny corpus. ",
    "gpus wait while the loader works. ",
    "checkpoints go to fast local disks. ",
    "every rank must reach the all reduce. ",
    "loss goes down when the rate is right. ",
)
VOCAB = sorted(set("".join(SENTENCES)))
STOI = {c: i for i, c in enumerate(VOCAB)}
VOCAB_SIZE = len(VOCAB)


def arguments(
    description: str | None, *, steps: int, lr: float, out_dir: bool = False
) -> argparse.ArgumentParser:
    """The options every program here takes: `--steps`, `--lr`, `--batch-size` (and the
    required `--out-dir` of one that writes its framework's files there)."""
    p = argparse.ArgumentParser(description=description)
    if out_dir:
        p.add_argument("--out-dir", required=True)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--batch-size", type=int, default=16)
    return p


def setup_threads() -> None:
    torch.set_num_threads(1)
    # Settable once per process, before any parallel work: a forked data-loader worker
    # inherits its parent's and may not set it again.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def corpus(length: int = 20_000, seed: int = 0) -> torch.Tensor:
    """The corpus as token ids: the sentences in a seeded random order, `length` characters."""
    rng = random.Random(seed)  # noqa: S311 - a seeded corpus order; reproducible on purpose
    parts: list[str] = []
    total = 0
    while total < length:
        s = rng.choice(SENTENCES)
        parts.append(s)
        total += len(s)
    text = "".join(parts)[:length]
    return torch.tensor([STOI[c] for c in text], dtype=torch.long)


class CharWindows(Dataset[dict[str, torch.Tensor]]):
    """Fixed windows of the corpus: `input_ids` and `labels` (the same ids: causal LMs shift
    the labels themselves), as Hugging Face models take them."""

    def __init__(self, seq_len: int = 32, count: int = 4096, seed: int = 0) -> None:
        data = corpus(seed=seed)
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(data) - seq_len - 1, (count,), generator=g)
        self.windows = torch.stack([data[int(s) : int(s) + seq_len] for s in starts])

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        w = self.windows[i]
        return {"input_ids": w, "labels": w}


class TinyCharLM(torch.nn.Module):
    """Embedding → one GRU layer → logits: a few thousand parameters, for the plain torch,
    Lightning and DDP programs (the Trainer program uses a tiny GPT-2)."""

    def __init__(self, vocab: int = VOCAB_SIZE, dim: int = 32) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(ids))
        out: torch.Tensor = self.head(h)
        return out

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self(ids[:, :-1])
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )


def poison_with_nan(model: torch.nn.Module) -> None:
    """The injected fault: one weight becomes NaN (a corrupted update), so every later loss
    is NaN — what a bad fp16 overflow or a corrupted all-reduce does to a real run."""
    with torch.no_grad():
        p = next(model.parameters())
        p.view(-1)[0] = math.nan


def busy_cpu(seconds: float) -> None:
    """Pure-Python CPU work for `seconds` of this process's own CPU time (an expensive
    per-sample transform in a data-loader worker); under a CPU cap it takes longer in wall
    time, which is exactly the starvation the suite injects."""
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        for i in range(1000):
            x ^= i
