"""Measurement process for torch_dataloader.py: trains an MLP under malleable_torch on batches
from a DataLoader whose dataset does CPU work per sample (a small matmul chain), with
``--workers`` worker processes, and answers each stdin line "<seconds>" with one RESULT line:
its samples/s, its training thread's torch.get_num_threads(), and the CPU time per wall second
of the main process and of each DataLoader worker (from /proc)."""
import argparse
import json
import os
import sys
import time

import malleable_torch
import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--workers", type=int, default=2)
args = ap.parse_args()
malleable_torch.init(max_threads=len(os.sched_getaffinity(0)))


class Work(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, 64, generator=g)
        for _ in range(6):
            x = torch.tanh(x @ x / 8.0)
        return x.mean(dim=0), int(i % 10)


loader = torch.utils.data.DataLoader(Work(), batch_size=32, num_workers=args.workers,
                                     persistent_workers=args.workers > 0)
model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = iter(loader)
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def workers() -> list[int]:
    me = os.getpid()
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(pid))
            except OSError:
                pass
    return sorted(out)


def step():
    x, y = next(batches)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


for _ in range(10):
    step()
print("READY", flush=True)
for line in sys.stdin:
    seconds = float(line)
    kids = workers()
    c0 = {p: cpu_s(p) for p in [os.getpid(), *kids]}
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        step()
        n += 1
    wall = time.monotonic() - t0
    c1 = {p: cpu_s(p) for p in c0}
    print("RESULT " + json.dumps({
        "samples_per_s": n * 32 / wall, "torch_threads": torch.get_num_threads(),
        "main_cpu": (c1[os.getpid()] - c0[os.getpid()]) / wall,
        "workers_cpu": [round((c1[p] - c0[p]) / wall, 3) for p in kids],
        "worker_threads": [len(os.listdir(f"/proc/{p}/task")) for p in kids]}), flush=True)
