"""The job's status folder, which its user fills with anything: made private to the user by the
Prolog, removed by the Epilog on real trees without recursion, without following a link, with a
few descriptors whatever the depth, and within a budget."""
import os
import resource
import stat
import time
from pathlib import Path

import pytest

from malleable_protocol import RunLayout
from slurm_plugin.hooks.job_folder import (LEFTOVER_PREFIX, make_job_folder,
                                                 remove_job_folder, remove_tree, sweep_leftovers)

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="root ignores folder modes; chown needs root")
ME = os.geteuid()


def deep(top: Path, depth: int, name: str = "d", *, readonly_every: int = 0) -> None:
    """The folder ``top`` with ``depth`` nested folders below it, made through descriptors (no
    path is ever longer than one name), some made 0500 once filled."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    opened = []
    try:
        for level in range(depth):
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            if readonly_every and level % readonly_every == 0:
                opened.append(os.dup(nfd))
            os.close(fd)
            fd = nfd
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("x")
    finally:
        os.close(fd)
        for o in opened:
            os.fchmod(o, 0o500)
            os.close(o)


def highest_fd() -> int:
    return max(int(n) for n in os.listdir("/proc/self/fd"))


def remove(parent, name, **kw):
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return remove_tree(pfd, name, **kw)
    finally:
        os.close(pfd)


@needs_root
def test_the_job_folder_is_private_to_its_user_even_when_requeued(tmp_path):
    layout = RunLayout(tmp_path / "run")
    folder = make_job_folder(layout, 7, 4242, 4243)
    st = folder.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4242, 4243, 0o700)
    assert stat.S_IMODE(layout.jobs_dir.stat().st_mode) == 0o711     # root's, not listed
    folder.chmod(0o755)          # the user opened it up during the job's first run
    make_job_folder(layout, 7, 4242, 4243)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_tree_5000_deep_goes_with_a_few_descriptors_open(tmp_path):
    top = tmp_path / "job_1"
    deep(top, 5000)
    pfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Descriptors numbered past (the highest now open + 4) cannot be had: a removal that
    # held one per level, or recursed, fails here.
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest_fd() + 1 + 4, hard))
    try:
        t0 = time.monotonic()
        out = remove_tree(pfd, "job_1", owner=ME)
        took = time.monotonic() - t0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(pfd)
    assert out.complete and not out.problems, out.summary()
    assert not top.exists() and os.listdir(tmp_path) == []
    assert out.removed == 5000 + 2 and took < 60     # 0.7 s on an idle machine


def test_twenty_thousand_files_go(tmp_path):
    top = tmp_path / "job_2"
    top.mkdir()
    for sub in ("", "a", "a/b"):
        (top / sub).mkdir(exist_ok=True)
    fds = [os.open(top / sub, os.O_RDONLY | os.O_DIRECTORY) for sub in ("", "a", "a/b")]
    for i in range(20_000):
        os.close(os.open(f"rank_{i}.json", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fds[i % 3]))
    for fd in fds:
        os.close(fd)
    out = remove(tmp_path, "job_2", owner=ME)
    assert out.complete and not top.exists() and out.removed == 20_000 + 3


def test_links_are_removed_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep")
    (outside / "tree").mkdir()
    (outside / "tree" / "file").write_text("keep too")
    top = tmp_path / "job_3"
    (top / "sub" / "sub2").mkdir(parents=True)
    (top / "to_file").symlink_to(outside / "secret")
    (top / "to_dir").symlink_to(outside / "tree")
    (top / "sub" / "to_dir").symlink_to(outside / "tree")
    (top / "sub" / "sub2" / "to_root").symlink_to("/")
    (top / "sub" / "loop").symlink_to("loop")
    os.link(outside / "secret", top / "sub" / "hard")      # a second name of an outside file
    out = remove(tmp_path, "job_3", owner=ME)
    assert out.complete and not top.exists()
    assert (outside / "secret").read_text() == "keep"
    assert (outside / "tree" / "file").read_text() == "keep too"
    assert os.stat(outside / "secret").st_nlink == 1


def test_a_fifo_is_unlinked_never_opened(tmp_path):
    top = tmp_path / "job_4"
    (top / "a").mkdir(parents=True)
    os.mkfifo(top / "rank_0.json")
    os.mkfifo(top / "a" / "pipe")
    out = remove(tmp_path, "job_4", owner=ME)      # opening a FIFO would block here
    assert out.complete and not top.exists()


@needs_root
def test_folders_the_user_made_read_only_go(tmp_path):
    top = tmp_path / "job_5"
    deep(top, 40, readonly_every=7)
    (top / "ro").mkdir()
    (top / "ro" / "f").write_text("x")
    (top / "ro").chmod(0o500)
    top.chmod(0o500)
    out = remove(tmp_path, "job_5", owner=ME)
    assert out.complete and not top.exists(), out.summary()


def test_over_budget_it_stops_reports_and_the_next_call_goes_on(tmp_path):
    top = tmp_path / "job_6"
    deep(top, 300)
    for i in range(700):
        (top / f"f{i}").write_bytes(b"")
    out = remove(tmp_path, "job_6", owner=ME, budget=200)
    assert not out.complete and out.work <= 200 and top.is_dir()
    assert any("budget" in p for p in out.problems)
    out = remove(tmp_path, "job_6", owner=ME)
    assert out.complete and not top.exists()


@needs_root
def test_only_the_owners_folders_are_entered(tmp_path):
    top = tmp_path / "job_7"
    (top / "mine" / "theirs").mkdir(parents=True)
    (top / "mine" / "theirs" / "kept").write_text("x")
    os.chown(top / "mine" / "theirs", 4243, 4243)
    out = remove(tmp_path, "job_7", owner=ME)
    assert not out.complete and "not entered" in out.summary()
    assert [p.name for p in top.rglob("kept")] == ["kept"]
    assert remove(tmp_path, "job_7", owner=4242).problems[0].endswith("not entered")


def test_an_unfinished_job_folder_is_set_aside_and_swept_later(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.jobs_dir.mkdir(parents=True)
    layout.jobs_dir.chmod(0o755)
    top = layout.job_dir(8)
    top.mkdir()
    for i in range(500):
        (top / f"f{i}").write_bytes(b"")
    out = remove_job_folder(layout, 8, ME, budget=100)
    assert not out.complete and not top.exists()          # a requeued job 8 starts afresh
    (aside,) = os.listdir(layout.jobs_dir)
    assert aside.startswith(f"{LEFTOVER_PREFIX}job_8-") and aside in out.summary()
    swept = sweep_leftovers(layout, budget=1000)
    assert swept.complete and os.listdir(layout.jobs_dir) == []
    assert remove_job_folder(layout, 9, ME).complete             # none: nothing to do


@needs_root
def test_a_jobs_folder_others_can_write_is_refused(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.jobs_dir.mkdir(parents=True)
    layout.jobs_dir.chmod(0o777)
    with pytest.raises(OSError):
        remove_job_folder(layout, 8, ME)
