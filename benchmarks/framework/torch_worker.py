"""One measuring process (a common.BurstWorker) for fidelity.py --framework torch: plain PyTorch
started with N threads, or malleable_torch resized from outside through one control path before
it measures. The same protocol and options as tf_worker.py:

    torch_worker.py plain --threads T [--cgroup DIR] [--cpus LIST]
    torch_worker.py malleable --pool M --expect N [--no-follow] [--cgroup DIR] [--cpus LIST]
                    [--workloads a,b]

It prints "STARTED <pid>" and waits: the driver resizes it (a signal, a target file, a cpuset or
an affinity change, or the line "API <intra> <inter>" for set_threads), then writes "GO". The
worker waits until the training thread (this, the main one) runs N intra-op threads
(``torch.get_num_threads()`` read here), warms every workload up, and prints "READY <state>";
then each stdin line "<workload> <seconds>" gets one "RESULT {json}".
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=("plain", "malleable"))
ap.add_argument("--threads", type=int, help="plain: torch.set_num_threads at start")
ap.add_argument("--pool", type=int, help="malleable: max_threads M")
ap.add_argument("--expect", type=int, help="malleable: threads once resized")
ap.add_argument("--no-follow", action="store_true", help="malleable: init(follow=False)")
ap.add_argument("--cgroup", help="cpuset folder to join before PyTorch starts")
ap.add_argument("--cpus", help="pin by affinity before PyTorch starts, e.g. 0 or 0-1")
ap.add_argument("--workloads", default="mlp_train,cnn_train,matmul")
ap.add_argument("--data-pool", type=int, help="ignored (TensorFlow's tf.data pool)")
args = ap.parse_args()

if args.cgroup:
    with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
if args.cpus:
    from malleable_protocol.cpulist import parse_cpu_list
    os.sched_setaffinity(0, parse_cpu_list(args.cpus))

import torch  # noqa: E402

state = None
if args.mode == "plain":
    torch.set_num_threads(args.threads)
else:
    import malleable_torch
    malleable_torch.init(max_threads=args.pool, follow=not args.no_follow)

from benchmarks.common import steps_per_second  # noqa: E402
from benchmarks.framework.torch_workloads import WORKLOADS  # noqa: E402

steps = {name: WORKLOADS[name]() for name in args.workloads.split(",")}
print(f"STARTED {os.getpid()}", flush=True)
for line in sys.stdin:
    word, *rest = line.split()
    if word == "API":
        malleable_torch.set_threads(intra=int(rest[0]))
    elif word == "GO":
        break
if args.mode == "malleable":
    deadline = time.monotonic() + 20
    while True:
        s = malleable_torch.threads()
        if s.intra_active == args.expect and torch.get_num_threads() == args.expect:
            break
        if time.monotonic() > deadline:
            print(f"FAILED not resized to {args.expect}: {s} torch "
                  f"{torch.get_num_threads()}", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    state = {"intra_active": s.intra_active, "intra_pool": s.intra_pool,
             "torch_threads": torch.get_num_threads(), "allowed": sorted(s.allowed_cpus),
             "share": sorted(s.share_cpus), "following": s.following}
for step in steps.values():
    steps_per_second(step, seconds=0.5)
state = {**(state or {}), "affinity": sorted(os.sched_getaffinity(0)),
         "threads": torch.get_num_threads()}
print("READY " + json.dumps(state), flush=True)
for line in sys.stdin:
    workload, seconds = line.split()
    rate = steps_per_second(steps[workload], seconds=float(seconds), warmup=1)
    print("RESULT " + json.dumps(rate), flush=True)
