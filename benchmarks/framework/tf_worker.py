"""One measuring process (a common.BurstWorker) for fidelity.py and benefit.py: plain TensorFlow
or malleable_tf, resized from outside through one control path before it measures.

    tf_worker.py plain --threads T [--cgroup DIR] [--cpus LIST]
    tf_worker.py malleable --pool M --expect N [--no-follow] [--cgroup DIR] [--cpus LIST]
                 [--workloads a,b]

--cgroup puts the process into that cpuset folder before TensorFlow starts (the driver then
changes the folder's cpus: the cpuset path); --cpus pins it there by affinity. A malleable
process starts with pools of M on whatever it may use. The worker prints "STARTED <pid>" and
waits: the driver resizes it (a signal, a target file, a cpuset or an affinity change, or the
line "API <intra> <inter>" for set_threads), then writes "GO". The worker waits until
malleable_tf runs N active intra-op and inter-op threads (or fails), warms every workload up,
and prints "READY <state>"; then each stdin line "<workload> <seconds>" gets one "RESULT {json}".
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=("plain", "malleable"))
ap.add_argument("--threads", type=int, help="plain: intra and inter-op threads")
ap.add_argument("--pool", type=int, help="malleable: pool size M (max_threads)")
ap.add_argument("--expect", type=int, help="malleable: active threads once resized")
ap.add_argument("--no-follow", action="store_true", help="malleable: init(follow=False)")
ap.add_argument("--cgroup", help="cpuset folder to join before TensorFlow starts")
ap.add_argument("--cpus", help="pin by affinity before TensorFlow starts, e.g. 0 or 0-1")
ap.add_argument("--workloads", default="keras_cnn,matmul,tf_data")
ap.add_argument("--data-pool", type=int,
                help="plain: tf.data runs on a private pool of this many threads (without it, "
                     "plain TF runs map calls on every core whatever its thread settings)")
args = ap.parse_args()

if args.cgroup:
    with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
if args.cpus:
    from malleable_protocol.cpulist import parse_cpu_list
    os.sched_setaffinity(0, parse_cpu_list(args.cpus))  # every thread inherits it

data_map = None
state = None
if args.mode == "plain":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.data_pool:
        data_options = tf.data.Options()
        data_options.threading.private_threadpool_size = args.data_pool

        def data_map(ds, fn, **kwargs):
            return ds.map(fn, **kwargs).with_options(data_options)
else:
    import malleable_tf
    malleable_tf.init(max_threads=args.pool, follow=not args.no_follow)
    import malleable_tf.data
    data_map = malleable_tf.data.map

from benchmarks.framework.workloads import WORKLOADS, steps_per_second  # noqa: E402

steps = {name: WORKLOADS[name](data_map) for name in args.workloads.split(",")}
print(f"STARTED {os.getpid()}", flush=True)
for line in sys.stdin:
    word, *rest = line.split()
    if word == "API":
        malleable_tf.set_threads(intra=int(rest[0]), inter=int(rest[1]))
    elif word == "GO":
        break
if args.mode == "malleable":
    deadline = time.monotonic() + 20
    while True:
        s = malleable_tf.threads()
        if s.intra_active == s.inter_active == args.expect:
            break
        if time.monotonic() > deadline:
            print(f"FAILED not resized to {args.expect}: {s}", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    state = {"intra_active": s.intra_active, "intra_pool": s.intra_pool,
             "inter_active": s.inter_active, "allowed": sorted(s.allowed_cpus),
             "share": sorted(s.share_cpus), "following": s.following,
             "split_width": malleable_tf.runtime().pools.lib.mtf_split_width()}
for step in steps.values():
    steps_per_second(step, seconds=0.5)  # trace, compile, warm caches
state = {**(state or {}), "affinity": sorted(os.sched_getaffinity(0))}
print("READY " + json.dumps(state), flush=True)
for line in sys.stdin:
    workload, seconds = line.split()
    rate = steps_per_second(steps[workload], seconds=float(seconds), warmup=1)
    print("RESULT " + json.dumps(rate), flush=True)
