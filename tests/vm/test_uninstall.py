"""docs/install.md's uninstall (section 11), run as written in the VM cluster, last (it removes
what the other tests use), with a malleable job running grown and a rigid one running:
afterwards both still run, each holds exactly its Slurm allocation, and nothing of ours is left
on any host, the login host's included (no unit, package, mount or folder; every Slurm file as
it was before the install; `--malleable` unknown to sbatch there again).

vm1's CPUs are numbered as Slurm's abstract ids are (one socket, no SMT), so a job's cpuset
there is its CPU_IDs as `scontrol show job -d` gives them."""
from __future__ import annotations

import json

from malleable_protocol import parse_cpu_list

from .conftest import (GUIDE, GUIDE_ENV, NOTES, SLURM_CONF, SLURM_FILES_BEFORE, Node, Stage, VMs,
                       changed_files, diagnostics, slurm_files, undo_chains, wait_for)

NODE = "vm1"
RANK = "/opt/malleable/src/tests/programs/allowance_rank.py"
AS_TESTER = "runuser -u tester --"


def slurm_cpus(vms: VMs, job: int) -> frozenset[int]:
    out = vms.out(NODE, f"scontrol show job -d {job} | grep -o 'CPU_IDs=[^ ]*'", timeout=60)
    return parse_cpu_list(out.strip().partition("=")[2])


def test_uninstall_leaves_every_job_on_its_allocation_and_nothing_of_ours(cosched: VMs):
    vms, node = cosched, Node(cosched, NODE)
    stop = "/tmp/vmtest-uninstall-stop"
    vms.run(NODE, f"rm -f {stop}")
    a = b = None
    try:
        with Stage("(u1) a malleable job grown into vm1's idle core"):
            a = int(vms.out(NODE, (
                f"cd /tmp && {AS_TESTER} sbatch --parsable -N1 -c1 -w {NODE} -D /tmp "
                f"-o /tmp/vmtest-u.out --comment=malleable:min=1,max=node "
                f"--wrap 'exec python3 {RANK} {stop} 2'")).strip().split(";")[0])
            wait_for(lambda: node.job_cpus(a) == {0, 1}, timeout=300, interval=2,
                     what="the malleable job grown to both CPUs",
                     show=lambda: diagnostics(vms, a))
            # Its user, who may not read the feed, sees it (and only his own) with status.
            mine = json.loads(vms.out(NODE, f"cd /tmp && {AS_TESTER} malleable status --json"))
            assert [(r["job_id"], r["current_cpus"]) for r in mine] == [(a, "0-1")], mine
            NOTES.append(f"(u1) tester's own malleable status on {NODE}: {mine}")
        with Stage("(u2) step uninstall-return on every node: the job back to its allocation"):
            outs = vms.parallel(lambda n: f"{GUIDE_ENV} {GUIDE} run uninstall-return 2>&1",
                                timeout=180)
            allocation = slurm_cpus(vms, a)
            assert len(allocation) == 1 and node.job_cpus(a) == allocation, (
                allocation, node.job_cpus(a), outs[NODE])
            NOTES.append(f"(u2) uninstall-return on {NODE}: {outs[NODE].strip().splitlines()[-1]}")
            b = int(vms.out(NODE, (
                f"cd /tmp && {AS_TESTER} sbatch --parsable -N1 -n1 -w {NODE} -D /tmp "
                f"-o /dev/null --wrap 'while [ ! -e {stop} ]; do sleep 1; done'"))
                .strip().split(";")[0])
            wait_for(lambda: node.state(b) == "RUNNING", timeout=180, interval=2,
                     what="a rigid job running beside it")
        with Stage("(u3) the admin's part: 'Include malleable.conf' out of every slurm.conf "
                   "(and a chain slurm-conf asked for undone)"):
            for n in vms.nodes:
                if n not in vms.configless:
                    vms.run(n, f"sed -i '/^Include malleable.conf$/d' {SLURM_CONF}")
            undo_chains(vms)
        with Stage("(u4) step uninstall-unhook (vm1 first; the login host too), every node idle "
                   "or allocated"):
            vms.run("vm1", f"{GUIDE_ENV} {GUIDE} run uninstall-unhook 2>&1", timeout=180)
            vms.parallel(lambda n: "true" if n == "vm1" else
                         f"{GUIDE_ENV} {GUIDE} run uninstall-unhook 2>&1", timeout=180,
                         hosts=vms.hosts)
            wait_for(lambda: all(s in ("idle", "mixed", "allocated") for s in vms.out(
                "vm1", "sinfo -h -N -o '%T'", check=False, timeout=60).split()),
                timeout=240, interval=2, what="every node back after Slurm's restart")
            text = vms.out("vm1", "scontrol show config")
            assert "malleable" not in text, [ln for ln in text.splitlines() if "malleable" in ln]
        with Stage("(u5) step uninstall-remove on every host"):
            vms.parallel(lambda n: f"{GUIDE_ENV} {GUIDE} run uninstall-remove 2>&1", timeout=300,
                         hosts=vms.hosts)
        with Stage("(u6) both jobs still run, each on exactly its allocation"):
            for job in (a, b):
                assert node.state(job) == "RUNNING", (job, node.state(job))
                assert node.job_cpus(job) == slurm_cpus(vms, job), (
                    job, node.job_cpus(job), slurm_cpus(vms, job))
            assert not node.overlaps(), node.overlaps()
        with Stage("(u7) nothing of ours on any host; every Slurm file as before the install"):
            for n in vms.hosts:
                left = vms.out(n, (
                    "systemctl list-units --all --plain --no-legend 'malleable*' | cut -d' ' -f1; "
                    "dpkg -s malleable-slurm 2>/dev/null | grep -m1 '^Status'; "
                    "grep -c ' /run/malleable' /proc/self/mountinfo; "
                    "ls -d /run/malleable /etc/malleable /var/lib/malleable/watcher "
                    "/usr/lib/malleable /usr/bin/malleable 2>/dev/null"), check=False).split()
                assert left == ["0"], f"{n}: left behind: {left}"
                changes = changed_files(SLURM_FILES_BEFORE[n], slurm_files(vms, n))
                assert changes == {}, f"{n}: Slurm files differ from before the install: {changes}"
            for n in vms.logins:
                again = vms.run(n, "cd /tmp && runuser -u tester -- sbatch --malleable=1 --hold "
                                   "--wrap true", check=False)
                assert again.returncode != 0 and "unrecognized option" in again.stderr, (
                    n, again.stdout, again.stderr)
            NOTES.append(f"(u7) after the uninstall: jobs {a} (malleable) and {b} (rigid) running "
                         f"on {sorted(slurm_cpus(vms, a))} and {sorted(slurm_cpus(vms, b))}, "
                         "their allocations; no unit, package, mount or folder of ours; Slurm "
                         "files as before on " + ", ".join(vms.hosts))
    finally:
        vms.run(NODE, f"touch {stop}; scancel {a or ''} {b or ''}", check=False)
