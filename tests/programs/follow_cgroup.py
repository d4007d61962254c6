"""Runs a matmul loop and reports its thread state whenever it changes, as JSON lines.

    follow_cgroup.py [MAX_THREADS [RECHECK_S [CGROUP]]]

The test moves this process between cpusets and affinity masks from outside. A long RECHECK_S
leaves the native poller as the only way a change is noticed. CGROUP: a cgroup folder this
process joins before malleable_tf starts.
"""
import json
import os
import sys
import threading
import time

import malleable_tf

if len(sys.argv) > 3:
    with open(os.path.join(sys.argv[3], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
malleable_tf.init(max_threads=int(sys.argv[1]) if len(sys.argv) > 1 else None,
                  recheck_interval_s=float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
lib = malleable_tf.runtime().pools.lib
import tensorflow as tf  # noqa: E402

a = tf.random.normal((256, 256))
stop = threading.Event()


def loop():
    while not stop.is_set():
        tf.matmul(a, a).numpy()


threading.Thread(target=loop, daemon=True).start()
last = None
print("READY", flush=True)
deadline = time.time() + 120
while time.time() < deadline:
    s = malleable_tf.threads()
    parked = lib.mtf_parked(0)
    now = (s.intra_active, s.inter_active, sorted(s.allowed_cpus), sorted(s.share_cpus), parked)
    if now != last:
        print("STATE " + json.dumps({"t": time.time(), "intra": now[0], "inter": now[1],
                                     "allowed": now[2], "share": now[3], "parked": now[4],
                                     "poller_wakes": lib.mtf_poll_count(1)}),
              flush=True)
        last = now
    if sys.stdin.closed:
        break
    time.sleep(0.005)
