"""A matmul loop in the main thread (the training thread) under malleable_torch; one JSON line
whenever what the training thread runs with changes.

    torch_follow.py MAX_THREADS RECHECK_S STOPFILE [CGROUP]

The test changes the allowance from outside (taskset, a cpuset cgroup), sends signals or calls
nothing. A long RECHECK_S leaves the poll (and signals) as the only ways a change is noticed.
STATE lines carry torch.get_num_threads() read IN the training thread (the count PyTorch runs
its ops with there) and the CPU time the process used per second over the last 0.3 s.
"""
import json
import os
import sys
import time

if len(sys.argv) > 4:
    with open(os.path.join(sys.argv[4], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))

import malleable_torch  # noqa: E402
import torch  # noqa: E402

malleable_torch.init(max_threads=int(sys.argv[1]), recheck_interval_s=float(sys.argv[2]))
stop = sys.argv[3]
a = torch.randn(384, 384)
last = None
print("READY", flush=True)
deadline = time.time() + 120
window_start, cpu_start = time.monotonic(), time.process_time()
cpu_rate = 0.0
while time.time() < deadline and not os.path.exists(stop):
    a @ a
    now_t = time.monotonic()
    if now_t - window_start > 0.3:
        cpu_rate = (time.process_time() - cpu_start) / (now_t - window_start)
        window_start, cpu_start = now_t, time.process_time()
    s = malleable_torch.threads()
    now = (s.intra_active, torch.get_num_threads(), sorted(s.allowed_cpus), sorted(s.share_cpus))
    if now != last:
        rt = malleable_torch.runtime()
        print("STATE " + json.dumps({"t": time.time(), "intra": now[0], "torch": now[1],
                                     "allowed": now[2], "share": now[3],
                                     "poll_wakes": rt._wakeups.wakes}), flush=True)
        last = now
    elif os.environ.get("REPORT_CPU") and int(now_t * 2) != int((now_t - 0.001) * 2):
        print("CPU " + json.dumps({"torch": now[1], "cpu": round(cpu_rate, 3)}), flush=True)
