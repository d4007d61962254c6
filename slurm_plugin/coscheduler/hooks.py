"""The Slurm hooks of a node: the Prolog, the Epilog and the SPANK plugin's step start, run
as root by slurmd and slurmstepd as ``python -I -m slurm_plugin.coscheduler.hooks``.

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
from malleable_protocol.layout import check_step_name
from malleable_protocol.runner import CommandError
from malleable_protocol.safe_io import append_capped

from ..cgroups import remove_cgroup_tree
from .cgroup_actuator import walk_job
from .config import AgentConfig
from .job_folder import REMOVE_BUDGET, make_job_folder, remove_job_folder, sweep_leftovers
from .jobfs import mount_job_fs, unmount_job_fs
from .ledger import Fence, LedgerFile
from .node import load_config, make_reconciler, node_layout
from .procs import agent_pid, is_agent, lock_holder, process_uid, signal_verified
from .reconciler import MAX_LOG_BYTES, CycleResult, Reconciler, node_lock
from .safety import lent_cores, step_start_problems


def _note(config: AgentConfig, text: str) -> None:
    """A line in the node's hooks log (root's, capped like the agent's event log)."""
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        append_capped(config.state_dir / f"hooks-{config.node}.log",
                      f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n", MAX_LOG_BYTES)
    except OSError:
        pass


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
            _note(config, f"{what}: killed the hung agent (pid {hung}) that held the node's lock")
            result = rec.cycle(lock_timeout_s=config.prolog_lock_timeout_s, **marks)
    return result


def _verdict(config: AgentConfig, what: str, t0: float, result: CycleResult,
             problems: list[str]) -> int:
    """A hook's exit code: 1 (fail closed) when the cycle itself could not run (the lock, the
    ledger) or the real cgroup tree shows ``problems`` (cores the starting job may get that
    another job could hold); else 0. An action that failed (one job's shrink refused, say) is
    reported, not a reason to refuse: the tree check says whether it left anything unsafe.
    Every problem goes to the hooks log and to stderr (slurmd's log)."""
    ms = (time.monotonic() - t0) * 1000
    reported = result.action_failures
    if reported:
        _note(config, f"{what}: reported, not refused: {'; '.join(reported)}")
    problems = result.errors + problems
    if problems:
        msg = f"{what}: NOT SAFE to start ({ms:.0f} ms): {'; '.join(problems)}"
        _note(config, msg)
        print(f"malleable {msg}", file=sys.stderr)
        return 1
    _note(config, f"{what}: {len(result.applied)} resizes in {ms:.0f} ms")
    return 0


def prolog(config: AgentConfig) -> int:
    t0 = time.monotonic()
    job_id, uid, gid = _job_env()
    folder = make_job_folder(config.layout, job_id, uid, gid)
    try:
        mount_job_fs(folder, uid, gid)
    except (OSError, CommandError) as exc:   # the folder works without; reported
        _note(config, f"prolog job {job_id}: no tmpfs of its own for its folder: {exc}")
    rec = make_reconciler(config)
    result = _hook_cycle(config, rec, f"prolog job {job_id}", starting_job=job_id)
    # A job whose folder is not where the layout says: its cores cannot be verified free.
    unverified = list(result.snapshot.problems) if result.snapshot is not None else []
    return _verdict(config, f"prolog job {job_id}", t0, result,
                    lent_cores(config, rec.observer.actuator) + unverified)


def step_start(config: AgentConfig, job_id: int, step: str, stepd_pid: int) -> int:
    """Run by the SPANK plugin in a new step's slurmstepd (root), before slurmstepd writes the
    job's folder back to Slurm's allocation: bring the job back to exactly that allocation (its
    ranks told first, like any shrink) and fence it there until the step has joined its cpuset;
    the agent then grows it again. Exit 1 (the step does not start) if it cannot."""
    t0 = time.monotonic()
    check_job_id(job_id)
    fence = Fence(step=check_step_name(step), stepd_pid=stepd_pid, since=time.time())
    if stepd_pid <= 1 or process_uid(stepd_pid) != 0:
        raise ValueError(f"pid {stepd_pid} is not a slurmstepd of root")
    what = f"job {job_id} {step} start"
    rec = make_reconciler(config)
    result = _hook_cycle(config, rec, what, fence=(job_id, fence))
    return _verdict(config, what, t0, result,
                    step_start_problems(config, job_id, rec.observer.actuator))


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
    folders): Slurm cannot remove it then, and it would look like a job. Removed bottom-up
    without recursion; nothing is killed (Slurm ended the job's processes). Slurm's own
    clean-up is left alone otherwise."""
    try:
        layout = node_layout(config)
        top = layout.job_dir(uid, job_id)
        if not top.is_dir() or not walk_job(layout, str(top))[1]:
            return []
        report = remove_cgroup_tree(top, kill=False)
        return [f"cgroup {f}: {e}" for f, e in report.failed[:4]]
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
            ledger_file.save(ledger)
        pid = agent_pid(config.pid_file)
        if pid is not None:
            signal_verified(pid, signal.SIGUSR1, is_agent)   # lend the freed cores now
    finally:
        for problem in _remove_job_files(config, job_id, uid):
            _note(config, f"epilog job {job_id}: {problem}")
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
    args = ap.parse_args(argv)
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
            _note(config, f"{args.which} failed: {exc!r}")
        return 0 if args.which == "epilog" else 1


if __name__ == "__main__":
    sys.exit(main())
