"""The job's status folder (``RunLayout.job_dir``), where its ranks write their records: the
Prolog makes it for the job's user (0700, in the jobs folder only root writes), the Epilog
removes it.

Its user may have filled it with anything: a tree thousands of folders deep, links to files
elsewhere, FIFOs, folders made read-only, and may still be changing it (another job of the
same user on the node). ``remove_tree`` therefore never recurses and never follows a link: it
works through folder descriptors opened with O_NOFOLLOW, at most two of its own open whatever
the depth. It flattens the tree: each entry of the top folder is unlinked, or, a folder, is
emptied one level (its files unlinked, its sub-folders moved up into the top folder under
fresh names) and removed. It enters only folders of the top folder's owner on the top folder's
file system, and stops after a budget of entries; what it could not finish is set aside in the
jobs folder (``.ended-job_<id>-<ns>``, a name no job uses) for the next Epilog.
"""
from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from malleable_protocol import RunLayout
from malleable_protocol.layout import ENTRY_DIR_MODE
from malleable_protocol.safe_io import UnsafePath, ensure_private_dir, list_bounded, open_dir

REMOVE_BUDGET = 100_000      # entries one Epilog looks at (each unlink, rmdir or move)
BATCH = 1024                 # names listed from one folder at a time
MAX_STUCK = 256              # entries of the top folder that cannot be removed, before giving up
LEFTOVER_PREFIX = ".ended-"


def make_job_folder(layout: RunLayout, job_id: int, uid: int, gid: int) -> Path:
    """The folder where the job's ranks write their records, owned by the job's user and
    private to it (0700: root and the user only), in a folder only root writes (nobody can
    make it ahead of the job)."""
    jobs = ensure_private_dir(layout.jobs_dir, ENTRY_DIR_MODE)
    name = layout.job_dir(job_id).name
    jfd = open_dir(jobs)
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=jfd)
        except FileExistsError:
            pass     # a requeued job: the folder is checked and re-owned below
        dfd = open_dir(name, dir_fd=jfd)
        try:
            os.fchown(dfd, uid, gid)
            os.fchmod(dfd, 0o700)
        finally:
            os.close(dfd)
    finally:
        os.close(jfd)
    return jobs / name


@dataclass
class Removal:
    """What a removal did: ``complete`` when nothing of it is left."""

    removed: int = 0            # entries unlinked or removed (folders)
    moved: int = 0              # folders moved up into the top folder
    work: int = 0               # entries looked at, the budget's unit
    complete: bool = False
    problems: list[str] = field(default_factory=list)

    def add(self, other: "Removal") -> None:
        self.removed += other.removed
        self.moved += other.moved
        self.work += other.work
        self.problems += other.problems

    def summary(self) -> str:
        done = "removed" if self.complete else "NOT removed"
        return (f"{done} ({self.removed} entries, {self.moved} folders moved up)"
                + "".join(f"; {p}" for p in self.problems))


def _is_dir(name: str, dir_fd: int) -> bool | None:
    """Whether ``name`` is a folder (a link is not), None when it is gone."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return None


def remove_tree(parent_fd: int, name: str, *, owner: int | None = None,
                budget: int = REMOVE_BUDGET) -> Removal:
    """Remove ``name`` in the folder ``parent_fd`` and everything below it, without recursion
    and without following links (see the module's text), looking at no more than ``budget``
    entries. A folder of ``owner`` (when given; else whoever owns it), entering only folders
    of that owner on its file system. Never raises for what the tree holds: the result says."""
    out = Removal()
    try:
        kind = _is_dir(name, parent_fd)
        if kind is None:
            out.complete = True
            return out
        if not kind:                 # a file or link where the folder was: only the name goes
            os.unlink(name, dir_fd=parent_fd)
            out.removed = out.work = 1
            out.complete = True
            return out
        top = open_dir(name, dir_fd=parent_fd)
        try:
            st = os.fstat(top)
            if owner is not None and st.st_uid != owner:
                out.problems.append(f"{name}: owned by uid {st.st_uid}, not {owner}: not entered")
                return out
            _empty_top(top, st, out, budget)
        finally:
            os.close(top)
    except OSError as exc:
        out.problems.append(f"{name}: {type(exc).__name__}: {exc.strerror}")
        return out
    if not out.problems:
        try:
            os.rmdir(name, dir_fd=parent_fd)
            out.removed += 1
            out.complete = True
        except FileNotFoundError:
            out.complete = True
        except OSError as exc:
            out.problems.append(f"{name}: {exc.strerror}")
    return out


def _empty_top(top: int, st: os.stat_result, out: Removal, budget: int) -> None:
    fresh = (f".rm-{os.getpid()}-{n}" for n in itertools.count())
    stuck: dict[str, str] = {}
    while True:
        names = [n for n in list_bounded(top, BATCH + len(stuck)) if n not in stuck]
        if not names:
            break
        for name in names:
            if out.work >= budget:
                out.problems.append(f"stopped at its budget ({budget} entries)")
                return
            before = out.removed + out.moved
            why = _clear_entry(top, name, st, out, budget, fresh)
            if why is not None and out.removed + out.moved == before:
                stuck[name] = why
        if len(stuck) > MAX_STUCK:
            break
    if stuck:
        sample = "; ".join(f"{n}: {w}" for n, w in list(stuck.items())[:3])
        out.problems.append(f"{len(stuck)} entries cannot be removed ({sample})")


def _clear_entry(top: int, name: str, st: os.stat_result, out: Removal, budget: int,
                 fresh) -> str | None:
    """One entry of the top folder: unlinked, or a folder emptied one level (its sub-folders
    moved up into ``top``) and removed. Returns why it cannot be, None when it went (or might
    next time: the user changed it meanwhile)."""
    out.work += 1
    kind = _is_dir(name, top)
    if kind is None:
        return None
    if not kind:
        try:
            os.unlink(name, dir_fd=top)
            out.removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:             # EISDIR: made a folder meanwhile (seen next pass)
            return exc.strerror
        return None
    try:
        os.rmdir(name, dir_fd=top)
        out.removed += 1
        return None
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            return exc.strerror            # EBUSY (a mount point), ENOTDIR (a link now)...
    try:
        sub = open_dir(name, dir_fd=top)
    except OSError as exc:                 # ELOOP: a link now (unlinked next pass)
        return exc.strerror
    try:
        sst = os.fstat(sub)
        if sst.st_uid != st.st_uid:
            return f"a folder of uid {sst.st_uid}: not entered"
        if sst.st_dev != st.st_dev:
            return "another file system: not entered"
        for child in list_bounded(sub, BATCH):
            if out.work >= budget:
                return None
            out.work += 1
            try:
                ckind = _is_dir(child, sub)
                if ckind is None:
                    continue
                if not ckind:
                    os.unlink(child, dir_fd=sub)
                    out.removed += 1
                    continue
                try:
                    os.rmdir(child, dir_fd=sub)
                    out.removed += 1
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                _move_up(sub, child, top, fresh, out)
            except OSError:
                continue                   # changed meanwhile, or stuck: seen again next pass
    finally:
        os.close(sub)
    try:
        os.rmdir(name, dir_fd=top)
        out.removed += 1
    except OSError as exc:
        return exc.strerror                # ENOTEMPTY: more than a batch, or stuck below
    return None


def _move_up(sub: int, child: str, top: int, fresh, out: Removal) -> None:
    """Move the folder ``child`` of ``sub`` into ``top`` under a name not in use there."""
    for _ in range(8):
        new = next(fresh)
        if _is_dir(new, top) is not None:
            continue                       # the user's own name: another
        try:
            os.rename(child, new, src_dir_fd=sub, dst_dir_fd=top)
            out.moved += 1
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise


def _jobs_fd(layout: RunLayout) -> int | None:
    """The jobs folder, when it is root's own (only root writes there), else UnsafePath."""
    try:
        jfd = open_dir(layout.jobs_dir)
    except FileNotFoundError:
        return None
    st = os.fstat(jfd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(jfd)
        raise UnsafePath(errno.EPERM, f"{layout.jobs_dir}: not root's own folder")
    return jfd


def remove_job_folder(layout: RunLayout, job_id: int, uid: int, *,
                      budget: int = REMOVE_BUDGET) -> Removal:
    """Remove the job's status folder: root's (the Prolog's, once its tmpfs is off it) or the
    tmpfs's root, ``uid``'s. What the budget did not reach is set aside in the jobs folder for
    the next Epilog (``sweep_leftovers``), so a requeued job of the same id gets a fresh
    folder."""
    jfd = _jobs_fd(layout)
    if jfd is None:
        return Removal(complete=True)
    try:
        name = layout.job_dir(job_id).name
        try:
            roots = os.stat(name, dir_fd=jfd, follow_symlinks=False).st_uid == 0
        except FileNotFoundError:
            roots = False
        out = remove_tree(jfd, name, owner=0 if roots else uid, budget=budget)
        if not out.complete:
            aside = f"{LEFTOVER_PREFIX}{name}-{time.time_ns()}"
            try:
                os.rename(name, aside, src_dir_fd=jfd, dst_dir_fd=jfd)
                out.problems.append(f"the rest set aside as {aside}")
            except OSError as exc:
                out.problems.append(f"cannot be set aside: {exc.strerror}")
        return out
    finally:
        os.close(jfd)


def sweep_leftovers(layout: RunLayout, *, budget: int = REMOVE_BUDGET) -> Removal:
    """Go on removing what earlier Epilogs set aside, within ``budget`` entries in all."""
    total = Removal(complete=True)
    jfd = _jobs_fd(layout)
    if jfd is None:
        return total
    try:
        for name in list_bounded(jfd, BATCH * 4):
            if not name.startswith(LEFTOVER_PREFIX):
                continue
            if total.work >= budget:
                total.complete = False
                break
            one = remove_tree(jfd, name, budget=budget - total.work)
            total.add(one)
            total.complete = total.complete and one.complete
    finally:
        os.close(jfd)
    return total
