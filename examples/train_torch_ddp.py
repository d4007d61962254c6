"""PyTorch DistributedDataParallel on CPU, written as PyTorch's own tutorials write it: nothing
of this project is imported. Made malleable from outside:

    srun -N2 --ntasks-per-node=1 python -m malleable_torch.run examples/train_torch_ddp.py
    malleable-srun python examples/train_torch_ddp.py          (the same, found by its imports)
    torchrun --nproc-per-node=2 -m malleable_torch.run examples/train_torch_ddp.py

The env:// rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) comes from torchrun, or from
the Slurm step through malleable_torch.run; without WORLD_SIZE it trains alone. Each worker
trains an MLP on its shard of a synthetic classification set (generated from a seed: nothing is
downloaded); DDP averages the gradients. Every epoch each worker prints its samples/s and the
intra-op threads it ran with; with ``--report DIR`` it also writes a JSON line per epoch to
``DIR/epochs-<rank>.jsonl``, with a digest of its weights (equal on every worker: DDP keeps the
replicas in step).
``--until FILE`` trains until FILE exists (the workers agree at each epoch's end, so they stop
together), ``--epochs`` at most.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20, help="steps per epoch")
    ap.add_argument("--batch-size", type=int, default=64, help="per worker")
    ap.add_argument("--width", type=int, default=512, help="hidden width (compute per step)")
    ap.add_argument("--report", type=Path, default=None)
    ap.add_argument("--until", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)                        # the same initial weights on every worker
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)   # this worker's shard
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
    for epoch in range(args.epochs):
        t0, threads = time.perf_counter(), set()
        for _ in range(args.steps):
            x = torch.randn(args.batch_size, 64, generator=data)
            y = x[:, :10].argmax(dim=1)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            threads.add(torch.get_num_threads())
        seconds = time.perf_counter() - t0
        weights = hashlib.sha256()
        for p in model.parameters():
            weights.update(p.detach().numpy().tobytes())
        line = {"rank": rank, "world": world, "epoch": epoch, "loss": round(float(loss), 4),
                "samples_per_s": round(args.steps * args.batch_size / seconds, 1),
                "threads": sorted(threads), "weights_sha256": weights.hexdigest(),
                "time": time.time()}
        print(json.dumps(line), flush=True)
        if args.report:
            with open(args.report / f"epochs-{rank}.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
        stop = torch.tensor([1.0 if args.until and args.until.exists() else 0.0])
        if distributed:
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
