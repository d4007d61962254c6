"""A plain PyTorch training script, as PyTorch's tutorials write one: no import of this
project. Trains a small MLP on random data for --steps optimizer steps (or until --stop exists),
under torch.distributed (gloo, env://) when WORLD_SIZE is set, and prints one RESULT line: its
steps, the ranks, the threads the training thread ran with, and a checksum of the weights (equal
on every replica after DDP's all-reduce).

    torch_train.py --steps N [--stop FILE] [--exit CODE] [--thread] [--init-self]

--thread trains in a thread of its own (not the main thread); --init-self calls
malleable_torch.init() itself (the one place this script names the project, to test that the
runner's init joins it).
"""
import argparse
import json
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=50)
p.add_argument("--stop")
p.add_argument("--exit", type=int, default=0)
p.add_argument("--thread", action="store_true")
p.add_argument("--init-self", action="store_true")
args, _rest = p.parse_known_args()   # the rest: to show argv reaches the script

if args.init_self:
    import malleable_torch
    malleable_torch.init()

distributed = "WORLD_SIZE" in os.environ
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")) + 1)
seen_threads = set()
done = 0


def train():
    global done
    for _ in range(args.steps):
        if args.stop and os.path.exists(args.stop):
            break
        x = torch.randn(64, 256, generator=gen)
        y = torch.randint(0, 10, (64,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        seen_threads.add(torch.get_num_threads())
        done += 1


if args.thread:
    t = threading.Thread(target=train)
    t.start()
    t.join()
else:
    train()
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
print("RESULT " + json.dumps({"steps": done, "rank": int(os.environ.get("RANK", "0")),
                              "world": int(os.environ.get("WORLD_SIZE", "1")),
                              "threads": sorted(seen_threads), "checksum": checksum,
                              "name": __name__, "argv": sys.argv}), flush=True)
if distributed:
    dist.destroy_process_group()
sys.exit(args.exit)
