"""``malleable-srun``: run a TensorFlow or PyTorch program under srun with what malleability
needs.

    malleable-srun [--no-auto-init] [--local N] [srun options] PROGRAM [ARGS...]

Inside an allocation (sbatch, salloc) it runs ``srun --cpu-bind=none`` (the cgroup, which the
co-scheduler resizes, stays in charge of CPUs; a launch binding would not widen when the cgroup
grows) with every other srun option passed through, and the site's MpiDefault. Two exceptions:
``--cpu-bind=none`` is left out when the options name a binding of their own (then the
processes the runtime does not pin, such as DataLoader workers, stay on the cores they started
on); ``--mpi=pmix`` is added for a Python script that names Horovod (``import horovod``,
``malleable_tf.horovod``: its ranks meet through Open MPI, which needs PMIx under srun) where
this Slurm has the PMIx plugin (``srun --mpi=list``; Debian's 26.05 has none) and neither the
options nor SLURM_MPI_TYPE name a plugin. A Horovod program that is not such a script takes
``--mpi=pmix`` from the user, as under plain srun. It sets for each rank:

- MALLEABLE_TF_MAX_THREADS=node: each rank's pool is as large as its node's cores (the agent
  never gives a job more than its max= bound, so the extra threads stay parked);
- MALLEABLE_TF_STATUS / MALLEABLE_TF_TARGET: the rank's status record and its node's target,
  where ``malleable_protocol.RunLayout`` puts them under $MALLEABLE_RUN_DIR (/run/malleable);
- MALLEABLE_TF_ALLOWANCE=cgroup.

When PROGRAM is a Python interpreter (``python``, ``python3``, ``python3.11``, any folder)
running a script, with or without interpreter options (``python -u train.py``), each rank runs
it through ``python -m malleable_tf.run``, which calls ``malleable_tf.init()`` before the script
starts: an unchanged TensorFlow script is malleable (one that calls ``malleable_tf.init()`` or
``malleable_tf.horovod.init()`` itself works too). A script whose first framework import is
PyTorch's (torch, lightning) runs through ``python -m malleable_torch.run`` instead (its source is
parsed, not run; MALLEABLE_FRAMEWORK=torch or tensorflow says it outright). ``python -m
MODULE``, ``python -c CODE`` and any other program run as they are. ``--no-auto-init`` (or MALLEABLE_TF_AUTO_INIT=0) turns this
off; the interpreter must be able to import malleable_tf.

Where the srun options end: getopt's rule, as srun itself follows it. The first argument that
does not start with '-' is PROGRAM, unless it is the value of the option before it: the short
options that take a value (``-n 4``, ``-N 2``, ``-c 2``, ``-w node``, ``-o file``, ``-J name``,
``-t time``, ``-p part``, and the others srun has: A b B C d D e F G i L m M q r S T W x) take
the next argument unless it is attached (``-n4``); a long option takes the next argument if
srun's manual gives it a required value (``--ntasks 4``, ``--nodelist n1``; not
``--ntasks=4``, nor an optional value as in ``--exclusive``); ``--`` ends the options. An
unknown option counts as taking no value. With ``--local N``, PROGRAM comes right after N.

It asks slurmctld nothing. The job's folder for status records is made by the Prolog for the
job's user; without it (no co-scheduler on the cluster) the ranks still follow their cpusets and
run without status records. Outside an allocation it says so, or with ``--local N`` runs N
ranks here under mpirun.
"""
from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from malleable_protocol import RunLayout
from malleable_protocol.layout import DEFAULT_RUN_DIR

from .runner import read_head, source_facts


class LaunchError(RuntimeError):
    pass


# srun's options (Slurm 22.05, srun(1)) that take a value. Short ones: getopt letters with a
# required argument; long ones: "--name=<value>" in the manual. The optional-valued ones
# (-I, -K, --exclusive[=], --bcast[=], ...) only take a value attached with '=' or in the
# same word, like the flags they otherwise are.
SRUN_SHORT_WITH_VALUE = frozenset("AbBCcdDeFGiJLmMNnopqrSTtWwx")
SRUN_LONG_WITH_VALUE = frozenset("""
    accel-bind account acctg-freq bb bbf bcast-exclude begin chdir cluster-constraint clusters
    comment constraint container core-spec cores-per-socket cpu-bind cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution epilog error exclude export
    extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres
    gres-flags het-group hint input job-name jobid licenses mail-type mail-user mcs-label mem
    mem-bind mem-per-cpu mem-per-gpu mincpus mpi msg-timeout network nodefile nodelist nodes
    ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output
    partition power prefer priority profile prolog qos relative reservation signal slurmd-debug
    sockets-per-node switches task-epilog task-prolog thread-spec threads threads-per-core time
    time-min tmp uid wait wckey""".split())
SRUN_LONG_WITHOUT_VALUE = frozenset("""
    bcast compress exclusive immediate kill-on-bad-exit nice no-kill propagate resv-ports
    send-libs x11 contiguous disable-status exact help hold label multi-prog no-allocate
    overcommit overlap oversubscribe preserve-env pty quiet quit-on-interrupt reboot spread-job
    test-only unbuffered usage use-min-nodes verbose version""".split())

# Python's own short options before the script: flags, and those that take a value
# (python -W error, -X dev). Any other (-c, -m, -h, -V, --help, ...) means no script is run.
PYTHON_FLAGS = frozenset("bBdEiIOPqsSuvx")
PYTHON_WITH_VALUE = frozenset("WX")
RUNNER = ["-m", "malleable_tf.run"]


class Framework(enum.Enum):
    """Whose runner a Python script runs through (MALLEABLE_FRAMEWORK, else its imports)."""

    TENSORFLOW = "tensorflow"
    TORCH = "torch"


RUNNERS = {Framework.TENSORFLOW: RUNNER, Framework.TORCH: ["-m", "malleable_torch.run"]}
# The top-level modules that say which framework a script trains with.
FRAMEWORK_MODULES = {"tensorflow": Framework.TENSORFLOW, "keras": Framework.TENSORFLOW,
                     "horovod": Framework.TENSORFLOW, "torch": Framework.TORCH,
                     "lightning": Framework.TORCH, "pytorch_lightning": Framework.TORCH}
def framework_of(script: str, environ: Mapping[str, str],
                 read: Callable[[str], bytes] = read_head) -> Framework:
    """MALLEABLE_FRAMEWORK when set; else the first framework the script imports (its source
    parsed, not run); TensorFlow's when it names none or cannot be read (the default before
    PyTorch's runner existed). A bad MALLEABLE_FRAMEWORK raises LaunchError."""
    given = environ.get("MALLEABLE_FRAMEWORK", "").strip().lower()
    if given:
        try:
            return Framework(given)
        except ValueError:
            raise LaunchError(f"MALLEABLE_FRAMEWORK must be tensorflow or torch, "
                              f"not {given!r:.32}") from None
    facts = source_facts(script, read)
    found = [FRAMEWORK_MODULES[m] for m in (facts.imports if facts else ())
             if m in FRAMEWORK_MODULES]
    return found[0] if found else Framework.TENSORFLOW


def _long_takes_value(name: str) -> bool:
    """Whether srun's ``--name`` (no '=') takes the next argument; getopt_long also takes an
    unambiguous prefix of a name."""
    if name in SRUN_LONG_WITH_VALUE or name in SRUN_LONG_WITHOUT_VALUE:
        return name in SRUN_LONG_WITH_VALUE
    known = [n for n in SRUN_LONG_WITH_VALUE | SRUN_LONG_WITHOUT_VALUE if n.startswith(name)]
    return bool(known) and all(n in SRUN_LONG_WITH_VALUE for n in known)


def split_srun_options(args: list[str]) -> tuple[list[str], list[str]]:
    """``args`` as (srun's options, PROGRAM and its arguments); see the module's docstring."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[:i + 1], args[i + 1:]
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            if "=" not in arg and _long_takes_value(arg[2:]):
                i += 1
        else:
            # A cluster of short options: the first that takes a value takes the rest of the
            # word, or the next argument when it ends the word.
            for k, letter in enumerate(arg[1:], start=1):
                if letter in SRUN_SHORT_WITH_VALUE:
                    if k == len(arg) - 1:
                        i += 1
                    break
        i += 1
    return args[:i], args[i:]


def is_python(program: str) -> bool:
    return re.fullmatch(r"python(\d+(\.\d+)?)?", os.path.basename(program)) is not None


def script_position(command: list[str]) -> tuple[int, int] | None:
    """In ``python [options] SCRIPT ARGS``: where a runner's arguments go and where SCRIPT is
    (after a ``--``, the runner goes before it); None for any other command (``python -m``,
    ``python -c``, the interactive interpreter, standard input, not Python)."""
    if not command or not is_python(command[0]):
        return None
    i = 1
    while i < len(command):
        arg = command[i]
        if arg == "--":   # python -- SCRIPT: the runner takes "-- SCRIPT" the same way
            return (i, i + 1) if command[i + 1:] and command[i + 1] != "-" else None
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):   # --help, --version, --check-hash-based-pycs MODE: not a run
            return None
        for k, letter in enumerate(arg[1:], start=1):
            if letter not in PYTHON_FLAGS and letter not in PYTHON_WITH_VALUE:
                return None  # -c, -m, -h, -V, or an option this does not know
            if letter in PYTHON_WITH_VALUE:
                if k == len(arg) - 1:
                    i += 1
                break
        i += 1
    if i >= len(command) or command[i].startswith("-"):
        return None
    return i, i


def with_runner(command: list[str], environ: Mapping[str, str] | None = None,
                read: Callable[[str], bytes] = read_head) -> list[str]:
    """``python [options] SCRIPT ARGS`` -> ``python [options] -m malleable_tf.run SCRIPT ARGS``
    (``malleable_torch.run`` for a PyTorch script: ``framework_of``); any other command
    (``python -m``, ``python -c``, not Python) unchanged."""
    at = script_position(command)
    if at is None:
        return command
    runner = RUNNERS[framework_of(command[at[1]], os.environ if environ is None else environ,
                                  read)]
    return [*command[:at[0]], *runner, *command[at[0]:]]


def uses_horovod(command: list[str], read: Callable[[str], bytes] = read_head) -> bool:
    """Whether the command runs a Python script that names Horovod (``import horovod...``,
    ``malleable_tf.horovod``): its source parsed, not run."""
    at = script_position(command)
    facts = source_facts(command[at[1]], read) if at is not None else None
    return facts is not None and ("horovod" in facts.imports or "horovod" in facts.names)


def auto_init_wanted(environ: dict[str, str]) -> bool:
    return environ.get("MALLEABLE_TF_AUTO_INIT", "1").strip().lower() not in (
        "0", "no", "false", "off")


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]
    status_dir: Path | None     # where the rank records go (None: no co-scheduler folder)


def has_pmix(srun: str) -> bool:
    """Whether this Slurm's srun has the PMIx plugin (``srun --mpi=list``: on stdout from 24.11,
    on stderr before)."""
    try:
        done = subprocess.run([srun, "--mpi=list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(word.strip(":,") == "pmix" for word in (done.stdout + done.stderr).split())


def plan_launch(args: list[str], environ: dict[str, str], *, which=shutil.which,
                is_dir=os.path.isdir, pmix=has_pmix,
                read: Callable[[str], bytes] = read_head) -> LaunchPlan:
    layout = RunLayout(Path(environ.get("MALLEABLE_RUN_DIR", str(DEFAULT_RUN_DIR))))
    auto_init, local_ranks = auto_init_wanted(environ), None
    # malleable-srun's own options come first, in any order.
    while args[:1] in (["--no-auto-init"], ["--local"]):
        if args[0] == "--no-auto-init":
            auto_init, args = False, args[1:]
            continue
        if local_ranks is not None or len(args) < 2 or not args[1].isdigit() or int(args[1]) < 1:
            raise LaunchError("usage: malleable-srun --local N PROGRAM [ARGS...]")
        local_ranks, args = args[1], args[2:]
    wrap = with_runner if auto_init else (lambda command: command)
    if local_ranks is not None:
        if not args:
            raise LaunchError("usage: malleable-srun --local N PROGRAM [ARGS...]")
        mpirun = which("mpirun")
        if mpirun is None:
            raise LaunchError("mpirun not found on PATH (apt-get install openmpi-bin)")
        # No agent here: the records go to a private folder of this user's.
        local = Path(tempfile.mkdtemp(prefix="malleable-local-"))
        env = {"MALLEABLE_TF_STATUS": str(local / RunLayout.status_name("{rank}")),
               "MALLEABLE_TF_ALLOWANCE": "auto"}
        argv = [mpirun, "-np", local_ranks, "--bind-to", "none", "--oversubscribe"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        return LaunchPlan(argv + wrap(args), env, local)
    job = environ.get("SLURM_JOB_ID")
    if not job:
        raise LaunchError("not inside a Slurm allocation (no SLURM_JOB_ID): run it from an "
                          "sbatch script or salloc, or try it here with --local N")
    if not job.isdigit() or not 0 < int(job) < 2**32:
        raise LaunchError(f"SLURM_JOB_ID={job!r} is not a job id")
    srun = which("srun")
    if srun is None:
        raise LaunchError("srun not found on PATH")
    options, command = split_srun_options(args)
    # A binding the user asks for is kept; else none, so that the tasks' processes may run on
    # every core the co-scheduler grows the cgroup to (a launch binding does not widen).
    own_binding = any(a.startswith(("--cpu-bind", "--cpu_bind")) for a in options)
    if not command:
        raise LaunchError("no program to run after the srun options")
    plain_command = command
    if "--multi-prog" not in options:   # else PROGRAM is srun's configuration file
        command = wrap(command)
    env = layout.rank_env(int(job))
    status_dir = layout.job_dir(int(job))
    if not is_dir(status_dir):
        del env["MALLEABLE_TF_STATUS"]
        status_dir = None
    # The site's MpiDefault is in charge, but of a Horovod script (its ranks meet through Open
    # MPI, which needs PMIx under srun) where this Slurm has PMIx and neither the options nor
    # SLURM_MPI_TYPE (srun's own variable) name a plugin.
    own_mpi = any(a == "--mpi" or a.startswith("--mpi=") for a in options) or \
        bool(environ.get("SLURM_MPI_TYPE"))
    mpi = ["--mpi=pmix"] if not own_mpi and uses_horovod(plain_command, read) and \
        pmix(srun) else []
    binding = [] if own_binding else ["--cpu-bind=none"]
    return LaunchPlan([srun, *mpi, *binding, *options, *command], env, status_dir)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        plan = plan_launch(args, dict(os.environ))
    except LaunchError as exc:
        print(f"malleable-srun: {exc}", file=sys.stderr)
        return 2
    if plan.status_dir is None:
        print("malleable-srun: no co-scheduler folder for this job (no Prolog installed?): the "
              "ranks follow their cpusets but write no status records", file=sys.stderr)
    os.execve(plan.argv[0], plan.argv, {**os.environ, **plan.env})
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
