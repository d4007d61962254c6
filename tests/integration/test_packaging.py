"""Installing the project into an environment that already has TensorFlow 2.21 (.venv-keras3,
made by scripts/setup.sh --keras3) installs the project alone: no TensorFlow replaced or
downgraded, nothing fetched (pip runs with --no-index)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERAS3_PY = REPO / ".venv-keras3" / "bin" / "python"


def test_installing_beside_tensorflow_2_21_replaces_nothing(tmp_path):
    assert KERAS3_PY.exists(), "the Keras 3 environment is missing: scripts/setup.sh --keras3"
    before = subprocess.run([str(KERAS3_PY), "-c", "import tensorflow as tf; "
                             "print(tf.__version__)"], capture_output=True, text=True,
                            check=True).stdout.strip()
    report = tmp_path / "report.json"
    subprocess.run([str(KERAS3_PY), "-m", "pip", "install", "--dry-run", "--no-index",
                    "--no-build-isolation", "--quiet", "--report", str(report), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=300)
    installs = [(i["metadata"]["name"], i["metadata"]["version"])
                for i in json.loads(report.read_text())["install"]]
    assert [name for name, _ in installs] == ["malleable-hpc"], installs
    assert before.startswith("2.21"), before
