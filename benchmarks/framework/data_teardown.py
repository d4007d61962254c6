"""How long a tf.data pipeline's iterator takes to go, and what the pipeline runs at before.

tf.data's autotuner thread can miss its cancellation (TensorFlow's CancellationManager runs the
callback that wakes it before it marks itself cancelled): the iterator's teardown then waits out
the autotuner's current period, which doubles while the iterator lives (up to 60 s). Malleable
jobs of the co-scheduling benchmark outlived their last step by 6-20 s that way.
``malleable_tf.data.options()`` turns the autotuner off; this measures the three pipelines side
by side, each trial a fresh process running the tf.data workload for ``--seconds``, resized
every 1.5 s between 1 and 2 threads (as the agent does) for the malleable ones, then deleting
the iterator:

- ``plain``: TensorFlow's own map (AUTOTUNE), no malleable_tf;
- ``autotune``: ``malleable_tf.data.map`` with ``options(autotune=True)`` (the code before);
- ``malleable``: ``malleable_tf.data.map`` as it is.

    python -m benchmarks.framework.data_teardown [--trials 8] [--seconds 9] [--name data_teardown]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time

VARIANTS = ("plain", "autotune", "malleable")
# A teardown longer than this waited for the autotuner (the others take 0.1-0.3 s here).
LINGER_S = 1.0


def worker(variant: str, seconds: float) -> dict:
    if variant != "plain":
        import malleable_tf
        import malleable_tf.data
        malleable_tf.init(max_threads=2, follow=False)
    from benchmarks.framework.workloads import tf_data_step

    data_map = None
    if variant != "plain":
        def data_map(ds, fn, **kwargs):
            return ds.map(malleable_tf.data.gate(fn), **kwargs).with_options(
                malleable_tf.data.options(autotune=variant == "autotune"))
    step = tf_data_step(data_map)
    steps, start, threads = 0, time.monotonic(), 2
    next_resize = start + 1.5
    while time.monotonic() - start < seconds:
        step()
        steps += 1
        if variant != "plain" and time.monotonic() >= next_resize:
            threads = 3 - threads
            malleable_tf.set_threads(intra=threads, inter=threads)
            next_resize += 1.5
    ran = time.monotonic() - start
    t0 = time.monotonic()
    del step
    gc.collect()
    return {"variant": variant, "steps_per_s": steps / ran, "teardown_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=9.0)
    ap.add_argument("--name", default="data_teardown")
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.seconds)), flush=True)
        return 0
    from benchmarks.common import machine, median, run_worker, save
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for trial in range(args.trials):
        for variant in VARIANTS:   # interleaved: the machine's noise falls on all three
            r = run_worker("benchmarks.framework.data_teardown",
                           ["--worker", variant, "--seconds", str(args.seconds)],
                           env={"TF_CPP_MIN_LOG_LEVEL": "2", "MALLEABLE_TF_LOG": "0"})
            runs[variant].append(r)
            print(f"trial {trial} {variant:9s} {r['steps_per_s']:7.1f} steps/s  "
                  f"teardown {r['teardown_s']:.2f} s", flush=True)
    summary = {}
    for variant, rs in runs.items():
        teardowns = [r["teardown_s"] for r in rs]
        summary[variant] = {
            "trials": len(rs), "lingered": sum(t > LINGER_S for t in teardowns),
            "teardown_median_s": median(teardowns), "teardown_max_s": max(teardowns),
            "steps_per_s_median": median([r["steps_per_s"] for r in rs])}
    summary["malleable_over_autotune_steps"] = (summary["malleable"]["steps_per_s_median"]
                                                / summary["autotune"]["steps_per_s_median"])
    save(args.name, {"about": __doc__, "seconds": args.seconds, "linger_threshold_s": LINGER_S,
                     "machine": machine(), "summary": summary, "runs": runs})
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
