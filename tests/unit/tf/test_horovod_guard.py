"""``malleable_tf.horovod.init()`` refuses Keras 3, where Horovod does not average gradients
(docs/FACTS.md), and on Keras 2 goes on to ``hvd.init()`` and ``malleable_tf.init()`` as before.

Runs in both environments: .venv (TensorFlow 2.15, Keras 2, Horovod) and .venv-keras3
(TensorFlow 2.21, Keras 3, no Horovod). The Keras version is the real one: each probe imports
TensorFlow in an interpreter of its own (so that this process stays without TensorFlow).
Horovod is the real one where it is absent (the refusal must come before its import) and a
stand-in otherwise, as is ``malleable_tf.init()`` (no MPI ranks, no native library here).
"""
import json
import os
import subprocess
import sys
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
KERAS = version("keras")                    # what this environment installed: the oracle
KERAS3 = int(KERAS.split(".")[0]) >= 3
HOROVOD = find_spec("horovod") is not None

PROBE = r"""
import json, sys, types
import malleable_tf.horovod as mh
import tensorflow as tf

def attempt():
    try:
        return {"returned": mh.init(2, follow=False)}
    except Exception as exc:
        return {"raised": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}

out = {"found": mh.keras_version(), "tf": tf.__version__}
if "real" in sys.argv:        # Horovod as installed (only where it is not: no MPI here)
    out["real"] = attempt()
calls = []
hvd = types.ModuleType("horovod.tensorflow")
hvd.init = lambda: calls.append("hvd.init")
hvd.rank, hvd.local_rank, hvd.local_size = (lambda: 3), (lambda: 1), (lambda: 2)
pkg = types.ModuleType("horovod")
pkg.__path__, pkg.tensorflow = [], hvd
sys.modules["horovod"], sys.modules["horovod.tensorflow"] = pkg, hvd
mh._init = lambda max_threads=None, **kw: calls.append(["malleable_tf.init", max_threads, kw]) or "state"
out["faked"] = attempt()
out["calls"] = calls
print(json.dumps(out))
"""


def probe(*args, **env) -> dict:
    """Run PROBE in a fresh interpreter; ``env`` on top of this one's (TF_USE_LEGACY_KERAS
    only when given)."""
    base = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**base, "TF_CPP_MIN_LOG_LEVEL": "3", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probed():
    return probe(*(() if HOROVOD else ("real",)))


def test_keras_version_is_the_installed_keras(probed):
    assert probed["found"] == ["keras", KERAS]


@pytest.mark.skipif(not KERAS3, reason="Keras 2 here")
def test_keras3_stops_before_horovod_starts(probed):
    refused = probed["faked"]
    assert refused["raised"][:3] == ["KerasVersionError", "MalleableError", "RuntimeError"]
    assert probed["calls"] == []   # neither hvd.init() nor malleable_tf.init() ran
    message = refused["message"]
    for words in (f"Keras 3 (keras {KERAS}, TensorFlow {probed['tf']})",
                  "Horovod does not average gradients with Keras 3",
                  "Stopping instead of training wrong", "tensorflow-cpu==2.15.1, horovod==0.28.1",
                  "tf_keras", "TF_USE_LEGACY_KERAS=1", "tf.distribute.MultiWorkerMirroredStrategy"):
        assert words in message, message


@pytest.mark.skipif(not KERAS3 or HOROVOD, reason="needs Keras 3 without Horovod")
def test_keras3_without_horovod_installed_gets_the_reason_not_an_import_error(probed):
    assert probed["real"]["raised"][0] == "KerasVersionError", probed["real"]


@pytest.mark.skipif(not KERAS3, reason="Keras 2 here")
def test_keras3_is_refused_when_tf_keras_cannot_load():
    # TF_USE_LEGACY_KERAS=1 without tf_keras installed: tf.keras cannot load, and the Keras
    # a script can use is the keras package, Keras 3.
    assert find_spec("tf_keras") is None
    probed = probe(TF_USE_LEGACY_KERAS="1")
    assert probed["found"] == ["keras", KERAS]
    assert probed["faked"]["raised"][0] == "KerasVersionError"
    assert probed["calls"] == []


@pytest.mark.skipif(KERAS3, reason="Keras 3 here")
def test_keras2_goes_on_to_horovod_then_malleable_tf(probed):
    assert probed["faked"] == {"returned": "state"}
    assert probed["calls"] == ["hvd.init",
                               ["malleable_tf.init", 2, {"local_rank": 1, "local_size": 2,
                                                         "rank": 3, "follow": False}]]


@pytest.mark.horovod
@pytest.mark.skipif(KERAS3 or not HOROVOD, reason="needs Keras 2 and Horovod")
def test_keras2_real_horovod_init_as_one_rank():
    """The whole path, nothing faked: Horovod as an MPI singleton (no launcher), then the
    runtime with its native library (built by scripts/setup.sh, cached)."""
    code = ("import json, malleable_tf.horovod as mh\n"
            "s = mh.init(max_threads=2, follow=False)\n"
            "import horovod.tensorflow as hvd\n"
            "print(json.dumps([s.intra_pool, s.intra_active, hvd.is_initialized(), hvd.size()]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2, 2, True, 1]
