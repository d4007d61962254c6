"""The two installables as a site gets them (docs/install.md).

User side: the malleable-tf wheel (packaging/build-wheels.sh) installed into a new environment
that already has TensorFlow 2.21 (.venv-keras3's, made by scripts/setup.sh --keras3), or 2.15
(.venv's), installs itself alone, nothing fetched (--no-index), and TensorFlow is the same
afterwards; the native library built for each release into the one wheel loads beside it.
Node side: the malleable-slurm Debian package (packaging/deb/build-deb.sh) built against this
host's libslurm-dev holds the co-scheduler, the SPANK plugin and the units (not the
simulator), depends on this host's Slurm release, and its command runs from the package's
files alone; the RPM for RHEL 9 (packaging/rpm/build-rpm.sh, rpmbuild on this host) holds the
same files for python3.11 and requires SchedMD's slurm of the same release."""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERAS3_PY = REPO / ".venv-keras3" / "bin" / "python"
TF215_PY = REPO / ".venv" / "bin" / "python"
TORCH_PY = REPO / ".venv-torch" / "bin" / "python"
TF_VERSION = "import tensorflow as tf; print(tf.__version__)"
TORCH_VERSION = "import torch; print(torch.__version__)"


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=True,
                          timeout=kw.pop("timeout", 300), **kw)


def build_wheel(tmp_path: Path, build_args: tuple = ()) -> Path:
    """The user wheel, built by packaging/build-wheels.sh into ``tmp_path``/dist."""
    run(["bash", REPO / "packaging" / "build-wheels.sh", *build_args, tmp_path / "dist"],
        timeout=600)
    wheel, = (tmp_path / "dist").glob("malleable_tf-*.whl")
    return wheel


def install_beside(wheel: Path, framework_python: Path, version_code: str, tmp_path: Path,
                   elsewhere: bool = False) -> tuple[Path, str, str]:
    """``wheel`` installed into a new environment (in ``tmp_path``) that sees a framework's
    environment's packages (as a user's own environment holds its framework): the wheel must
    install alone and leave the framework as it was. ``elsewhere``: the new environment sees
    them at another path (a folder of links to each), as a user's own install of the same
    release has them. Returns the new environment's python, its site folder and the
    framework's version."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env_dir = tmp_path / "venv"
    run([framework_python, "-m", "venv", env_dir])
    py = env_dir / "bin" / "python"
    site = "import sysconfig; print(sysconfig.get_path('purelib'))"
    framework_site = run([framework_python, "-c", site]).stdout.strip()
    own_site = run([py, "-c", site]).stdout.strip()
    seen_at = framework_site
    if elsewhere:
        seen_at = str(tmp_path / "framework-elsewhere")
        Path(seen_at).mkdir()
        for entry in Path(framework_site).iterdir():
            Path(seen_at, entry.name).symlink_to(entry)
    Path(own_site, "framework-env.pth").write_text(seen_at + "\n")
    before = run([py, "-c", version_code]).stdout.strip()
    report = tmp_path / "report.json"
    run([py, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet", "--report", report,
         wheel])
    installs = [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]]
    assert installs == ["malleable-tf"], installs
    run([py, "-m", "pip", "install", "--no-index", "--quiet", wheel])
    assert run([py, "-I", "-c", version_code]).stdout.strip() == before
    return py, own_site, before


def wheel_beside(framework_python: Path, version_code: str,
                 tmp_path: Path) -> tuple[Path, str, str]:
    """The pure wheel built and installed beside a framework (``install_beside``)."""
    return install_beside(build_wheel(tmp_path), framework_python, version_code, tmp_path)


# A job's environment on a node with no compiler and no cache of its own, and what it asks:
# malleable_tf started, and the native library it loaded.
NATIVE_LOADED = ("import malleable_tf; s = malleable_tf.init(max_threads=2); "
                 "print(s.intra_active, *{l.split()[-1] for l in open('/proc/self/maps') "
                 "if 'libmalleable_tf-' in l})")


def native_loaded(py: Path, tmp_path: Path) -> list[str]:
    """NATIVE_LOADED run by ``py`` as a job on such a node: [active threads, library path]."""
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path / "home"),
           "MALLEABLE_CACHE": str(tmp_path / "empty-cache"), "MALLEABLE_TF_LOG": "0"}
    return run([py, "-I", "-c", NATIVE_LOADED], cwd=tmp_path, env=env).stdout.split()


def test_the_user_wheel_installs_beside_tensorflow_2_21_and_2_15_and_replaces_nothing(tmp_path):
    assert KERAS3_PY.exists(), "the Keras 3 environment is missing: scripts/setup.sh --keras3"
    # One wheel carries the native library built for TensorFlow 2.15 (.venv) and for 2.21
    # (.venv-keras3); each new environment loads the one for its release. The 2.21 one has
    # that release at another path, as a user's own install would.
    wheel = build_wheel(tmp_path, ("--prebuilt", TF215_PY, "--prebuilt", KERAS3_PY))
    prebuilt = sorted(n.rsplit("/", 1)[1] for n in zipfile.ZipFile(wheel).namelist()
                      if "/native/prebuilt/" in n)
    assert [n.split("-")[1] for n in prebuilt] == ["2.15.1", "2.21.0"], prebuilt
    py, own_site, version = install_beside(wheel, KERAS3_PY, TF_VERSION, tmp_path / "tf221",
                                           elsewhere=True)
    assert version.startswith("2.21"), version
    includes = [run([p, "-I", "-c", "import tensorflow as tf; print(tf.sysconfig.get_include())"])
                .stdout.strip() for p in (KERAS3_PY, py)]
    assert includes[1].startswith(f"{tmp_path}/tf221/framework-elsewhere/") and \
        includes[0] != includes[1], includes
    where = run([py, "-I", "-c", "import malleable_tf, malleable_runtime.srun as s; "
                 "print(malleable_tf.__file__)"]).stdout
    assert where.startswith(own_site), where       # the wheel's, not the checkout's
    usage = run([py.parent / "malleable-srun", "--help"], cwd=tmp_path).stdout
    assert usage.startswith("``malleable-srun``: run a TensorFlow or PyTorch program")
    top = run([py, "-I", "-c", "import importlib.metadata as m; "
               "print(m.distribution('malleable-tf').read_text('top_level.txt'))"]).stdout
    assert sorted(top.split()) == ["malleable_protocol", "malleable_runtime", "malleable_tf",
                                   "malleable_torch", "sbatch_templates"]
    # A job right after pip install: the wheel's copy, built in another environment, loads in
    # this one.
    out = native_loaded(py, tmp_path)
    prebuilt_dir = f"{own_site}/malleable_tf/native/prebuilt/libmalleable_tf-"
    assert out[0] == "2" and out[1].startswith(f"{prebuilt_dir}{version}-"), out
    # The native library built once at install, into the environment's site copy (a site's
    # own flags, say): a job then loads that one, still with no compiler and no cache.
    built = run([py, "-I", "-m", "malleable_tf.build"], cwd=tmp_path, timeout=600).stdout
    site_copy = tmp_path / "tf221" / "venv" / "share" / "malleable" / "native"
    assert f"TensorFlow {version} (full): {site_copy}/libmalleable_tf-{version}-" in built, built
    out = native_loaded(py, tmp_path)
    assert out[0] == "2" and out[1].startswith(f"{site_copy}/"), out
    # The same wheel beside TensorFlow 2.15: its own release's copy loads.
    py, own_site, version = install_beside(wheel, TF215_PY, TF_VERSION, tmp_path / "tf215")
    assert version == "2.15.1", version
    out = native_loaded(py, tmp_path)
    prebuilt_dir = f"{own_site}/malleable_tf/native/prebuilt/libmalleable_tf-"
    assert out[0] == "2" and out[1].startswith(f"{prebuilt_dir}2.15.1-"), out
    assert not (tmp_path / "empty-cache").exists()


def test_the_user_wheel_installs_beside_pytorch_and_replaces_nothing(tmp_path):
    assert TORCH_PY.exists(), "the PyTorch environment is missing: scripts/setup.sh --torch"
    py, own_site, version = wheel_beside(TORCH_PY, TORCH_VERSION, tmp_path)
    assert version == "2.13.0+cpu", version
    # The wheel's malleable_torch, started as a job would, with nothing on PATH: no compiler, no
    # native build.
    code = ("import malleable_torch, torch; s = malleable_torch.init(max_threads=2); "
            "print(malleable_torch.__file__, s.intra_active, torch.get_num_threads())")
    out = run([py, "-I", "-c", code], cwd=tmp_path,
              env={"PATH": "/nonexistent", "MALLEABLE_TF_LOG": "0"}).stdout.split()
    assert out[0].startswith(own_site) and out[1:] == ["2", "2"], out


def test_the_user_wheels_malleable_sbatch_submits_a_template_with_the_sites_options(
        agent_cluster, tmp_path):
    """A login node has the user wheel only: its malleable-sbatch renders a template and hands
    it to the real sbatch, with what follows -- on sbatch's command line, where it wins over the
    template's #SBATCH lines (--time here); job_submit.lua reads the template's --malleable."""
    py, own_site, _ = wheel_beside(TORCH_PY, TORCH_VERSION, tmp_path)
    env = {**os.environ, **agent_cluster.env()}      # with the hooks: job_submit.lua, SPANK
    sbatch = py.parent / "malleable-sbatch"
    done = subprocess.run([str(sbatch), "pytorch-ddp", "--set", "program=train.py", "--set",
                           "nodes=1", "--", "--hold", "--job-name=wheel-sbatch", "--time=7"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = int(re.fullmatch(r"Submitted batch job (\d+)\n", done.stdout)[1])
    try:
        show = run(["scontrol", "show", "job", str(job_id)], env=env).stdout
        for field in ("JobName=wheel-sbatch", "TimeLimit=00:07:00", "JobState=PENDING",
                      "AdminComment=malleable:min=1,max=node,weight=1"):
            assert field in show, show
        script = run(["scontrol", "write", "batch_script", str(job_id), "-"], env=env).stdout
        # The wheel's own launcher and interpreter run the program.
        assert f"exec {py.parent / 'malleable-srun'} {py} train.py" in script, script
    finally:
        run(["scancel", str(job_id)], env=env)
    assert not list(Path(tempfile.gettempdir()).glob("malleable-pytorch-ddp-*.sbatch"))
    bad = subprocess.run([str(sbatch), "pytorch-ddp", "--set", "nodes=1"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr == "malleable-sbatch: pytorch-ddp needs program=...\n"


def test_the_node_package_is_built_for_this_slurm_and_runs_from_its_own_files(tmp_path):
    run(["bash", REPO / "packaging" / "deb" / "build-deb.sh", tmp_path / "dist"])
    deb, = (tmp_path / "dist").glob("malleable-slurm_*.deb")
    slurm = run(["dpkg-query", "-W", "-f", "${Version}", "libslurm-dev"]).stdout
    release = ".".join(slurm.split(".")[:2])
    fields = dict(line.split(": ", 1) for line in
                  run(["dpkg-deb", "-f", deb, "Version", "Depends"]).stdout.splitlines())
    assert fields["Version"].endswith(f"+slurm{release}")
    major, minor = release.split(".")
    # Debian's Slurm or SchedMD's slurm-smd packages, this release and not the next.
    assert f"slurm-client (>= {release}) | slurm-smd-client (>= {release})" in fields["Depends"]
    nxt = f"{major}.{int(minor) + 1:02d}"
    breaks = run(["dpkg-deb", "-f", deb, "Breaks"]).stdout.strip()
    assert breaks == f"slurm-client (>= {nxt}), slurm-smd-client (>= {nxt})", breaks
    files = set(re.findall(r"\s\.(/\S+)$", run(["dpkg-deb", "-c", deb]).stdout, re.M))
    for path in ("/usr/bin/malleable", "/usr/lib/malleable/malleable_spank.so",
                 "/lib/systemd/system/malleable-agent@.service",
                 "/lib/systemd/system/malleable-watcher.service",
                 "/usr/share/doc/malleable-slurm/install.md",
                 "/usr/lib/python3/dist-packages/slurm_plugin/commands/main.py",
                 "/usr/lib/python3/dist-packages/slurm_plugin/hooks/templates/job_submit.lua.tmpl",
                 "/usr/lib/python3/dist-packages/malleable_protocol/__init__.py",
                 "/usr/lib/python3/dist-packages/malleable_policy/decide.py"):
        assert path in files, path
    assert not [f for f in files if "__pycache__" in f or "malleable_tf" in f
                or "malleable_runtime" in f or "malleable_sim" in f
                or "/slurm_plugin/cluster/" in f]
    root = tmp_path / "root"
    run(["dpkg-deb", "-x", deb, root])
    # The plugin is a SPANK plugin: slurmstepd looks these symbols up.
    symbols = run(["nm", "-D", "--defined-only", root / "usr/lib/malleable/malleable_spank.so"]
                  ).stdout
    for symbol in ("plugin_name", "plugin_version", "slurm_spank_init"):
        assert re.search(rf"\b{symbol}\b", symbols), symbol
    # /usr/bin/malleable with the package's files first on the path (-I: nothing else).
    script = (root / "usr/bin/malleable").read_text()
    assert script.startswith("#!/usr/bin/python3 -I\n")
    site = root / "usr/lib/python3/dist-packages"
    out = run(["/usr/bin/python3", "-I", "-c",
               f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv = ['malleable', "
               f"'--version']; exec(open({str(root / 'usr/bin/malleable')!r}).read())"]).stdout
    assert out.strip() == f"malleable {fields['Version']}"
    simulate = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
         f"sys.argv = ['malleable', 'simulate', '--jobs', '5']; "
         f"exec(open({str(root / 'usr/bin/malleable')!r}).read())"],
        capture_output=True, text=True, timeout=60)
    # The simulator is its own command (malleable-sim), not the node's.
    assert simulate.returncode == 2 and "invalid choice: 'simulate'" in simulate.stderr, \
        simulate.stderr
    unit = (root / "lib/systemd/system/malleable-watcher.service").read_text()
    assert "ExecStart=/usr/bin/malleable watcher --config /etc/malleable/agent.json" in unit


def test_the_package_for_the_release_a_site_upgrades_to_builds_against_its_headers(tmp_path):
    """SLURM_INCLUDE (docs/install.md section 10): the package for another release, built
    before the host has it, from that release's headers (here this host's, their version
    number changed to 26.05's): its version, Depends and Breaks name 26.05, and its plugin says
    26.05 to the Slurm that loads it (plugin_version, which Slurm's plugin loader compares)."""
    include = tmp_path / "include"
    include.mkdir()
    run(["cp", "-r", "/usr/include/slurm", include / "slurm"])
    header = include / "slurm" / "slurm_version.h"
    text, n = re.subn(r"(?m)^#define SLURM_VERSION_NUMBER 0x[0-9a-fA-F]+",
                      "#define SLURM_VERSION_NUMBER 0x1a0500", header.read_text())
    assert n == 1
    header.write_text(text)
    run(["bash", REPO / "packaging" / "deb" / "build-deb.sh", tmp_path / "dist"],
        env={**os.environ, "SLURM_INCLUDE": str(include)})
    deb, = (tmp_path / "dist").glob("malleable-slurm_*.deb")
    fields = dict(line.split(": ", 1) for line in
                  run(["dpkg-deb", "-f", deb, "Version", "Depends", "Breaks"]).stdout.splitlines())
    assert fields["Version"].endswith("+slurm26.05"), fields
    assert "slurm-client (>= 26.05)" in fields["Depends"], fields
    assert fields["Breaks"] == "slurm-client (>= 26.06), slurm-smd-client (>= 26.06)", fields
    root = tmp_path / "root"
    run(["dpkg-deb", "-x", deb, root])
    so = root / "usr/lib/malleable/malleable_spank.so"
    number = run(["python3", "-c", "import ctypes, os, sys; lib = ctypes.CDLL(sys.argv[1], "
                  "os.RTLD_LAZY); print(hex(ctypes.c_uint.in_dll(lib, 'plugin_version').value))",
                  so]).stdout.strip()
    assert number == "0x1a0500", number


def test_the_rpm_holds_the_same_node_side_for_rhel_9s_python_3_11(tmp_path):
    """RHEL 9's python3 is 3.9: the RPM's files are python3.11's, its command runs on it, and it
    requires SchedMD's slurm package of the release its plugin was built for."""
    run(["bash", REPO / "packaging" / "rpm" / "build-rpm.sh", tmp_path / "dist"])
    rpm, = (tmp_path / "dist").glob("malleable-slurm-*.rpm")
    slurm = run(["dpkg-query", "-W", "-f", "${Version}", "libslurm-dev"]).stdout
    release = ".".join(slurm.split(".")[:2])
    major, minor = release.split(".")
    nxt = f"{major}.{int(minor) + 1:02d}"
    name, version, rel = run(["rpm", "-qp", "--qf", "%{NAME} %{VERSION} %{RELEASE}", rpm]
                             ).stdout.split()
    assert (name, rel) == ("malleable-slurm", f"1.slurm{release}")
    requires = set(run(["rpm", "-qpR", rpm]).stdout.splitlines())
    assert {f"(slurm >= {release} with slurm < {nxt})", "python3.11", "munge-libs",
            "python(abi) = 3.11"} <= requires, requires
    files = set(run(["rpm", "-qpl", rpm]).stdout.splitlines())
    site = "/usr/lib/python3.11/site-packages"
    for path in ("/usr/bin/malleable", "/usr/lib/malleable/malleable_spank.so",
                 "/usr/lib/systemd/system/malleable-agent@.service",
                 "/usr/lib/systemd/system/malleable-watcher.service",
                 "/usr/share/doc/malleable-slurm/install.md",
                 f"{site}/slurm_plugin/commands/main.py", f"{site}/slurm_plugin",
                 f"{site}/malleable_policy/decide.py", f"{site}/malleable_protocol/__init__.py"):
        assert path in files, path
    assert not [f for f in files if "__pycache__" in f or "malleable_tf" in f
                or "malleable_sim" in f or "/slurm_plugin/cluster" in f]
    # The same files as the Debian package's, each where its system puts it.
    run(["bash", REPO / "packaging" / "deb" / "build-deb.sh", tmp_path / "deb"])
    deb, = (tmp_path / "deb").glob("malleable-slurm_*.deb")
    deb_files = {f.replace("/usr/lib/python3/dist-packages", site)
                 .replace("/lib/systemd/system", "/usr/lib/systemd/system") for f in
                 re.findall(r"^-\S+\s.*\s\.(/\S+)$", run(["dpkg-deb", "-c", deb]).stdout,
                            re.M)}
    rpm_files = {line.split(" ", 1)[1] for line in run(
        ["rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]", rpm]).stdout.splitlines()
        if line.startswith("-")}
    assert len(rpm_files) > 50 and "/usr/bin/malleable" in rpm_files
    assert deb_files - {"/usr/share/doc/malleable-slurm/copyright"} == rpm_files, \
        sorted(deb_files ^ rpm_files)
    # Its command from its own files on Python 3.11 (this host's python3, as RHEL's python3.11).
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(f"rpm2cpio {rpm} | cpio -idm --quiet", shell=True, cwd=root, check=True,
                   timeout=120)
    script = (root / "usr/bin/malleable").read_text()
    assert script.startswith("#!/usr/bin/python3.11 -I\n")
    out = run(["/usr/bin/python3", "-I", "-c",
               f"import sys; sys.path.insert(0, {str(root) + site!r}); sys.argv = ['malleable', "
               f"'--version']; exec(open({str(root / 'usr/bin/malleable')!r}).read())"]).stdout
    assert out.strip() == f"malleable {version}+slurm{release}"

