"""A malleable rank without TensorFlow, for machines too slow to run it (the cgroup v2 virtual
machines under emulation). It follows its allowance with malleable_tf's own reader (the
cpuset of its cgroup, as MALLEABLE_TF_ALLOWANCE=cgroup), keeps as many worker threads
working as its share of those cores (the protocol's split, like malleable_tf's pools), pins
its threads to that share (as malleable_tf does), and
writes real RankStatus records where malleable_tf would: inside a job whose folder the node's
Prolog made, MALLEABLE_RUN_DIR/jobs/job_<J>/rank_<r>.<step>.json.

    allowance_rank.py STOP_FILE [MAX_THREADS]

Standard library and the project's stdlib-only modules only (malleable_protocol and
malleable_runtime.allowance, which imports no TensorFlow).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from malleable_protocol import RankStatus, RunLayout, step_folder
from malleable_protocol.layout import DEFAULT_RUN_DIR
from malleable_runtime.allowance import (AllowanceFollower, CgroupReader, local_rank_and_size,
                                    read_affinity, share_of)
from malleable_runtime.telemetry import write_status

stop_file = Path(sys.argv[1])
max_threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1
env = os.environ
job = int(env["SLURM_JOB_ID"])
rank = int(env.get("SLURM_PROCID", "0"))
local_rank, local_size = local_rank_and_size()
step = step_folder(env.get("SLURM_STEP_ID"))
status = RunLayout(Path(env.get("MALLEABLE_RUN_DIR") or DEFAULT_RUN_DIR)) \
    .status_file(job, rank, step)

follower = AllowanceFollower(lambda: read_affinity(0), CgroupReader(), mask_restricts=False)
active = 1
steps = [0] * max_threads
wake = threading.Event()
lock = threading.Lock()


def worker(i: int) -> None:
    """While it is among the ``active`` first workers: a burst of work, then a pause nine times
    as long, else parked on ``wake``. A tenth busy: under emulation (TCG) a busy guest CPU is a
    busy host thread, vm2's 8 would hold all of CI's cores, and the tests look at how many
    threads work and where, not how hard."""
    while not stop_file.exists():
        if i < active:
            start = time.monotonic()
            x = 0
            for _ in range(2000):
                x += 1
            with lock:
                steps[i] += 1
            time.sleep(max(0.005, 9 * (time.monotonic() - start)))
        else:
            wake.wait(0.05)


for i in range(max_threads):
    threading.Thread(target=worker, args=(i,), daemon=True).start()
# The agent's "look again": the signal our record names (reload_signal), handled before the first
# record says so (ours polls anyway).
signal.signal(signal.SIGUSR1, lambda *_: None)
rates: dict[int, float] = {}
last_steps, last_t = 0, time.monotonic()
pinned: frozenset[int] = frozenset()
while not stop_file.exists():
    follower.refresh()
    share = share_of(follower.current, local_rank, local_size)
    active = max(1, min(max_threads, len(share)))
    if share != pinned:              # as malleable_tf pins its pools: every thread, its share
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), share)
            except OSError:
                pass
        pinned = frozenset(share)
    wake.set()
    wake.clear()
    now = time.monotonic()
    total = sum(steps)
    if now - last_t >= 0.5:
        rates[active] = round((total - last_steps) / (now - last_t), 2)
        last_steps, last_t = total, now
    try:                             # as malleable_tf's Telemetry.write: never fatal
        write_status(status, RankStatus(
            pid=os.getpid(), rank=rank, local_rank=local_rank, local_size=local_size,
            intra_active=active, intra_pool=max_threads, inter_active=1, inter_pool=1,
            node=env.get("SLURMD_NODENAME", ""), allowed_cpus=follower.current.cpus,
            share_cpus=frozenset(share), steps_per_s=rates, steps=total, updated=time.time(),
            reload_signal=signal.SIGUSR1))
    except OSError:                  # its folder gone (an uninstall): the rank runs on
        pass
    time.sleep(0.05)
print(f"stopped: {sum(steps)} steps; active {active} of {max_threads}", flush=True)
