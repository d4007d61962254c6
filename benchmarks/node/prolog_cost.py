"""What the node Prolog costs a job that did not ask for malleability (issue 40), two rows side
by side in one run, alternating, on this machine:

- quiet: the rendered ``prolog.sh`` under ``sh`` on a quiet node (its quiet file present, the
  job's environment without a sign of malleability): it exits in its shell;
- python_floor: what the Prolog costs at least when it starts Python (a node that is not quiet):
  the interpreter's start and the hook's imports (``python -I -c "import
  slurm_plugin.hooks.job_hooks"``); its cycle under the node's lock and the job's tmpfs come
  on top (about 10 ms here, in the hooks log).

    python -m benchmarks.node.prolog_cost [--runs 30]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, median, percentile, save
from slurm_plugin.hooks.install import render_hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="malleable-prolog-bench-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        (state / "quiet-n1").write_text("")
        prolog = Path(tmp) / "prolog.sh"
        prolog.write_text(render_hook("prolog.sh", python=sys.executable,
                                      config=Path(tmp) / "agent.json", state_dir=state))
        env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "5",
               "SLURM_JOB_UID": "1000", "SLURM_JOB_COMMENT": ""}
        rows: dict[str, list[float]] = {"quiet": [], "python_floor": []}
        commands = {"quiet": ["sh", str(prolog)],
                    "python_floor": [sys.executable, "-I", "-c",
                                     "import slurm_plugin.hooks.job_hooks"]}
        for _ in range(args.runs):
            for name, argv in commands.items():
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, check=True, cwd="/")
                rows[name].append((time.perf_counter() - t0) * 1000)
    out = {name: {"p50_ms": round(median(v), 2), "p90_ms": round(percentile(v, 90), 2),
                  "runs": len(v)} for name, v in rows.items()}
    for name, r in out.items():
        print(f"{name:14s} p50 {r['p50_ms']:7.2f} ms  p90 {r['p90_ms']:7.2f} ms")
    ratio = out["python_floor"]["p50_ms"] / out["quiet"]["p50_ms"]
    print(f"the quiet Prolog is {ratio:.0f}x cheaper than Python's start alone")
    save("prolog_cost", {"machine": machine(), "rows": out,
                         "floor_over_quiet_p50": round(ratio, 1)})


if __name__ == "__main__":
    main()
