"""The Slurm hooks of a node (Prolog, Epilog, the SPANK plugin's step start), the agent's
factory, and the hooks' installer.

The Prolog runs as root before a job's tasks start on the node. It asks slurmctld nothing: it
makes the job's status folder for the job's user, marks the job as starting and runs one
reconcile cycle, in which every core lent out of an allocation comes back (the new job's cores
are not known on the node yet). It then checks the real cgroup tree. It fails closed: if a
core could still be held outside its job's allocation, it exits 1 and Slurm drains the node and
requeues the job (held) rather than start it on a core another job holds.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import string
import sys
import time
from importlib import resources
from pathlib import Path

from malleable_protocol import RunLayout, check_job_id
from malleable_protocol.safe_io import ensure_private_dir, open_dir

from .. import spank
from ..cgroups import SlurmCgroupLayout, discover_layout
from ..feed.store import FeedStore
from .cgroup_actuator import CpusetActuator, fault_hook
from .config import AgentConfig
from .executor import PlanExecutor
from malleable_protocol.layout import check_step_name

from .ledger import Fence, LedgerFile
from .observe import NodeObserver
from .reconciler import CycleResult, Reconciler, node_lock
from .request import MAX_VALUE


def _template(name: str) -> string.Template:
    return string.Template(resources.files("slurm_plugin").joinpath("templates", name).read_text())


def install(dest: Path, config: AgentConfig, *, python: str = sys.executable) -> dict[str, Path]:
    """Render job_submit.lua, the node Prolog and Epilog, the controller's event hook
    (PrologSlurmctld and EpilogSlurmctld), agent.json and plugstack.conf into ``dest``, and
    build the SPANK plugin (malleable_spank.so) there."""
    dest.mkdir(parents=True, exist_ok=True)
    names = ("job_submit.lua", "prolog.sh", "epilog.sh", "ctld_event.sh", "agent.json",
             "plugstack.conf")
    paths = {name: dest / name for name in names}
    paths[spank.LIBRARY] = spank.build(dest)
    paths["plugstack.conf"].write_text(spank.plugstack_line(
        paths[spank.LIBRARY], python=python, config=paths["agent.json"]))
    events = FeedStore(config.feed_dir).events_file
    paths["agent.json"].write_text(config.to_json())
    paths["job_submit.lua"].write_text(_template("job_submit.lua.tmpl").substitute(
        max_value=config.max_cpus or MAX_VALUE, events_file=events))
    paths["ctld_event.sh"].write_text(_template("ctld_event.sh.tmpl").substitute(
        events_file=events))
    for hook in ("prolog.sh", "epilog.sh"):
        paths[hook].write_text(_template(f"{hook}.tmpl").substitute(
            python=python, config=paths["agent.json"]))
    for hook in ("prolog.sh", "epilog.sh", "ctld_event.sh"):
        paths[hook].chmod(0o755)
    return paths


def prepare_node_folders(config: AgentConfig) -> None:
    """The protocol's folders on a node: root's, readable by all, writable by root only."""
    for folder in (config.run_dir, config.layout.jobs_dir, config.layout.targets_dir):
        ensure_private_dir(folder)
        folder.chmod(0o755)
    ensure_private_dir(config.state_dir)


def load_config(path: Path) -> AgentConfig:
    node = os.environ.get("SLURMD_NODENAME")
    overrides = {"node": node} if node else {}
    return AgentConfig.from_json(path.read_text(), **overrides)


def node_layout(config: AgentConfig) -> SlurmCgroupLayout:
    """The node's Slurm cgroup layout, discovered (``LayoutUnknown`` when it cannot be)."""
    return discover_layout(config.node, slurm_conf=config.slurm_conf, mount=config.cgroup_mount)


def make_actuator(config: AgentConfig, layout: SlurmCgroupLayout | None = None) -> CpusetActuator:
    return CpusetActuator(layout or node_layout(config),
                          before_write=fault_hook(os.environ.get("MALLEABLE_FAULT")))


def make_reconciler(config: AgentConfig, layout: SlurmCgroupLayout | None = None) -> Reconciler:
    """The node's reconciler; ``layout`` None: discovered from the node."""
    actuator = make_actuator(config, layout)
    store = FeedStore(config.feed_dir)
    observer = NodeObserver(config.node, config.layout, store, actuator,
                            max_cpus=config.max_cpus)
    executor = PlanExecutor(config.node, config.layout, actuator,
                            shrink_wait_s=config.shrink_wait_s)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    return Reconciler(config, observer, executor, LedgerFile(config.state_dir, config.node),
                      store)


def lent_cores(config: AgentConfig, actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: jobs holding cores outside their allocation (as the
    ledger knows it), and cores held by two jobs. Empty when the node is safe to start on."""
    found = (actuator or make_actuator(config)).scan()
    ledger = LedgerFile(config.state_dir, config.node).load()
    problems, owner = [], {}
    for job_id, cg in sorted(found.items()):
        alloc = ledger.allocations.get(job_id)
        if alloc is not None and not cg.cpus <= alloc.cpus:
            problems.append(f"job {job_id} holds {sorted(cg.cpus - alloc.cpus)} outside its "
                            "allocation")
        for c in cg.cpus:
            if c in owner:
                problems.append(f"core {c} in jobs {owner[c]} and {job_id}")
            owner[c] = job_id
    return problems


def make_job_folder(layout: RunLayout, job_id: int, uid: int, gid: int) -> Path:
    """The folder where the job's ranks write their records, owned by the job's user, in a
    folder only root writes (nobody can make it ahead of the job)."""
    jobs = ensure_private_dir(layout.jobs_dir)
    name = layout.job_dir(job_id).name
    jfd = open_dir(jobs)
    try:
        try:
            os.mkdir(name, 0o755, dir_fd=jfd)
        except FileExistsError:
            pass     # a requeued job: the folder is checked and re-owned below
        dfd = open_dir(name, dir_fd=jfd)
        try:
            os.fchown(dfd, uid, gid)
            os.fchmod(dfd, 0o755)
        finally:
            os.close(dfd)
    finally:
        os.close(jfd)
    return jobs / name


def _note(config: AgentConfig, text: str) -> None:
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
        with open(config.state_dir / f"hooks-{config.node}.log", "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
    except OSError:
        pass


def _job_env() -> tuple[int, int, int]:
    env = os.environ
    try:
        return (check_job_id(int(env["SLURM_JOB_ID"])), int(env["SLURM_JOB_UID"]),
                int(env.get("SLURM_JOB_GID", env["SLURM_JOB_UID"])))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"not run by slurmd as a Prolog/Epilog (bad job environment: {exc})")


def lock_holder(lock_file: Path) -> int | None:
    """The pid holding an flock on ``lock_file``, from /proc/locks."""
    try:
        inode = os.stat(lock_file).st_ino
        with open("/proc/locks") as f:
            for line in f.read(1 << 20).splitlines():
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF"
                if len(parts) >= 6 and parts[1] == "FLOCK" and \
                        parts[5].rsplit(":", 1)[-1] == str(inode):
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


def _hook_cycle(config: AgentConfig, rec: Reconciler, what: str, **marks) -> CycleResult:
    """One reconcile cycle for a hook, with its marks (``Reconciler.cycle``). A cycle holds the
    lock for milliseconds: an agent that held it longer is hung. Only a verified agent is
    killed (its service restarts it); anyone else holding it: the cycle fails (fail closed)."""
    result = rec.cycle(lock_timeout_s=config.prolog_lock_timeout_s, **marks)
    if result.lock_busy:
        hung = agent_pid(config)
        if hung is not None and lock_holder(config.lock_file) == hung:
            os.kill(hung, signal.SIGKILL)
            _note(config, f"{what}: killed the hung agent (pid {hung}) that held the node's lock")
            result = rec.cycle(lock_timeout_s=config.prolog_lock_timeout_s, **marks)
    return result


def _verdict(config: AgentConfig, what: str, t0: float, result: CycleResult,
             problems: list[str]) -> int:
    """A hook's exit code: 1 (fail closed) with every problem in the hooks log and on stderr
    (slurmd's log), else 0 with the time it took."""
    ms = (time.monotonic() - t0) * 1000
    problems = result.failures + problems
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
    make_job_folder(config.layout, job_id, uid, gid)
    rec = make_reconciler(config)
    result = _hook_cycle(config, rec, f"prolog job {job_id}", starting_job=job_id)
    # A job whose folder is not where the layout says: its cores cannot be verified free.
    unverified = list(result.snapshot.problems) if result.snapshot is not None else []
    return _verdict(config, f"prolog job {job_id}", t0, result,
                    lent_cores(config, rec.observer.actuator) + unverified)


def outside_allocation(config: AgentConfig, job_id: int,
                       actuator: CpusetActuator | None = None) -> list[str]:
    """Read from the real cgroup tree: what of ``job_id``'s folders lies outside its allocation
    (as the ledger knows it). Empty when slurmstepd can write the allocation to the job folder."""
    cg = (actuator or make_actuator(config)).scan().get(job_id)
    alloc = LedgerFile(config.state_dir, config.node).load().allocations.get(job_id)
    if cg is None:
        return []          # no folder yet (the batch step): slurmstepd makes it
    if alloc is None:
        return [f"job {job_id}: allocation unknown on this node"]
    return [f"job {job_id} {rel or 'folder'} holds {sorted(cpus - alloc.cpus)} outside its "
            "allocation" for rel, cpus in [("", cg.cpus), *cg.folders.items()]
            if not cpus <= alloc.cpus]


def step_start(config: AgentConfig, job_id: int, step: str, stepd_pid: int) -> int:
    """Run by the SPANK plugin in a new step's slurmstepd (root), before slurmstepd writes the
    job's folder back to Slurm's allocation: bring the job back to exactly that allocation (its
    ranks told first, like any shrink) and fence it there until the step has joined its cpuset;
    the agent then grows it again. Exit 1 (the step does not start) if it cannot."""
    t0 = time.monotonic()
    check_job_id(job_id)
    fence = Fence(step=check_step_name(step), stepd_pid=stepd_pid, since=time.time())
    if stepd_pid <= 1 or os.stat(f"/proc/{stepd_pid}").st_uid != 0:
        raise ValueError(f"pid {stepd_pid} is not a slurmstepd of root")
    what = f"job {job_id} {step} start"
    rec = make_reconciler(config)
    result = _hook_cycle(config, rec, what, fence=(job_id, fence))
    return _verdict(config, what, t0, result,
                    outside_allocation(config, job_id, rec.observer.actuator))


def agent_pid(config: AgentConfig) -> int | None:
    """The node's agent, if the pid file names a live root process running the agent."""
    try:
        pid = int(config.pid_file.read_text()[:16])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(4096).split(b"\0")
        if os.stat(f"/proc/{pid}").st_uid != 0:
            return None
    except (OSError, ValueError):
        return None
    if b"agent" in argv and any(b"slurm_plugin" in a or a.endswith(b"malleable") for a in argv):
        return pid
    return None


def epilog(config: AgentConfig) -> int:
    job_id, _, _ = _job_env()
    layout = config.layout
    try:
        os.unlink(layout.target_file(job_id, config.node))
    except FileNotFoundError:
        pass
    if layout.jobs_dir.is_dir() and not layout.jobs_dir.is_symlink():
        # rmtree works through descriptors on Linux: a link planted inside is removed, never
        # followed (shutil.rmtree.avoids_symlink_attacks).
        shutil.rmtree(layout.job_dir(job_id), ignore_errors=True)
    with node_lock(config.lock_file, config.prolog_lock_timeout_s):
        ledger_file = LedgerFile(config.state_dir, config.node)
        ledger = ledger_file.load()
        ledger.starting.pop(job_id, None)
        ledger.ended[job_id] = time.time()
        ledger_file.save(ledger)
    pid = agent_pid(config)
    if pid is not None:
        os.kill(pid, signal.SIGUSR1)   # lend the freed cores now
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
