"""Data-parallel training over gloo (CPU), launched by torchrun.

    torchrun --nproc-per-node 2 -m workloads.programs.ddp_gloo                  # healthy
    torchrun --nproc-per-node 2 -m workloads.programs.ddp_gloo \\
        --stop-rank 1 --stop-at-step 100 --timeout-s 20                         # one rank stops

`DistributedDataParallel` all-reduces the gradients in every backward pass. With
`--stop-rank R --stop-at-step S`, rank R stops before step S's backward (as a rank stuck in
its own code — a rank-0-only evaluation, a dead data loader — does) and never reaches that
all-reduce; the others wait in it until gloo's timeout (`--timeout-s`, passed to
`init_process_group`) fails them, and torchrun tears the job down. Rank 0 prints the
progress lines (nanoGPT's format), like most training scripts.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from workloads.programs import common


def main(argv: list[str] | None = None) -> int:
    p = common.arguments(__doc__, steps=200, lr=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--timeout-s", type=float, default=20.0, help="gloo collective timeout")
    p.add_argument("--stop-rank", type=int, default=None)
    p.add_argument("--stop-at-step", type=int, default=100)
    p.add_argument("--step-sleep-ms", type=float, default=0.0)
    args = p.parse_args(argv)

    common.setup_threads()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(common.TinyCharLM())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    dataset = common.CharWindows()
    sampler: DistributedSampler[dict[str, torch.Tensor]] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    data = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    if rank == 0:
        print(f"ddp: world size {world}, backend gloo, {args.steps} steps", flush=True)
    step = 0
    epoch = 0
    t_last = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        epoch += 1
        for batch in data:
            step += 1
            ids = batch["input_ids"]
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
            )
            if args.stop_rank == rank and step == args.stop_at_step:
                print(f"rank {rank}: stopping before the all-reduce of step {step}", flush=True)
                sys.stdout.flush()
                time.sleep(3600)  # never arrives: the others time out and torchrun kills us
            opt.zero_grad(set_to_none=True)
            loss.backward()  # the gradient all-reduce
            opt.step()
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000.0)
            if rank == 0 and step % args.log_every == 0:
                now = time.perf_counter()
                dt_ms = (now - t_last) * 1000.0 / args.log_every
                t_last = now
                print(f"iter {step}: loss {loss.item():.4f}, time {dt_ms:.2f}ms", flush=True)
            if step >= args.steps:
                break
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"training completed: {step} steps on {world} ranks (pid {os.getpid()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
