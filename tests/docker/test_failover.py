"""One active watcher beside a backup slurmctld (issue 41 item 3), on docker-slurm's two
controller hosts (BACKUP=1, the Makefile's default): the primary's host goes away (its container
killed, slurmctld and watcher with it), the backup slurmctld takes control after
SlurmctldTimeout, its watcher takes over (the heartbeat in the shared StateSaveLocation names
it), the nodes' agents' links move to it and a resize reaches the node; then the primary comes
back, takes control again, and the watchers hand back, never both writing."""
from __future__ import annotations

import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from ..integration.helpers import wait_for
from .test_docker_slurm import job_cpus, job_state, node_cpus, submit

STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
ROLE = re.compile(r"this watcher (?:is now|starts) (active|standby)")
PUBLISHED = re.compile(r"watcher: published ")


def stamped(log: Path, what: re.Pattern, since: float = 0.0) -> list[tuple[float, re.Match]]:
    """(time, what ``what`` found) for each line of a watcher's log it finds something in, from
    ``since`` on (the logs are appended to across `make up`s)."""
    text = log.read_text() if log.exists() else ""
    return [(at, m) for line in text.splitlines() if (m := what.search(line))
            and (t := STAMP.match(line))
            and (at := datetime.strptime(t[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()) >= since]


def roles(log: Path, since: float = 0.0) -> list[tuple[float, str]]:
    """(time, role) of each role line of a watcher's log."""
    return [(at, m[1]) for at, m in stamped(log, ROLE, since)]


def publishes(log: Path, since: float = 0.0) -> list[float]:
    """When a watcher wrote the feed (its "published" lines, logged as each write ends)."""
    return [at for at, _ in stamped(log, PUBLISHED, since)]


def active_spans(lines: list[tuple[float, str]], end: float) -> list[tuple[float, float]]:
    """The spans a watcher was active in, from its role lines (each start of its process
    writes a "starts" line); one still active runs to ``end``."""
    spans, since = [], None
    for t, role in lines + [(end, "standby")]:
        if role == "active" and since is None:
            since = t
        elif role == "standby" and since is not None:
            spans.append((since, t))
            since = None
    return spans


def slurmctld_takeover(log: Path) -> float | None:
    """When a backup slurmctld's log says it took control (its last time)."""
    found = re.findall(r"^\[(\S+?)\] error: ControlMachine \S+ not responding, "
                       r"BackupController\d+ \S+ taking over", log.read_text(), re.M)
    return datetime.strptime(found[-1], "%Y-%m-%dT%H:%M:%S.%f").timestamp() if found else None


def resize(c, node: str, job_id: int, cpus: int) -> bool:
    """The job's target through slurmctld, from a node (its commands try every controller)."""
    return c.exec(node, ["scontrol", "update", f"JobId={job_id}",
                         f"Comment=malleable:cpus={cpus}"], check=False, timeout=90).returncode == 0


def test_the_backups_watcher_takes_over_when_the_primarys_host_goes_and_hands_back(
        docker_slurm, jobs_dir):
    c = docker_slurm
    if not c.cluster.backup_controllers:
        pytest.fail("docker-slurm was brought up without a backup controller (BACKUP=1)")
    backup = c.cluster.backup_controllers[0]
    node = c.node_names[0]
    logs = c.host_dir / "log"
    primary_log, backup_log = logs / "watcher.out", logs / f"watcher-{backup}.out"
    agent_log = logs / f"agent-{node}.out"
    t_start = time.time()
    wait_for(lambda: roles(backup_log) and roles(backup_log)[-1][1] == "standby", timeout=60,
             what="the backup's watcher standing by", show=lambda: backup_log.read_text()[-1500:])
    assert c.ctl("scontrol", "ping").stdout.count("UP") == 2
    script = jobs_dir / "sleep.sh"
    script.write_text("#!/bin/bash\n#SBATCH --comment=malleable:min=1,max=node\nsleep 600\n")
    job = submit(c, script, f"-w{node}", "-c1", f"-o{c.to_container(jobs_dir / 'out')}")
    try:
        wait_for(lambda: job_state(c, job) == "RUNNING", timeout=60, what="the job running")
        assert resize(c, node, job, 1)
        t_update = time.time()
        assert len(node_cpus(c, node)) >= 2
        wait_for(lambda: len(job_cpus(c, node, job) or ()) == 1, timeout=60,
                 what="the job at 1 core (primary's watcher)")
        agent_mark = len(agent_log.read_text())
        # The backup knows only what the primary saved: the job's state written after it. The
        # update's own save may end within 0.5 s of it (then no save comes after t_update + 0.5
        # until the job changes again: seen in CI); the same update a second later starts one
        # that surely follows it.
        job_state_file = c.host_dir / "state" / "job_state"
        time.sleep(1.0)
        assert resize(c, node, job, 1)
        wait_for(lambda: job_state_file.stat().st_mtime > t_update + 0.5, timeout=60,
                 what="slurmctld's job state saved")

        # The primary's host goes away.
        t_kill = time.time()
        subprocess.run(["docker", "kill", c.cluster.container(c.controller)], check=True,
                       capture_output=True, timeout=60)
        # The resize is sent as soon as a controller takes it (the backup, once in control).
        wait_for(lambda: resize(c, node, job, 2), timeout=180,
                 what="the backup slurmctld taking the resize")
        t_ctld = time.time()
        wait_for(lambda: len(job_cpus(c, node, job) or ()) == 2, timeout=120,
                 what="the resize on the node through the backup's watcher",
                 show=lambda: (backup_log.read_text()[-1500:], agent_log.read_text()[-1500:]))
        t_resized = time.time()
        took_over = [t for t, r in roles(backup_log, t_start) if r == "active"]
        assert took_over, backup_log.read_text()[-1500:]
        assert f"feed link to {backup}:" in agent_log.read_text()[agent_mark:]
        takeover = slurmctld_takeover(logs / f"slurmctld-{backup}.log") or float("nan")
        print(f"\nfailover, seconds after the primary's host went (SlurmctldTimeout 30 s): "
              f"the backup slurmctld in control {takeover - t_kill:.1f}, its watcher active "
              f"{took_over[-1] - t_kill:.1f}, the resize taken by slurmctld "
              f"{t_ctld - t_kill:.1f} (each command first tries the primary's address), on the "
              f"node {t_resized - t_kill:.1f}")
        # Goal: the backup's watcher active within 30 s of its slurmctld taking control.
        takeover = slurmctld_takeover(logs / f"slurmctld-{backup}.log")
        assert takeover is not None and takeover > t_kill
        assert took_over[-1] - takeover <= 30.0, (takeover - t_kill, took_over[-1] - t_kill)

        # The primary comes back: slurmctld takes control again, the watchers hand back.
        subprocess.run(["docker", "start", c.cluster.container(c.controller)], check=True,
                       capture_output=True, timeout=60)
        t_back = time.time()
        wait_for(lambda: any(r == "active" and t > t_back for t, r in roles(primary_log)),
                 timeout=180, what="the primary's watcher active again",
                 show=lambda: (primary_log.read_text()[-1500:], backup_log.read_text()[-800:]))
        wait_for(lambda: resize(c, node, job, 1), timeout=60,
                 what="a resize through the primary")
        wait_for(lambda: len(job_cpus(c, node, job) or ()) == 1, timeout=60,
                 what="the resize on the node through the primary's watcher again")
        end = time.time()
        # Never two writers: the backup active only after the primary's host went, and its last
        # write of the feed before the primary's watcher became active again. Their role lines
        # may overlap: a watcher in a long poll checks its role again only after it, and a role
        # check just before its write fences it ("no longer the active watcher": beside the VMs
        # the backup's poll ran 15 s into the handover and wrote nothing, 2026-12-07).
        backup_spans = active_spans(roles(backup_log, t_start), end)
        assert backup_spans and backup_spans[0][0] > t_kill, roles(backup_log, t_start)
        primary_spans = active_spans([(t, r) for t, r in roles(primary_log) if t >= t_back], end)
        backup_writes = publishes(backup_log, t_start)
        assert primary_spans and backup_writes, (roles(primary_log)[-4:], backup_writes)
        assert backup_writes[-1] < primary_spans[0][0] and publishes(primary_log, t_back), \
            (backup_writes, publishes(primary_log, t_back), roles(primary_log)[-4:],
             roles(backup_log, t_start))
        print(f"failback: the primary's watcher active {primary_spans[0][0] - t_back:.1f} s "
              f"after its host came back, the backup's last write "
              f"{primary_spans[0][0] - backup_writes[-1]:.1f} s before that, its role line "
              f"standby {backup_spans[-1][1] - t_back:.1f} s after the host came back")
    finally:
        # The primary's host back whatever failed, so the other tests find their cluster.
        subprocess.run(["docker", "start", c.cluster.container(c.controller)],
                       capture_output=True, timeout=60)
        c.exec(node, ["scancel", str(job)], check=False, timeout=90)
