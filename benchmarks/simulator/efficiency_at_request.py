"""How efficiently the users' own sizes use the cores under each speedup model, on the whole of
each trace: the core-second-weighted mean parallel efficiency at the requested size
(``malleable_sim.efficiency_at_request``), for seeds 1-3. No simulation: the workloads only.

    python -m benchmarks.simulator.efficiency_at_request

A model under which it is low makes shrinking look free (the second evaluation's, ``round2``);
the default (``calibrated``) draws it from U(0.5, 0.9) per job. Writes
benchmarks/results/efficiency_at_request.json.
"""
from __future__ import annotations

from benchmarks.common import PWA, TRACES, machine, save


def main() -> None:
    from malleable_sim import SpeedupModel, efficiency_at_request, read_swf, swf_workload
    rows = {}
    for name, nodes, cores in TRACES:
        log = read_swf((PWA / name).read_bytes())
        row: dict[str, object] = {"nodes": nodes, "cores_per_node": cores}
        for model in SpeedupModel:
            values = []
            for seed in (1, 2, 3):
                w = swf_workload(log, nodes=nodes, cores=cores, malleable_fraction=0.5,
                                 seed=seed, speedup=model)
                values.append(round(efficiency_at_request(w.jobs), 4))
            row[model.value] = values
            row["jobs"] = len(w.jobs)
        rows[name] = row
        print(name, {m.value: row[m.value] for m in SpeedupModel})
    save("efficiency_at_request", {
        "benchmark": "efficiency at the requested size per speedup model, whole traces",
        "machine": machine(), "seeds": [1, 2, 3], "goal": [0.5, 0.9], "rows": rows})


if __name__ == "__main__":
    main()
