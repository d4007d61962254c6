"""The co-scheduler LIVE on cgroup v2: Debian trixie's Slurm 24.11 under systemd in vm-slurm's
virtual machines (Debian's multiple-slurmd build, its v2 scope named after the node; or, with
`make -C vm-slurm test SLURM_BUILD=production`, Slurm built as most sites build it, whose jobs
are under system.slice/slurmstepd.scope).
The scenario of tests/site/test_production_layout.py, with tests/programs/allowance_rank.py as
the malleable rank (TensorFlow does not run under emulation): a job grows into the idle core
and its rank follows; a new job gets its core back before its script runs (the Prolog);
`scontrol update ... Comment=malleable:cpus=1` shrinks it; grown again (cpus=2), a step starts
in it (the SPANK plugin); no CPU is ever in two jobs' cpusets. Jobs run as the VMs' `tester` (uid 1000)."""
from __future__ import annotations

import time

from malleable_protocol import parse_cpu_list

from .conftest import NOTES, RUN_DIR, SLURM_CONF, Node, Stage, VMs, diagnostics, wait_for

NODE = "vm1"
RANK = "/opt/malleable/src/tests/programs/allowance_rank.py"
AS_TESTER = "runuser -u tester --"


def test_discover_layout_reports_v2_and_the_node_scope(cosched: VMs):
    # Where Slurm's naming rule puts vm1's jobs on v2 for the cluster's build (Debian's:
    # multiple-slurmd; or the production build), as the layout's owner says; discovery inside
    # the VM must find the same.
    scope = str(Node(cosched, NODE).layout.node_dir())
    with Stage("(a) discover_layout in vm1"):
        out = cosched.out(NODE, (
            "python3 -c 'from slurm_plugin.cgroups import discover_layout as d; "
            f"l = d(\"{NODE}\", slurm_conf=\"{SLURM_CONF}\"); "
            "print(l.version.value, l.node_dir(), l.multiple_slurmd)'"))
        assert out.split() == ["v2", scope, str(cosched.multiple_slurmd)], out
        cli = cosched.out(NODE, f"python3 -m slurm_plugin.commands.main cgroups --node {NODE}")
        assert cli.startswith(f"cgroup v2, {scope}/job_<J> or <SLUID>/step_<S>/user/task_<T>"), cli


def test_grow_step_reclaim_and_shrink_on_cgroup_v2(cosched: VMs):
    vms, node = cosched, Node(cosched, NODE)
    stop = "/tmp/vmtest-stop-a"
    vms.run(NODE, f"rm -f {stop} /tmp/vmtest-a.out /tmp/vmtest-b.out")

    def show(job: int):
        return lambda: (f"job {job}: {node.state(job)} cpus {node.job_cpus(job)} "
                        f"record {node.record(job)}\n"
                        + vms.out(NODE, "cat /tmp/vmtest-a.out /tmp/vmtest-b.out 2>/dev/null | "
                                  "tail -20", check=False)
                        + diagnostics(vms, job))

    def no_overlap(when: str):
        problems = node.overlaps()
        assert not problems, f"{when}: {problems}"

    with Stage("(b) submit A, grow into the idle core, rank at 2 threads"):
        a = int(vms.out(NODE, (
            f"cd /tmp && {AS_TESTER} sbatch --parsable -N1 -c1 -w {NODE} -D /tmp "
            f"-o /tmp/vmtest-a.out --comment=malleable:min=1,max=2 "
            f"--wrap 'exec python3 {RANK} {stop} 2'")).strip().split(";")[0])
        try:
            wait_for(lambda: (r := node.record(a)) and r["allowed"] == {0, 1}
                     and r["intra_active"] == 2 and r["steps"] > 0,
                     timeout=300, interval=2, what="A grown to 2 CPUs, its rank at 2 threads",
                     show=show(a))
            # Once seen grown it must stay so (nothing else asks): if it does not, say what the
            # node held then (a CI run saw the job folder back at {0} once, and nothing more).
            held = (node.job_cpus(a), node.job_cpus(a, "step_batch"))
            assert held == ({0, 1}, {0, 1}), f"A's job and step folders {held}\n{show(a)()}"
            no_overlap("A grown")
            rec = node.record(a)
            NOTES.append(f"(b) job {a} grown: job folder {sorted(node.job_cpus(a))}, rank "
                         f"allowed {sorted(rec['allowed'])} intra_active {rec['intra_active']}; "
                         f"rank threads' Cpus_allowed_list (count mask): "
                         f"{node.affinity(rec['pid'])}")
        except BaseException:
            vms.run(NODE, f"touch {stop}; scancel {a}", check=False)
            raise
    try:
        with Stage("(c) B gets its core back before its script runs; A's rank down to 1"):
            b_script = (f"echo B=$(python3 -m slurm_plugin.commands.main cgroups --node {NODE} "
                        f"--job $SLURM_JOB_ID) A=$(python3 -m slurm_plugin.commands.main cgroups "
                        f"--node {NODE} --job {a}); sleep 20")
            b = int(vms.out(NODE, (
                f"cd /tmp && {AS_TESTER} sbatch --parsable -N1 -n1 -w {NODE} -D /tmp "
                f"-o /tmp/vmtest-b.out --wrap '{b_script}'")).strip().split(";")[0])
            out = wait_for(lambda: (o := vms.out(NODE, "cat /tmp/vmtest-b.out", check=False))
                           and "B=" in o and o, timeout=300, interval=2,
                           what="B's script printed its CPUs and A's", show=show(b))
            fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
            b_cpus, a_cpus = parse_cpu_list(fields["B"]), parse_cpu_list(fields["A"])
            assert b_cpus and a_cpus and not (b_cpus & a_cpus), out
            NOTES.append(f"(c) job {b} started with B={sorted(b_cpus)} while A={sorted(a_cpus)}")
            no_overlap("B running")
            wait_for(lambda: (r := node.record(a)) and r["intra_active"] == 1
                     and len(r["allowed"]) == 1, timeout=60, interval=1,
                     what="A's rank down to 1 CPU, 1 thread", show=show(a))
            wait_for(lambda: node.state(b) == "COMPLETED", timeout=180, interval=2,
                     what="B completed", show=show(b))
            wait_for(lambda: node.job_cpus(a) == {0, 1}, timeout=120, interval=2,
                     what="A grown back after B", show=show(a))
            no_overlap("A grown back")

        with Stage("(d) scontrol update Comment=malleable:cpus=1 shrinks A, rank to 1"):
            vms.run(NODE, f"{AS_TESTER} scontrol update JobId={a} Comment=malleable:cpus=1")
            wait_for(lambda: (r := node.record(a)) and len(r["allowed"]) == 1
                     and r["intra_active"] == 1, timeout=120, interval=1,
                     what="A shrunk to 1 CPU, its rank to 1 thread", show=show(a))
            assert len(node.job_cpus(a)) == 1
            time.sleep(5)    # and it stays there (the agent does not grow it back)
            assert len(node.job_cpus(a)) == 1 and node.record(a)["intra_active"] == 1
            no_overlap("A shrunk")

        with Stage("(e) A grown again (cpus=2), a step (srun -n1 true) in it, regrown"):
            vms.run(NODE, f"{AS_TESTER} scontrol update JobId={a} Comment=malleable:cpus=2")
            wait_for(lambda: node.job_cpus(a) == {0, 1}, timeout=120, interval=2,
                     what="A grown again to 2 CPUs (cpus=2)", show=show(a))
            no_overlap("A grown again")
            r = vms.run(NODE, f"cd /tmp && {AS_TESTER} srun --jobid={a} --overlap -n1 true",
                        check=False, timeout=300)
            assert r.returncode == 0, (
                f"srun in the grown job {a} failed: {r.stderr.strip()}\nslurmd: "
                + vms.out(NODE, "grep -h 'malleable\\|spank' /var/log/slurm/slurmd.log | "
                                "tail -6", check=False) + "\n" + show(a)())
            hooks = vms.out(NODE, f"grep 'job {a} step_0 start' "
                                  f"{RUN_DIR}/agent/hooks-{NODE}.log", check=False)
            assert "resizes" in hooks, ("the SPANK plugin's step-start hook did not run", hooks)
            NOTES.append(f"(e) step-start hook: {hooks.strip()}")
            no_overlap("after the step")
            wait_for(lambda: node.job_cpus(a) == {0, 1}, timeout=120, interval=2,
                     what="A grown again after the step", show=show(a))
            no_overlap("A regrown")

        with Stage("A stops (its stop file) and completes"):
            vms.run(NODE, f"touch {stop}")
            wait_for(lambda: node.state(a) == "COMPLETED", timeout=120, interval=2,
                     what="A completed", show=show(a))
            assert "stopped:" in vms.out(NODE, "cat /tmp/vmtest-a.out")
    finally:
        vms.run(NODE, f"touch {stop}; scancel {a}", check=False)



def test_the_daemons_run_hardened_as_their_units_say(cosched: VMs):
    """Issue 40: the package's units restrict the agent and the watcher (systemd.exec(5)); the
    grow, step and shrink test above ran under them. Here: systemd applied them to the
    running services, and how exposed each is by systemd's own measure (0 best, 10 worst)."""
    with Stage("(h) the units' hardening in effect"):
        for unit in (f"malleable-agent@{NODE}", "malleable-watcher"):
            props = dict(line.partition("=")[::2] for line in cosched.out(NODE, (
                f"systemctl show {unit} -p ActiveState -p NoNewPrivileges -p ProtectSystem "
                "-p RestrictNamespaces -p CapabilityBoundingSet")).splitlines())
            assert props["ActiveState"] == "active", (unit, props)
            assert props["NoNewPrivileges"] == "yes" and props["ProtectSystem"] == "full", props
            assert "cap_sys_admin" not in props["CapabilityBoundingSet"], props
            assert "cap_kill" in props["CapabilityBoundingSet"] or unit == "malleable-watcher"
            exposure = cosched.out(NODE, f"systemd-analyze security --no-pager {unit} | tail -1",
                                   check=False).strip()
            # The same unit without its hardening block, for comparison (offline analysis).
            plain = cosched.out(NODE, (
                f"f=$(systemctl show -p FragmentPath --value {unit}); d=$(mktemp -d); "
                f"sed '/^# Hardening/,/^RestrictAddressFamilies/d' \"$f\" > \"$d/{unit}.service\"; "
                f"systemd-analyze security --offline=yes --no-pager \"$d/{unit}.service\" | "
                "tail -1"), check=False).strip()
            NOTES.append(f"{unit}: {exposure}; without the hardening: {plain}")
