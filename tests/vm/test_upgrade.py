"""Slurm's own major upgrade, 24.11 to 26.05, host by host under running jobs, as docs/install.md
section 10 has it (its steps upgrade-begin and upgrade-end run as written), LIVE: `make -C
vm-slurm test-upgrade` boots trixie guests (Slurm 24.11) whose image carries sid's Slurm 26.05 as
a local apt repository (build-image.sh UPGRADE_TO=sid; the guests have no network).

Before: the co-scheduler installed on 24.11 (the `cosched` fixture), a malleable job grown on each
node (vm1: one CPU of its own and one lent; vm2, numbered as a server: one core of its own and
more lent), and a watch of every node's state on vm1. The package for 26.05 is built on vm1
against 26.05's headers unpacked from its libslurm-dev (SLURM_INCLUDE), as a site builds it before
its hosts have the release. Then vm1 (slurmctld's host, first), then vm2 (configless): step
upgrade-begin (the node's jobs back on their allocations), Slurm's packages and ours in one apt
transaction, steps configure, job-submit, restart-slurm, upgrade-end. After each node: its slurmd
is 26.05 by slurmctld's word, both jobs still run, the upgraded node's job grows again, agent.json
kept the site's setting, no CPU is in two jobs' cpusets. After both: a new step of the job that
started under 24.11 runs on the new slurmstepd and its plugin, a new job's Prolog takes the lent
core back, the doctor passes on both nodes, and no node was drained or down at any time.

The login host (vm3: sackd, no slurmd; its login role installed on 24.11) goes last, as the guide
says: with the controller and the nodes on 26.05 and itself still on 24.11, and again after its
own upgrade (sackd, slurm-client and the package for 26.05 in one apt transaction, step
configure, restart-slurm), a user's `sbatch --malleable` there is a malleable job (its plugin,
the one for the host's own release, loaded) and a user's rigid srun runs.

Slurm's facts this relies on (its source, tag slurm-26-05-3-1): slurmctld 26.05 accepts 24.11's
slurmd and clients (SLURM_MIN_PROTOCOL_VERSION); a running slurmstepd outlives slurmd's restart;
cgroup.conf has no CgroupJobIdPaths here (24.11 refuses the key), so 26.05 names its new jobs'
folders by SLUID while the old jobs keep their job_<J> folders, on one node."""
from __future__ import annotations

import json
import re

import pytest

from .conftest import (DIST, GUIDE, GUIDE_ENV, HOOKS, NOTES, SRC, EMULATED_INPUT_BUDGET_MS,
                       Node, Stage, VMs, admin_comment, diagnostics, wait_for)

OLD, NEW = "24.11", "26.05"
RANK = "/opt/malleable/src/tests/programs/allowance_rank.py"
AS_TESTER = "runuser -u tester --"
REPO = "/var/local/slurm-upgrade"           # build-image.sh UPGRADE_TO: sid's Slurm, flat
# apt with the local repository as its only source (the image's own points at the network).
APT = ("apt-get -q -o Dir::Etc::SourceList=/etc/apt/slurm-upgrade.list "
       "-o Dir::Etc::SourceParts=/etc/apt/slurm-upgrade.list.d")
NEW_DIST = f"{DIST}-{NEW}"
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "libslurm-dev", "sackd")
STATES = "/tmp/vmtest-upgrade-states"       # the watch: every node's state, every 2 s
WATCH_PID = "/tmp/vmtest-upgrade-watch.pid"


def slurmd_version(vms: VMs, node: str) -> str:
    """The node's slurmd release, as slurmctld knows it (scontrol show node's Version=)."""
    out = vms.out("vm1", f"scontrol show node {node}", timeout=60)
    m = re.search(r"\bVersion=(\d+\.\d+)", out)
    assert m, out
    return m[1]


def ctld_version(vms: VMs) -> str:
    out = vms.out("vm1", "scontrol show config | grep '^SLURM_VERSION'", timeout=60)
    return ".".join(out.split("=")[-1].strip().split(".")[:2])


def grown(node: Node, job: int, allocation: frozenset[int]) -> frozenset[int] | None:
    cpus = node.job_cpus(job)
    return cpus if cpus is not None and cpus > allocation else None


# The install (the cosched fixture) and three hosts' apt transactions in emulated guests:
# 600 s reached vm2's with the login host's stages in (2026-12-07).
@pytest.mark.timeout(1800)
def test_slurm_upgraded_node_by_node_under_running_jobs(cosched: VMs):
    vms = cosched
    nodes = {n: Node(vms, n) for n in ("vm1", "vm2")}
    assert set(vms.nodes) == set(nodes), f"the test needs vm1 and vm2 (N=2): {vms.nodes}"
    stop = "/tmp/vmtest-upgrade-stop"
    jobs: dict[str, int] = {}
    allocation: dict[str, frozenset[int]] = {}
    try:
        with Stage(f"(g0) the cluster runs {OLD}; the image carries {NEW} (a local repository)"):
            assert ctld_version(vms) == OLD and all(slurmd_version(vms, n) == OLD for n in nodes)
            debs = vms.out("vm1", f"cd {REPO} && ls *.deb").split()
            assert any(d.startswith(f"slurmd_{NEW}") for d in debs), debs
            NOTES.append(f"(g0) {NEW}'s packages in the image: {' '.join(debs)}")
        with Stage("(g1) a malleable job grown on each node; every node's state watched"):
            vms.run("vm1", f"rm -f {stop} {STATES}; nohup sh -c 'while :; do echo \"$(date +%s) "
                           f"$(sinfo -h -N -o \"%N=%T\" 2>&1 | paste -sd\" \")\"; sleep 2; done' "
                           f">{STATES} 2>&1 </dev/null & echo $! > {WATCH_PID}")
            for n, cpus in (("vm1", 1), ("vm2", 2)):
                jobs[n] = int(vms.out("vm1", (
                    f"cd /tmp && {AS_TESTER} sbatch --parsable -N1 -c{cpus} -w {n} -D /tmp "
                    f"-o /tmp/vmtest-g-{n}.out --comment=malleable:min={cpus},max=node "
                    f"--wrap 'exec python3 {RANK} {stop} 2'")).strip().split(";")[0])
            for n, node in nodes.items():
                wait_for(lambda: node.state(jobs[n]) == "RUNNING", timeout=180, interval=2,
                         what=f"job {jobs[n]} running on {n}")
                allocation[n] = node.slurm_wrote(jobs[n])
                cpus = wait_for(lambda n=n, node=node: grown(node, jobs[n], allocation[n]),
                                timeout=300, interval=2,
                                what=f"job {jobs[n]} grown beyond its allocation on {n}",
                                show=lambda n=n: diagnostics(vms, jobs[n]))
                NOTES.append(f"(g1) {n}: job {jobs[n]} allocated {sorted(allocation[n])}, grown "
                             f"to {sorted(cpus)}")
        with Stage(f"(g2) the package for {NEW} built on vm1 against {NEW}'s headers "
                   "(SLURM_INCLUDE: its libslurm-dev unpacked)"):
            out = vms.out("vm1", (
                f"rm -rf /tmp/slurm-new && dpkg-deb -x {REPO}/libslurm-dev_*.deb /tmp/slurm-new && "
                f"cd {SRC} && SLURM_INCLUDE=/tmp/slurm-new/usr/include "
                f"packaging/deb/build-deb.sh {NEW_DIST} 2>&1 && ls {NEW_DIST}"), timeout=600)
            assert f"+slurm{NEW}_" in out, out
            NOTES.append("(g2) " + out.strip().splitlines()[-1])
        for login in vms.logins:
            with Stage(f"(g2 {login}) the login role on {login}, on {OLD}: steps install-package, "
                       "configure"):
                vms.out(login, f"cd {DIST} && {GUIDE_ENV} {GUIDE} run install-package configure "
                               "2>&1", timeout=600)
        for n in ("vm1", "vm2"):
            upgrade(vms, n, nodes, jobs, allocation)
        for login in vms.logins:
            with Stage(f"(g7 {login}) still on {OLD}, beside the {NEW} controller: a user's "
                       "sbatch --malleable and srun"):
                NOTES.append(f"(g7 {login}) on {OLD}: " + login_submits(vms, login, OLD))
            with Stage(f"(g7 {login}) its upgrade: sackd, slurm-client and the package for {NEW}, "
                       "one apt transaction; steps configure, restart-slurm"):
                out = install_new(vms, login)
                vms.out(login, f"cd {NEW_DIST} && {GUIDE_ENV} {GUIDE} run configure restart-slurm "
                               "2>&1", timeout=600)
                NOTES.append(f"(g7 {login}) apt: {' '.join(out.split()[-2:])}")
            with Stage(f"(g7 {login}) on {NEW}: a user's sbatch --malleable and srun"):
                NOTES.append(f"(g7 {login}) on {NEW}: " + login_submits(vms, login, NEW))
        with Stage(f"(g5) after: a new step of the job started under {OLD}; a new job's Prolog "
                   "takes the lent core back; doctor on both nodes"):
            a, node = jobs["vm1"], nodes["vm1"]
            step = vms.out("vm1", f"cd /tmp && {AS_TESTER} srun --jobid={a} --overlap -n1 -c1 "
                                  "grep Cpus_allowed_list /proc/self/status", timeout=180)
            NOTES.append(f"(g5) a new step of job {a} (started under {OLD}) on {NEW}: "
                         f"{step.strip()}; its folders: "
                         + vms.out("vm1", f"cd {node.scope} && ls -d */ | paste -sd' '").strip())
            c = int(vms.out("vm1", (
                f"cd /tmp && {AS_TESTER} sbatch --parsable -N1 -n1 -w vm1 -D /tmp -o /dev/null "
                f"--wrap 'while [ ! -e {stop} ]; do sleep 1; done'")).strip().split(";")[0])
            # Its folder is made when its batch step starts, after the Prologs (slurmctld says
            # RUNNING while they run: 8.5 s in these emulated guests).
            wait_for(lambda: node.job_cpus(c), timeout=180, interval=2,
                     what=f"the new job {c}'s folder on vm1", show=lambda: diagnostics(vms, c))
            held = {a: node.job_cpus(a), c: node.job_cpus(c)}
            assert held == {a: allocation["vm1"], c: frozenset({0, 1}) - allocation["vm1"]} \
                and not node.overlaps(), (held, node.cpusets(), diagnostics(vms, c))
            NOTES.append(f"(g5) job {c} on {NEW} took the lent core back: job folders on vm1 "
                         + json.dumps({k: sorted(v) for k, v in node.cpusets().items()}))
            outs = vms.parallel(lambda _: f"{GUIDE_ENV} {GUIDE} run check 2>&1", timeout=180)
            NOTES.append("(g5) doctor on vm2 after the upgrade:\n" + outs["vm2"].strip())
        with Stage("(g6) no node was drained or down while the watch ran"):
            lines = vms.out("vm1", f"cat {STATES}").splitlines()
            bad = [ln for ln in lines if re.search(r"=(drain|down|fail|not_responding)", ln)]
            assert len(lines) > 10 and not bad, (len(lines), bad[:10])
            NOTES.append(f"(g6) {len(lines)} samples of every node's state, none drained or down; "
                         "states seen: " + " ".join(sorted({s for ln in lines
                                                           for s in ln.split()[1:] if "=" in s})))
    finally:
        vms.run("vm1", f"touch {stop}; kill $(cat {WATCH_PID}); "
                       f"scancel {' '.join(map(str, jobs.values()))}", check=False)


def upgrade(vms: VMs, n: str, nodes: dict[str, Node], jobs: dict[str, int],
            allocation: dict[str, frozenset[int]]) -> None:
    """docs/install.md's upgrade on one host, then what must hold."""
    node = nodes[n]
    with Stage(f"(g3 {n}) step upgrade-begin: the node's job back on its allocation"):
        out = vms.out(n, f"{GUIDE_ENV} {GUIDE} run upgrade-begin 2>&1", timeout=180)
        assert node.job_cpus(jobs[n]) == allocation[n], (node.job_cpus(jobs[n]), out)
        NOTES.append(f"(g3 {n}) upgrade-begin: {out.strip().splitlines()[-1]}")
    with Stage(f"(g3 {n}) Slurm {NEW} and the package for it, one apt transaction"):
        out = install_new(vms, n)
        NOTES.append(f"(g3 {n}) apt: {' '.join(out.split()[-2:])}")
    with Stage(f"(g3 {n}) steps configure, job-submit, restart-slurm, upgrade-end"):
        vms.out(n, f"cd {NEW_DIST} && {GUIDE_ENV} {GUIDE} run configure job-submit restart-slurm "
                   "upgrade-end 2>&1", timeout=600)
    with Stage(f"(g4 {n}) {n}'s slurmd is {NEW}; both jobs run; its job grows again; "
               "agent.json kept the site's setting; no CPU in two jobs"):
        wait_for(lambda: slurmd_version(vms, n) == NEW and
                 vms.out("vm1", f"sinfo -h -n {n} -o %T", timeout=60).strip() in
                 ("mixed", "allocated", "idle"),
                 timeout=300, interval=3, what=f"{n}'s slurmd registered as {NEW}",
                 show=lambda: vms.out("vm1", f"scontrol show node {n}; tail -20 "
                                             "/var/log/slurm/slurmctld.log", check=False))
        assert ctld_version(vms) == NEW
        for m, j in jobs.items():
            assert nodes[m].state(j) == "RUNNING", (m, j, nodes[m].state(j))
        cpus = wait_for(lambda: grown(node, jobs[n], allocation[n]), timeout=300, interval=2,
                        what=f"job {jobs[n]} grown again on {n}",
                        show=lambda: diagnostics(vms, jobs[n]))
        budget = json.loads(vms.out(n, f"cat {HOOKS}/agent.json"))["input_cpu_budget_ms"]
        assert budget == EMULATED_INPUT_BUDGET_MS, budget
        for m in nodes.values():
            assert not m.overlaps(), (m.name, m.overlaps())
        NOTES.append(f"(g4 {n}) slurmd {slurmd_version(vms, n)} by slurmctld's word; job "
                     f"{jobs[n]} grown again to {sorted(cpus)}; slurmd on the other nodes: "
                     + ", ".join(f"{m} {slurmd_version(vms, m)}" for m in nodes if m != n))


def install_new(vms: VMs, host: str) -> str:
    """Slurm's packages the host has, at NEW, and the package built for NEW: one apt
    transaction. What dpkg says of slurm-client's and our versions afterwards."""
    have = vms.out(host, "dpkg-query -W -f '${Package} ${db:Status-Status}\\n' "
                         + " ".join(SLURM_PACKAGES), check=False).split("\n")
    pkgs = [ln.split()[0] for ln in have if ln.endswith(" installed")]
    out = vms.out(host, f"mkdir -p /etc/apt/slurm-upgrade.list.d && cd {NEW_DIST} && {APT} update "
                        "&& DEBIAN_FRONTEND=noninteractive "
                        f"{APT} install -y {' '.join(pkgs)} ./malleable-slurm_*+slurm{NEW}_*.deb "
                        "2>&1 | tail -4 && dpkg-query -W -f '${Version}\\n' slurm-client "
                        "malleable-slurm", timeout=900)
    assert f"+slurm{NEW}" in out and f"{NEW}." in out, out
    return out


def login_submits(vms: VMs, login: str, release: str) -> str:
    """On the login host at ``release``: its sbatch's release, a user's held
    ``sbatch --malleable=1:2`` (a malleable job: job_submit.lua set its AdminComment from the
    plugin's option) and a user's rigid srun on vm2. What was seen, for the notes."""
    version = vms.out(login, "sbatch --version").split()[-1]     # Debian's: "slurm-wlm X.Y.Z"
    assert version.startswith(f"{release}."), version
    held = vms.run(login, f"cd /tmp && {AS_TESTER} sbatch --parsable --hold -w vm2 "
                          "--malleable=1:2 --wrap true", check=False)
    assert held.returncode == 0, (held.stdout, held.stderr)
    job = int(held.stdout.strip().split(";")[0])
    comment = admin_comment(vms, "vm1", job)
    vms.run("vm1", f"scancel {job}", check=False)
    assert comment.startswith("malleable:min=1,max=2"), comment
    ran = vms.run(login, f"cd /tmp && {AS_TESTER} srun -N1 -n1 -w vm2 hostname", check=False,
                  timeout=180)
    assert ran.returncode == 0 and ran.stdout.split() == ["vm2"], (ran.stdout, ran.stderr)
    return (f"sbatch {version}; sbatch --malleable=1:2 gave job {job}, AdminComment {comment}; "
            f"srun -w vm2 hostname: {ran.stdout.strip()}")
