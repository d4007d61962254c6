"""File-system operations an idle node agent makes on the feed folder, per second, counted by
strace on a real agent of a 2-node cluster (no job running), in each feed mode:

- local: the folder's file system is this kernel's (inotify tells the agent of changes);
- shared: as on NFS (the agent is told so): the watcher's wake datagrams, and a look at the
  files every feed_refresh_s (10 s).

Every syscall naming a path under the feed folder counts (stat, open, read of it...): on NFS
each stat or open is at least one request to the file server. The 1,000-node figure is the
per-node rate times 1,000.

    python -m benchmarks.node.feed_metadata_ops [--seconds 30]      (needs strace)
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import machine, save

from slurm_plugin.cluster import LocalCluster, default_spec
from malleable_policy.model import Policy


def count_ops(pid: int, feed: Path, seconds: float) -> Counter:
    out = Path(tempfile.mktemp(prefix="feed-strace-"))
    subprocess.run(["timeout", str(seconds), "strace", "-f", "-p", str(pid), "-o", str(out),
                    "-e", "trace=%file,%desc"], capture_output=True)
    ops: Counter = Counter()
    for line in out.read_text().splitlines():
        m = re.search(r"(\w+)\(.*\"(" + re.escape(str(feed)) + r"[^\"]*)\"", line)
        if m:
            ops[f"{m[1]} {m[2][len(str(feed)):]}"] += 1
    out.unlink()
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("strace is not installed (apt-get install strace)")
    base = Path(tempfile.mkdtemp(prefix="malleable-feedops-", dir="/tmp"))
    base.chmod(0o755)
    c = LocalCluster(default_spec(base, nodes=2, port_base=4817, node_prefix="fo",
                                  name="malleablefo", feed_link=False))
    rows = {}
    try:
        c.up(agents=Policy.LEND_IDLE)
        feed = c.agent_config().feed_dir
        agent_json = c.hooks_dir / "agent.json"
        original = json.loads(agent_json.read_text())
        for mode in ("local", "shared"):
            agent_json.write_text(json.dumps({**original, "feed_mode": mode}))
            rec = c.restart_agent("fo1")
            time.sleep(3)
            ops = count_ops(rec.pid, feed, args.seconds)
            total = sum(ops.values())
            rows[mode] = {"ops": total, "seconds": args.seconds,
                          "ops_per_s_per_node": round(total / args.seconds, 3),
                          "ops_per_s_at_1000_nodes": round(total / args.seconds * 1000, 1),
                          "by_call": dict(ops.most_common())}
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)
    data = {"machine": machine(), "modes": rows,
            "goal": "at most 1 metadata operation per node per second on a shared file "
                    "system when idle"}
    path = save("feed_metadata_ops", data)
    for mode, r in rows.items():
        print(f"{mode}: {r['ops_per_s_per_node']} ops/s per node, "
              f"{r['ops_per_s_at_1000_nodes']} at 1,000 nodes; {r['by_call']}")
    print("->", path)


if __name__ == "__main__":
    main()
