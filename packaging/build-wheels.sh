#!/bin/bash
# Builds the user side's wheel, malleable-tf (docs/install.md section 9): malleable_runtime (the
# framework-neutral runtime and the launcher, the `malleable-srun` command), malleable_tf
# (TensorFlow's adapter), malleable_torch (PyTorch's), sbatch_templates (the job templates, the
# `malleable-sbatch` command) and the protocol they share with the node side. Installed into a user's environment beside the TensorFlow or PyTorch there: it requires
# neither (pip cannot say "tensorflow or tensorflow-cpu or a site build", and requiring one would
# install it beside, or over, another; a torch requirement would fetch a CUDA build of several GB
# over a CPU one); the extra [tensorflow] asks for TensorFlow's tested range. The native part
# of malleable_tf (malleable_tf/native) is compiled against the TensorFlow it runs with: on first
# use, or by `python -m malleable_tf.build` at install time, or here, once per TensorFlow the
# wheel is for: `--prebuilt PYTHON` (repeatable; the python of an environment that has that
# TensorFlow) puts the library built for it into the wheel (malleable_tf/native/prebuilt), which
# is then tagged for this platform (linux_x86_64): a job on a node without a compiler finds it.
# Without --prebuilt the wheel is pure Python. malleable_torch has no native part.
#   packaging/build-wheels.sh [--prebuilt PYTHON]... [OUT_DIR]   (default: dist/) -> OUT_DIR/malleable_tf-*.whl
# Needs python3 with pip, setuptools and wheel (the project's .venv has them), g++ for
# --prebuilt; no network.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
prebuilt=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) prebuilt+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
OUT=$(mkdir -p "${1:-$REPO/dist}" && cd "${1:-$REPO/dist}" && pwd)
PY=${PYTHON:-$([ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || echo python3)}
version=$(sed -n -E 's/^version = "([^"]+)"/\1/p' "$REPO/pyproject.toml" | head -1)
[ -n "$version" ] || { echo "[build-wheels] no version in pyproject.toml" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
copy() {   # copy SRC_PACKAGE DEST_FOLDER: the package's files, no caches
  (cd "$REPO" && find "$1" -name __pycache__ -prune -o -type f -print) | while read -r f; do
    install -D -m 0644 "$REPO/$f" "$work/$2/${f#"$1"/}"; done
}
copy malleable_tf malleable_tf
copy malleable_torch malleable_torch
copy malleable_protocol malleable_protocol
copy malleable_runtime malleable_runtime
copy sbatch_templates sbatch_templates
cp "$REPO/README.md" "$work/"
# The native library for each --prebuilt environment's TensorFlow, built from this copy (its
# name digests the sources it was built from), as `python -m malleable_tf.build` builds it.
for py in "${prebuilt[@]}"; do
  (cd "$work" && PYTHONPATH="$work" MALLEABLE_CACHE="$work/.cache" TF_CPP_MIN_LOG_LEVEL=2 \
     "$py" -m malleable_tf.build \
     --into "$work/malleable_tf/native/prebuilt") | sed 's/^/[build-wheels] /'
done
rm -rf "$work/.cache" "$work/malleable_tf/native/prebuilt/.build.lock"
cat > "$work/pyproject.toml" <<TOML
[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "malleable-tf"
version = "$version"
description = "TensorFlow and PyTorch threads that follow a Slurm job's cores as they grow and shrink"
readme = "README.md"
requires-python = ">=3.10"
license = { text = "Apache-2.0" }
dependencies = []

[project.optional-dependencies]
# The tested range (docs/user-guide.md, "TensorFlow versions tested"), for an environment that has none yet.
tensorflow = ["tensorflow>=2.15,<2.22"]
horovod = ["horovod==0.28.1"]

[project.scripts]
malleable-srun = "malleable_runtime.srun:main"
malleable-sbatch = "sbatch_templates.cli:main"

[tool.setuptools.packages.find]
include = ["malleable_tf*", "malleable_torch*", "malleable_runtime*", "malleable_protocol*",
           "sbatch_templates*"]

[tool.setuptools.package-data]
malleable_tf = ["native/*.cc", "native/*.h", "native/prebuilt/*"]
sbatch_templates = ["*.sbatch.tmpl"]
TOML
"$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$OUT" "$work" >/dev/null
if [ ${#prebuilt[@]} -gt 0 ]; then
  # Native code inside: this platform's wheel, not a pure one.
  pure="$OUT/malleable_tf-$version-py3-none-any.whl"
  "$PY" -m wheel tags --remove --platform-tag "linux_$(uname -m)" "$pure" >/dev/null
fi
ls "$OUT"/malleable_tf-"$version"-*.whl | sed 's/^/[build-wheels] /'
