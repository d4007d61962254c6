"""Does it matter WHICH intra-op thread is parked? (issue 12: the Keras CNN's fidelity gap)

TensorFlow's oneDNN adapter (tsl/util/onednn_threadpool.h, TF 2.15) schedules the root of every
primitive's work with ScheduleWithHint(..., 0, 1) from the inter-op thread: into intra-op
thread 0's queue. If thread 0 is the parked one, each primitive waits for another thread to
steal it. Parkers land on a random thread, so fresh processes differ in which one is parked.

Each trial is a fresh process with pools of 2: the Keras CNN's steps/s at 2 threads, then after
set_threads(intra=1, inter=1), with the parked thread's Eigen index (threads of a pool are
created in order, so its rank among the intra pool's OS thread ids; the intra pool's threads are
told apart from the inter pool's by parking each pool alone first). Plain TensorFlow started
with 1 thread is measured in the same run, alternating.

    python -m benchmarks.framework.onednn_parked_thread [--trials 12] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, RESULTS

WORKER = r"""
import ctypes, json, os, sys, time
mode = sys.argv[1]
if mode == "plain":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from benchmarks.framework.workloads import keras_cnn_step, steps_per_second
    step = keras_cnn_step()
    print(json.dumps({"mode": mode, "rate": steps_per_second(step, seconds=4.0)}))
    sys.exit(0)
import malleable_tf
malleable_tf.init(max_threads=2, follow=False)
import tensorflow as tf
from benchmarks.framework.workloads import keras_cnn_step, steps_per_second
step = keras_cnn_step()
steps_per_second(step, seconds=1.0)
lib = malleable_tf.runtime().pools.lib
buf = (ctypes.c_long * 8)()

def parked(pool):
    time.sleep(0.3)
    n = lib.mtf_parked_tids(pool, buf, 8)
    return list(buf[:n])

# Which OS threads belong to which pool: park each pool alone, several times.
intra_seen, inter_seen = set(), set()
for _ in range(6):
    malleable_tf.set_threads(intra=1, inter=2); intra_seen.update(parked(0))
    malleable_tf.set_threads(intra=2, inter=1); inter_seen.update(parked(1))
    malleable_tf.set_threads(intra=2, inter=2); time.sleep(0.1)
malleable_tf.set_threads(intra=1, inter=1)
intra_parked = parked(0)
def cpu_ticks():
    out = {}
    for t in os.listdir("/proc/self/task"):
        f = open(f"/proc/self/task/{t}/stat").read()
        fields = f[f.rindex(")") + 2:].split()
        out[int(t)] = int(fields[11]) + int(fields[12])
    return out

before = cpu_ticks()
rate = steps_per_second(step, seconds=4.0)
after = cpu_ticks()
busy = {t: after[t] - before.get(t, 0) for t in after}
print(json.dumps({"mode": mode, "rate": rate, "intra_parked": intra_parked,
                  "intra_seen": sorted(intra_seen), "inter_seen": sorted(inter_seen),
                  "threads": sorted(after), "busy_ticks": busy}))
"""


def run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, mode], capture_output=True, text=True,
                         timeout=300, cwd=REPO,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--json", default=str(RESULTS / "onednn_parked_thread.json"))
    args = ap.parse_args()
    trials = []
    for trial in range(args.trials):
        plain = run("plain")
        m = run("malleable")
        # The intra pool's two threads were made one after the other (Eigen index = creation
        # order), right before the inter pool's: the parked intra thread's sibling is the
        # thread next to it in id that is neither an inter-pool thread nor idle.
        tids, parked_tid = m["threads"], m["intra_parked"][0]
        i = tids.index(parked_tid)
        neighbours = [t for t in (tids[i - 1] if i else None,
                                  tids[i + 1] if i + 1 < len(tids) else None)
                      if t is not None and t not in m["inter_seen"]]
        busy = {int(k): v for k, v in m["busy_ticks"].items()}
        sibling = max(neighbours, key=lambda t: busy.get(t, 0)) if neighbours else None
        index = None if sibling is None else (0 if parked_tid < sibling else 1)
        ratio = m["rate"]["wall"] / plain["rate"]["wall"]
        trials.append({"plain_wall": plain["rate"]["wall"], "malleable_wall": m["rate"]["wall"],
                       "ratio": ratio, "parked_index": index, "parked_tid": parked_tid,
                       "sibling_tid": sibling, "threads": tids, "busy_ticks": busy,
                       "inter_threads": m["inter_seen"]})
        print(f"trial {trial}: parked intra thread {index}  ratio {ratio:.3f}", flush=True)
    by = {}
    for k in (0, 1):
        r = [t["ratio"] for t in trials if t["parked_index"] == k]
        by[str(k)] = {"n": len(r), "median_ratio": statistics.median(r) if r else None,
                      "ratios": r}
    result = {"workload": "keras_cnn_step, pools of 2, set_threads(1, 1), floating (no pinning)",
              "by_parked_index": by, "trials": trials}
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(by, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
