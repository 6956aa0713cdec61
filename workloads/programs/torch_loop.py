"""A plain PyTorch training loop (nanoGPT's log format), on CPU.

    python -m workloads.programs.torch_loop                                   # healthy
    python -m workloads.programs.torch_loop --lr 0                            # no_learning
    python -m workloads.programs.torch_loop --nan-at-step 150                 # NaN mid-run
    python -m workloads.programs.torch_loop --ckpt-dir /mnt/x --ckpt-every 50 --ckpt-mib 4
    python -m workloads.programs.torch_loop --num-workers 1 --worker-cpu-ms 30 \\
        --worker-cgroup /sys/fs/cgroup/cpu/starved                            # starved loader

Prints `iter N: loss X, time Yms` every `--log-every` steps and `saving checkpoint to PATH`
before each save (as nanoGPT does), `checkpoint written in S s` after it. A checkpoint is the model and optimizer state plus
`--ckpt-mib` of optimizer-sized padding, written with fsync so the save really waits for the
disk — a real checkpoint is large next to the disk's bandwidth, a tiny model's is not.

`--worker-cgroup DIR`: each data-loader worker moves itself into that cgroup (writes its pid
to DIR/cgroup.procs; root only), so a CPU cap there starves the input pipeline and nothing else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from workloads.programs import common


class _Transform:
    """A per-batch CPU cost in the loader (decoding, augmentation, tokenization)."""

    def __init__(self, cpu_ms: float) -> None:
        self.cpu_s = cpu_ms / 1000.0

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        if self.cpu_s > 0:
            common.busy_cpu(self.cpu_s)
        return torch.stack([it["input_ids"] for it in items])


class _JoinCgroup:
    def __init__(self, cgroup: str | None) -> None:
        self.cgroup = cgroup

    def __call__(self, worker_id: int) -> None:
        common.setup_threads()
        if self.cgroup:
            Path(self.cgroup, "cgroup.procs").write_text(f"{os.getpid()}\n")


def save_checkpoint(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, pad_mib: int
) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "padding": torch.zeros(pad_mib * (1 << 20) // 4, dtype=torch.float32),
    }
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = common.arguments(__doc__, steps=300, lr=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--nan-at-step", type=int, default=None, help="poison a weight with NaN")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--ckpt-mib", type=int, default=0, help="padding added to each checkpoint")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--worker-cpu-ms", type=float, default=0.0, help="CPU cost per batch")
    p.add_argument("--worker-cgroup", default=None)
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="pace the loop (I/O wait)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    common.setup_threads()
    torch.manual_seed(args.seed)
    model = common.TinyCharLM()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = DataLoader(
        common.CharWindows(seed=args.seed),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        collate_fn=_Transform(args.worker_cpu_ms),
        worker_init_fn=_JoinCgroup(args.worker_cgroup) if args.num_workers else None,
        persistent_workers=args.num_workers > 0,
    )
    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else None
    # Trainers also keep a small log in their output directory, fsync'ed as they go: the
    # mount's ordinary write latency outside the saves, which a slow save is compared with.
    train_log = (
        open(ckpt_dir / "train_log.txt", "a")  # noqa: SIM115 (closed after the loop)
        if ckpt_dir is not None
        else None
    )
    step = 0
    t_last = time.perf_counter()
    while step < args.steps:
        for ids in data:
            step += 1
            if args.nan_at_step is not None and step == args.nan_at_step:
                common.poison_with_nan(model)
            loss = model.loss(ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000.0)
            if step % args.log_every == 0:
                now = time.perf_counter()
                dt_ms = (now - t_last) * 1000.0 / args.log_every
                t_last = now
                line = f"iter {step}: loss {loss.item():.4f}, time {dt_ms:.2f}ms"
                print(line, flush=True)
                if train_log is not None:
                    train_log.write(line + "\n")
                    train_log.flush()
                    os.fsync(train_log.fileno())
            if ckpt_dir is not None and step % args.ckpt_every == 0:
                path = ckpt_dir / "ckpt.pt"
                print(f"saving checkpoint to {ckpt_dir}", flush=True)
                t_save = time.perf_counter()
                save_checkpoint(path, model, opt, step, args.ckpt_mib)
                print(f"checkpoint written in {time.perf_counter() - t_save:.2f} s", flush=True)
                t_last = time.perf_counter()
            if step >= args.steps:
                break
    if train_log is not None:
        train_log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
