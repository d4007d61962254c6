"""docs/install.md's login role, LIVE on a login host as configless sites run them (vm-slurm's
vm<N+1>, `LOGIN=1`): no slurmd and no Slurm file of its own; sackd fetched vm1's configuration
into /run/slurm/conf, where sbatch, salloc and srun read it. The cluster's nodes and controller
are installed already (the `cosched` fixture), so what the login host reads is the installed
controller's configuration.

- Before the login role is installed there: a user's rigid job from the login host runs (the
  controller's configuration does not break a host without the package); `--malleable` is an
  unrecognized option, and `--comment=malleable:...` asks for malleability all the same
  (job_submit.lua reads it on the controller).
- Step restart-slurm ran there with every host's (the `cosched` fixture): it restarts sackd,
  which fetched the installed controller's files again.
- The guide's steps for the login role (install-package, configure) run as written. Its Slurm
  files change by the drop-ins of configure only.
- Then a user's `sbatch --malleable=1:2` from the login host gives a malleable job (its
  AdminComment, by job_submit.lua), which grows into vm1's idle core.
The guide's uninstall runs on the login host with the others' (test_uninstall.py)."""
from __future__ import annotations

from .conftest import (DIST, GUIDE, GUIDE_ENV, NOTES, Node, Stage, VMs, admin_comment,
                       changed_files, CONFIGURE_DROP_INS, diagnostics, slurm_files, wait_for)

NODE = "vm1"
RANK = "/opt/malleable/src/tests/programs/allowance_rank.py"
AS_TESTER = "cd /tmp && runuser -u tester --"


def test_the_login_role_on_a_configless_login_host(cosched: VMs):
    vms = cosched
    assert vms.logins, "no login host in this cluster (vm-slurm's LOGIN=1 boots one)"
    login, node = vms.logins[0], Node(vms, NODE)
    stop = "/tmp/vmtest-login-stop"
    vms.run(NODE, f"rm -f {stop}")
    before = slurm_files(vms, login)
    a = None
    try:
        with Stage(f"(l1) {login} before its install: a rigid job runs; --malleable unknown; "
                   "--comment=malleable: still asks"):
            fetched = vms.out(login, "ls /run/slurm/conf").split()
            assert "slurm.conf" in fetched, fetched
            assert vms.out(login, "test -e /etc/slurm/slurm.conf || echo none").strip() == "none"
            # vm1's slurm.conf Includes malleable.conf since the install: sackd fetched it again
            # when step restart-slurm restarted it (slurmctld's restart pushes nothing).
            assert "malleable.conf" in fetched and vms.out(
                login, "grep -c '^Include malleable.conf' /run/slurm/conf/slurm.conf",
                check=False).strip() == "1", fetched
            NOTES.append(f"(l1) {login}: sackd's copy of vm1's configuration: {fetched}; "
                         "systemctl is-active slurmd: "
                         + vms.out(login, "systemctl is-active slurmd", check=False).strip())
            ran = vms.run(login, f"{AS_TESTER} srun -N1 -w {NODE} hostname", check=False,
                          timeout=180)
            assert ran.returncode == 0 and ran.stdout.split() == [NODE], (
                "a rigid job from the login host, where the package is not installed",
                ran.stdout, ran.stderr)
            refused = vms.run(login, f"{AS_TESTER} sbatch --malleable=1 --hold --wrap true",
                              check=False)
            assert refused.returncode != 0 and "malleable" in refused.stderr, (
                refused.stdout, refused.stderr)
            NOTES.append(f"(l1) sbatch --malleable on {login} without the package: "
                         f"{refused.stderr.strip().splitlines()[0]}")
            held = int(vms.out(login, f"{AS_TESTER} sbatch --parsable --hold -w {NODE} "
                                      "--comment=malleable:min=1,max=2 --wrap true")
                       .strip().split(";")[0])
            comment = admin_comment(vms, login, held)
            vms.run(login, f"scancel {held}")
            assert comment.startswith("malleable:min=1,max=2"), comment

        with Stage(f"(l2) guide steps install-package, configure on {login} (its login role)"):
            out = vms.out(login, f"cd {DIST} && {GUIDE_ENV} {GUIDE} run install-package "
                                 "configure 2>&1", timeout=600)
            changes = changed_files(before, slurm_files(vms, login))
            NOTES.append(f"(l2) {login}'s Slurm files changed by its install: "
                         + ", ".join(f"{p} {c}" for p, c in sorted(changes.items())))
            assert all(c in CONFIGURE_DROP_INS.get(p, ()) for p, c in changes.items()), (
                changes, out[-2000:])

        with Stage(f"(l3) sbatch --malleable=1:2 by a user on {login}: malleable, grown on {NODE}"):
            a = int(vms.out(login, (
                f"{AS_TESTER} sbatch --parsable -N1 -c1 -w {NODE} -D /tmp -o /tmp/vmtest-l.out "
                f"--malleable=1:2 --wrap 'exec python3 {RANK} {stop} 2'")).strip().split(";")[0])
            comment = admin_comment(vms, login, a)
            assert comment.startswith("malleable:min=1,max=2"), comment
            wait_for(lambda: node.job_cpus(a) == {0, 1}, timeout=300, interval=2,
                     what=f"job {a}, submitted on {login}, grown to both of {NODE}'s CPUs",
                     show=lambda: diagnostics(vms, a))
            wait_for(lambda: (r := node.record(a)) and r["intra_active"] == 2, timeout=120,
                     interval=2, what=f"job {a}'s rank at 2 threads",
                     show=lambda: diagnostics(vms, a))
            assert not node.overlaps(), node.overlaps()
            NOTES.append(f"(l3) job {a} from {login}: AdminComment {comment}; {NODE}'s cpuset "
                         f"{sorted(node.job_cpus(a) or ())}, its rank at 2 threads")
            vms.run(NODE, f"touch {stop}")
            wait_for(lambda: node.state(a) == "COMPLETED", timeout=120, interval=2,
                     what=f"job {a} completed")

    finally:
        vms.run(NODE, f"touch {stop}; scancel {a or ''}", check=False)
