"""What reading a node's CPU numbering costs (slurm_plugin/topology.py: sysfs read, Slurm's
abstract->Linux map built), which every hook pays once per call (the Prolog at each job start)
and the agent at start. Real machines' sysfs files (tests/fixtures/topology, from hwloc's test
data) are written to a folder on tmpfs and read as a node's; the thread CPU time of one read,
best and median of ``--repeat`` reads per machine. This machine's own sysfs is measured beside
them.

    python -m benchmarks.node.cpu_numbering [--repeat 50]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, machine, median, save

from slurm_plugin.topology import SYSFS_CPU, SYSFS_NODE, node_numbering

FIXTURES = REPO / "tests" / "fixtures" / "topology"


def cost(cpu_dir: Path, node_dir: Path, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        numbering = node_numbering(cpu_dir=cpu_dir, node_dir=node_dir)
        times.append((time.thread_time() - t0) * 1000)
    return {"cpus": len(numbering.linux_of), "layout": str(numbering.layout),
            "cpu_ms_best": round(min(times), 3), "cpu_ms_median": round(median(times), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    rows = {"this machine": cost(SYSFS_CPU, SYSFS_NODE, args.repeat)}
    with tempfile.TemporaryDirectory(prefix="cpu-numbering-", dir="/dev/shm") as tmp:
        for path in sorted(FIXTURES.glob("*.json")):
            files = json.loads(path.read_text())["sysfs"]
            root = Path(tmp) / path.stem
            for rel, text in files.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text(text)
            try:
                rows[path.stem] = cost(root / "devices/system/cpu",
                                       root / "devices/system/node", args.repeat)
            except Exception as exc:  # noqa: BLE001 - a refused machine is a result too
                rows[path.stem] = {"refused": str(exc)[:120]}
    for name, row in rows.items():
        print(f"{name:32s} {row}")
    save("cpu_numbering", {"benchmark": "cpu_numbering", "machine": machine(),
                           "repeat": args.repeat, "machines": rows})


if __name__ == "__main__":
    main()
