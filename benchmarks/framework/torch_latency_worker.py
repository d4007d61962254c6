"""Measurement process for torch_latency.py: trains benchmarks.framework.torch_workloads'
MLP in the main thread (the training thread) under malleable_torch, and prints
"APPLIED <time> <n>" each time the training thread's torch.get_num_threads() changes: the moment
a resize reached the threads that run the ops. A line "API <n>" on stdin calls
malleable_torch.set_threads(n) from a thread of its own (as a user's helper thread would)."""
import os
import sys
import threading
import time

os.environ.setdefault("MALLEABLE_TF_SIGNALS", "USR1=reload,USR2=intra-down,URG=intra-up")
import malleable_torch  # noqa: E402
import torch  # noqa: E402

malleable_torch.init(max_threads=len(os.sched_getaffinity(0)))
from benchmarks.framework.torch_workloads import mlp_train_step  # noqa: E402

step = mlp_train_step()


def api() -> None:
    for line in sys.stdin:
        word, *rest = line.split()
        if word == "API":
            malleable_torch.set_threads(int(rest[0]))


threading.Thread(target=api, daemon=True).start()
for _ in range(5):
    step()
last = torch.get_num_threads()
print(f"READY {last}", flush=True)
while True:
    step()
    n = torch.get_num_threads()
    if n != last:
        print(f"APPLIED {time.time()} {n}", flush=True)
        last = n
