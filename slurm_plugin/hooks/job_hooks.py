"""The Slurm hooks of a node: the Prolog, the Epilog and the SPANK plugin's step start, run
as root by slurmd and slurmstepd as ``python -I -m slurm_plugin.hooks``.

The Prolog runs as root before a job's tasks start on the node. It asks slurmctld nothing: it
makes the job's status folder for the job's user, marks the job as starting and runs one
reconcile cycle, in which every core lent out of an allocation comes back (the new job's cores
are not known on the node yet). It then checks the real cgroup tree. It fails closed: if a
core could still be held outside its job's allocation, it exits 1 and Slurm drains the node and
requeues the job (held) rather than start it on a core another job holds.

The Epilog marks the job ended in the node's ledger, wakes the agent to lend the freed cores,
then removes the job's target and status folder (bounded: what is left waits for the next
Epilog); a removal that fails is reported, and the job stays ended.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from malleable_protocol import check_job_id
from malleable_protocol.runner import CommandError

from slurm_plugin.cgroups import process_cpuset, remove_cgroup_tree
from slurm_plugin.logs import add_log_level_option, setup_logging
from slurm_plugin.node.accounting import close_job, hand_to_watcher
from slurm_plugin.node.cgroup_actuator import walk_job
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.hooks.job_folder import REMOVE_BUDGET, make_job_folder, remove_job_folder, sweep_leftovers
from slurm_plugin.node.jobfs import detach_job_fs, mount_job_fs, unmount_job_fs
from slurm_plugin.node.ledger import LedgerFile
from slurm_plugin.node.wiring import load_config, make_reconciler, node_layout
from slurm_plugin.node.procs import agent_pid, is_agent, lock_holder, process_uid, signal_verified
from slurm_plugin.node.reconciler import CycleResult, Reconciler, node_lock
from slurm_plugin.node.safety import check_step_start, judge, lent_cores, note, report_verdict, start_step

# How long the Prolog looks again at job folders named by a SLUID that no slurmstepd tells yet
# (cgroups.JobFolderNames): a starting job's slurmstepd joins its folder within milliseconds.
UNIDENTIFIED_WAIT_S = 2.0


def _job_env() -> tuple[int, int, int]:
    env = os.environ
    try:
        return (check_job_id(int(env["SLURM_JOB_ID"])), int(env["SLURM_JOB_UID"]),
                int(env.get("SLURM_JOB_GID", env["SLURM_JOB_UID"])))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"not run by slurmd as a Prolog/Epilog (bad job environment: {exc})")


def _hook_cycle(config: AgentConfig, rec: Reconciler, what: str, **marks) -> CycleResult:
    """One reconcile cycle for a hook, with its marks (``Reconciler.cycle``). A cycle holds the
    lock for milliseconds: an agent that held it longer is hung. Only a verified agent is
    killed (its service restarts it): checked and killed through one pidfd, it must be a root
    agent holding the node's lock; anyone else holding it: the cycle fails (fail closed)."""
    result = rec.cycle(lock_timeout_s=config.prolog_lock_timeout_s, **marks)
    if result.lock_busy:
        hung = agent_pid(config.pid_file)

        def hung_agent(pid: int) -> bool:
            return is_agent(pid) and lock_holder(config.lock_file) == pid

        if hung is not None and signal_verified(hung, signal.SIGKILL, hung_agent):
            note(config, f"{what}: killed the hung agent (pid {hung}) that held the node's lock")
            result = rec.cycle(lock_timeout_s=config.prolog_lock_timeout_s, **marks)
    return result


def prolog(config: AgentConfig) -> int:
    t0 = time.monotonic()
    job_id, uid, gid = _job_env()
    _prepare_job_folder(config, job_id, uid, gid)
    rec = make_reconciler(config)
    result = _hook_cycle(config, rec, f"prolog job {job_id}", starting_job=job_id)
    # A job folder named by a SLUID whose slurmstepd has not joined it yet (a job starting at
    # this moment, maybe this one's extern step) is told within milliseconds: looked at again.
    deadline = time.monotonic() + UNIDENTIFIED_WAIT_S
    while rec.observer.actuator.unidentified and time.monotonic() < deadline:
        time.sleep(0.05)
        result = _hook_cycle(config, rec, f"prolog job {job_id}", starting_job=job_id)
    # A job whose folder is not where the layout says: its cores cannot be verified free.
    unverified = list(result.snapshot.problems) if result.snapshot is not None else []
    problems = lent_cores(config, rec.observer.actuator) + unverified
    return report_verdict(config, f"prolog job {job_id}", judge(result, problems, t0))


def _prepare_job_folder(config: AgentConfig, job_id: int, uid: int, gid: int) -> None:
    """The job's records folder, on a fresh tmpfs of its own whose root is the job user's. The
    folder below stays root's (0700): if the tmpfs cannot be mounted the user cannot write
    there, so his records can never fill the node's /run, and the job runs rigid. A requeued
    job's folder may hold what its user mounted on it: detached first. Whatever fails here
    fails only the job's malleability (no records, no lending: reported in the hooks log and
    slurmd's), never the Prolog: the folder is not what keeps jobs' cores apart."""
    folder = config.layout.job_dir(job_id)
    try:
        detach_job_fs(folder)
        make_job_folder(config.layout, job_id, 0, 0)
        mount_job_fs(folder, uid, gid)
    except (OSError, CommandError) as exc:
        why = (f"prolog job {job_id}: no records folder of its own, the job runs on its "
               f"allocation and is not lent cores: {exc}")
        note(config, why)
        print(f"malleable: {why}", file=sys.stderr)


def step_start(config: AgentConfig, job_id: int, step: str, stepd_pid: int) -> int:
    """Run by the SPANK plugin in a new step's slurmstepd (root) when the node's agent did not
    answer on its socket (``safety.start_step``). Exit 1 (the step does not start) if it
    cannot."""
    fence = check_step_start(job_id, step, stepd_pid)     # before anything is read or made
    rec = make_reconciler(config)
    what = f"job {job_id} {step} start"
    verdict = start_step(config, rec, job_id, fence,
                         cycle=lambda **marks: _hook_cycle(config, rec, what, **marks))
    return report_verdict(config, what, verdict)


def _remove_job_files(config: AgentConfig, job_id: int, uid: int) -> list[str]:
    """The job's target and status folder removed, within the Epilog's budget; leftovers of
    earlier Epilogs go on being removed with what is left of it. Never raises: what could not
    be done is returned."""
    problems = []
    try:
        os.unlink(config.layout.target_file(job_id, config.node))
    except FileNotFoundError:
        pass
    except OSError as exc:
        problems.append(f"target: {exc}")
    spent = 0
    try:
        unmount_job_fs(config.layout.job_dir(job_id))
    except (OSError, CommandError) as exc:
        problems.append(f"status folder's tmpfs: {exc}")
    try:
        removal = remove_job_folder(config.layout, job_id, uid, budget=REMOVE_BUDGET)
        spent = removal.work
        if not removal.complete:
            problems.append(f"status folder {removal.summary()}")
    except Exception as exc:  # noqa: BLE001 - the job is marked ended whatever happened here
        problems.append(f"status folder: {type(exc).__name__}: {exc}")
    problems += _remove_users_cgroups(config, job_id, uid)
    if spent < REMOVE_BUDGET:
        try:
            leftovers = sweep_leftovers(config.layout, budget=REMOVE_BUDGET - spent)
            if leftovers.problems:
                problems.append(f"earlier jobs' leftovers: {'; '.join(leftovers.problems)}")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"earlier jobs' leftovers: {type(exc).__name__}: {exc}")
    return problems


def _remove_users_cgroups(config: AgentConfig, job_id: int, uid: int) -> list[str]:
    """The job's cgroup folder, when its user made folders in it (v1 gives him the step
    folders): Slurm cannot remove it then, and it would look like a job. Slurm kills what its
    step folders list, not what runs in a folder below them: a process its user moved there
    ran on past the job, on its cores. Such processes are killed (each checked through a
    pidfd to be the job user's and in this job's folder), then the folders removed bottom-up
    without recursion. Slurm's own clean-up is left alone otherwise."""
    try:
        layout = node_layout(config)
        top = layout.job_dir(uid, job_id)
        if not top.is_dir() or not walk_job(layout, str(top))[1]:
            return []
        inside = layout.job_of
        report = remove_cgroup_tree(top, timeout_s=5.0, kill=lambda pid: signal_verified(
            pid, signal.SIGKILL, lambda p: process_uid(p) == uid
            and inside(process_cpuset(p) or "") == job_id))
        killed = [f"killed {len(report.killed_pids)} process(es) its user left in its "
                  f"cgroup folders"] if report.killed_pids else []
        return killed + [f"cgroup {f}: {e}" for f, e in report.failed[:4]]
    except Exception as exc:  # noqa: BLE001 - reported; the job stays ended
        return [f"cgroup folders: {type(exc).__name__}: {exc}"]


def epilog(config: AgentConfig) -> int:
    """The job marked ended first (its cores free now, whatever its folder holds), the agent
    woken, then the job's files removed (bounded)."""
    job_id, uid, _ = _job_env()
    try:
        with node_lock(config.lock_file, config.prolog_lock_timeout_s):
            ledger_file = LedgerFile(config.state_dir, config.node)
            ledger = ledger_file.load()
            ledger.starting.pop(job_id, None)
            ledger.ended[job_id] = time.time()
            usage = close_job(ledger, job_id, config.node, ledger.ended[job_id],
                              config.event_log)
            ledger_file.save(ledger)
        pid = agent_pid(config.pid_file)
        if pid is not None:
            signal_verified(pid, signal.SIGUSR1, is_agent)   # lend the freed cores now
        problem = None if usage is None else hand_to_watcher(config.feed_dir, job_id, usage)
        if problem is not None:
            note(config, f"epilog {problem}")
    finally:
        for problem in _remove_job_files(config, job_id, uid):
            note(config, f"epilog job {job_id}: {problem}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Exit 1 from the Prolog on any failure (fail closed: Slurm drains the node and requeues
    the job held); the Epilog reports and exits 0 (a failing Epilog drains the node, and the
    next cycle repairs what it left)."""
    ap = argparse.ArgumentParser(prog="malleable-hook")
    ap.add_argument("which", choices=["prolog", "epilog", "step-start"])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--job", type=int, help="step-start: the job id")
    ap.add_argument("--step", help="step-start: the step's cgroup folder (step_0, step_batch)")
    ap.add_argument("--stepd-pid", type=int, help="step-start: the step's slurmstepd")
    add_log_level_option(ap, default="WARNING")
    args = ap.parse_args(argv)
    setup_logging(args.which, args.log_level)   # the reconciler's own records, to stderr
    config = None
    try:
        config = load_config(args.config)
        if args.which == "prolog":
            return prolog(config)
        if args.which == "step-start":
            if args.job is None or args.step is None or args.stepd_pid is None:
                raise ValueError("step-start needs --job, --step and --stepd-pid")
            return step_start(config, args.job, args.step, args.stepd_pid)
        return epilog(config)
    except Exception as exc:  # noqa: BLE001 - reported; the Prolog and step start fail closed
        print(f"malleable {args.which} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        if config is not None:
            note(config, f"{args.which} failed: {exc!r}")
        return 0 if args.which == "epilog" else 1


if __name__ == "__main__":
    sys.exit(main())
