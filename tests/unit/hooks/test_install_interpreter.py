"""The hooks run their interpreter as root (issue 40): install refuses one that a user other
than root could change, the interpreter or any folder it imports the hooks' packages from."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from malleable_protocol.safe_io import not_roots_alone
from slurm_plugin.hooks.install import UnsafeInterpreter, install, interpreter_problems
from slurm_plugin.node.config import AgentConfig

REPO = Path(__file__).resolve().parents[3]
USER = 1000


def test_a_path_is_roots_alone_only_when_every_folder_above_it_is(tmp_path):
    root_dir = tmp_path / "root"
    (root_dir / "bin").mkdir(parents=True)
    (root_dir / "bin" / "python").write_text("")
    assert not_roots_alone(root_dir / "bin" / "python") == []
    users = tmp_path / "users"
    users.mkdir()
    os.chown(users, USER, USER)
    (users / "python").write_text("")
    assert not_roots_alone(users / "python") == [f"{users}: owned by uid {USER}"]
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "python").write_text("")
    assert "anyone may write it" in not_roots_alone(open_dir / "python")[0]
    open_dir.chmod(0o1777)          # sticky, as /tmp: a root's entry in it is root's alone
    assert not_roots_alone(open_dir / "python") == []
    assert "anyone may write it" in not_roots_alone(open_dir)[0]      # but not what it holds
    group = tmp_path / "group"
    group.mkdir()
    os.chown(group, 0, USER)
    group.chmod(0o775)
    assert not_roots_alone(group) == [f"{group}: its group {USER} may write it"]
    (root_dir / "link").symlink_to(users / "python")    # a root's link to a user's file
    assert f"{users}: owned by uid {USER}" in not_roots_alone(root_dir / "link")
    assert "No such file" in not_roots_alone(tmp_path / "missing")[0]


def test_install_refuses_an_interpreter_in_a_folder_a_user_owns(tmp_path):
    users = tmp_path / "venv"
    (users / "bin").mkdir(parents=True)
    os.chown(users, USER, USER)
    (users / "bin" / "python").symlink_to(sys.executable)
    dest = tmp_path / "hooks"
    with pytest.raises(UnsafeInterpreter, match=f"{users}: owned by uid {USER}"):
        install(dest, AgentConfig(node="n1"), python=str(users / "bin" / "python"),
                spank_library=Path("/nonexistent.so"))
    assert not dest.exists()                      # refused before anything is written


def test_an_interpreter_that_imports_the_hooks_from_a_users_folder_is_refused(tmp_path):
    """A root-made venv whose .pth file points at a copy of the packages in a user's folder:
    the interpreter is root's, what ``python -I -m slurm_plugin.hooks`` would import is not."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    users = tmp_path / "users"
    users.mkdir()
    for package in ("slurm_plugin", "malleable_protocol", "malleable_policy"):
        shutil.copytree(REPO / package, users / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for folder, dirs, files in os.walk(users):
        for name in [folder] + [os.path.join(folder, n) for n in dirs + files]:
            os.chown(name, USER, USER)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-I", "-c", "import site; print(site.getsitepackages()[0])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "aaa_users.pth").write_text(f"{users}\n")
    problems = interpreter_problems(str(python))
    assert f"{users}: owned by uid {USER}" in problems
    assert any(p.startswith(f"{users}/slurm_plugin/") for p in problems)
    (Path(site) / "aaa_users.pth").write_text(f"{REPO}\n")      # root's checkout instead
    assert interpreter_problems(str(python)) == []


def test_this_checkouts_interpreter_is_roots_alone():
    """The interpreter the suite installs the hooks with (the local cluster's): root's."""
    assert interpreter_problems(sys.executable) == []
