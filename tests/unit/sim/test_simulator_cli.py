"""``malleable-sim``'s exit codes and messages (0 done, 1 could not be done with one line
``malleable-sim: ...`` on stderr, 2 usage), and that the node's ``malleable`` command knows
nothing of the simulator."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from malleable_sim.cli import main

ROOT = Path(__file__).resolve().parents[3]


def _fails(capsys, argv, *parts):
    assert main(argv) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("malleable-sim: "), err
    for part in parts:
        assert part in first, err


def test_a_missing_log(tmp_path, capsys):
    _fails(capsys, ["--swf", str(tmp_path / "none.swf")], "none.swf: No such file or directory")


def test_no_backfill_window(capsys):
    _fails(capsys, ["--jobs", "10", "--nodes", "1", "--cores", "4", "--backfill-window", "0"],
           "backfill_window_s must be positive")


def test_a_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--policy", "nonsense"])
    assert done.value.code == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err


def test_without_numpy_it_says_what_it_needs():
    """The simulator installed without numpy (its `sim` extra): one line says what is missing;
    the node's command is not touched by it."""
    code = ("import sys; sys.modules['numpy'] = None\n"
            "from slurm_plugin.commands.main import build_parser\n"
            "build_parser().parse_args(['status', '--json'])\n"
            "from malleable_sim.cli import main\n"
            "sys.exit(main(['--jobs', '10']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 1, out
    assert out.stderr.strip().splitlines() == [
        "malleable-sim: the simulator needs numpy, which is not installed here "
        "(pip install 'malleable-hpc[sim]')"], out


def test_the_node_command_has_no_simulate(capsys):
    from slurm_plugin.commands.main import main as node_main
    with pytest.raises(SystemExit) as done:
        node_main(["simulate", "--jobs", "5"])
    assert done.value.code == 2
    assert "invalid choice: 'simulate'" in capsys.readouterr().err


def test_runs_as_a_module_and_writes_its_summary(tmp_path):
    out = subprocess.run([sys.executable, "-m", "malleable_sim.cli", "--nodes", "2", "--cores",
                          "4", "--jobs", "20", "--policy", "static", "--json",
                          str(tmp_path / "s.json")], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out
    lines = out.stdout.splitlines()
    assert lines[0].startswith("efficiency at the requested size") and \
        lines[2].startswith("static ")
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["policy"] == "static" and summary["speedup_model"] == "calibrated"
    assert summary["time_limits"] == "enforced" and summary["timed_out_jobs"] == 0
    assert 0.5 <= summary["efficiency_at_request"] <= 0.9
