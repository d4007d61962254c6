"""PyTorch workloads for the benchmarks: training steps of an MLP and of a small CNN (forward,
backward, SGD: what a training loop runs, the optimizer's step included) and a matmul chain.
Each ``make()`` returns a step function. Import after the thread settings are made."""
from __future__ import annotations

import torch
import torch.nn as nn


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> float:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    return step


def mlp_train_step(batch: int = 128, width: int = 1024):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 10))
    return _train_step(model, torch.randn(batch, 512), torch.randint(0, 10, (batch,)))


def cnn_train_step(batch: int = 32):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    return _train_step(model, torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,)))


def matmul_step(size: int = 512, depth: int = 8):
    a = torch.randn(size, size)

    def step() -> float:
        x = a
        for _ in range(depth):
            x = (x @ a) / size ** 0.5
        return float(x.sum())

    return step


WORKLOADS = {"mlp_train": mlp_train_step, "cnn_train": cnn_train_step, "matmul": matmul_step}
