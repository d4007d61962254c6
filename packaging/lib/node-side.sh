# What both node packages hold (packaging/deb/build-deb.sh, packaging/rpm/build-rpm.sh), staged
# into a root folder the package tool then wraps. Sourced; needs bash, python3 and gcc.
#   slurm_release INCLUDE_DIR      -> 22.05: the release of the Slurm headers the plugin is built
#                                     against (slurm/slurm_version.h), whatever packaged them
#   next_release 22.05             -> 22.06: the first release the package must not meet
#   project_version REPO           -> 0.1.0: pyproject.toml's
#   stage_node_side ROOT SITE UNITS SHEBANG VERSION INSTALLER INCLUDE
#     ROOT/SITE: the Python packages (the co-scheduler, its policy, the protocol, the templates;
#     not the simulator, nor the development cluster) and their dist-info (VERSION, INSTALLER);
#     ROOT/usr/lib/malleable/malleable_spank.so, built here against the headers in INCLUDE (the
#     folder slurm_release read the release from); ROOT/usr/bin/malleable run by
#     SHEBANG; the systemd units in ROOT/UNITS; the install guide in ROOT/usr/share/doc.

slurm_release() {
  local header="${1:-/usr/include}/slurm/slurm_version.h" number
  number=$(sed -n -E 's/^#define SLURM_VERSION_NUMBER (0x[0-9a-fA-F]+).*/\1/p' "$header" 2>/dev/null)
  [ -n "$number" ] || return 1
  printf '%d.%02d\n' $(( (number >> 16) & 0xff )) $(( (number >> 8) & 0xff ))
}

next_release() {
  local major=${1%.*} minor=$((10#${1#*.}))
  printf '%s.%02d\n' "$major" $((minor + 1))
}

project_version() {
  local v
  v=$(sed -n -E 's/^version = "([^"]+)"/\1/p' "$1/pyproject.toml" | head -1)
  [ -n "$v" ] && echo "$v"
}

stage_node_side() {
  local root=$1 site=$1$2 units=$1$3 shebang=$4 version=$5 installer=$6 include=$7 repo pkg f info
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$site" "$root/usr/bin" "$root/usr/lib/malleable" "$units" \
           "$root/usr/share/doc/malleable-slurm"
  for pkg in slurm_plugin malleable_policy malleable_protocol sbatch_templates; do
    (cd "$repo" && find "$pkg" \( -name __pycache__ -o -path slurm_plugin/cluster \) -prune -o -type f \
       \( -name '*.py' -o -name '*.tmpl' -o -name '*.c' -o -name '*.service' \) -print) \
      | while read -r f; do install -D -m 0644 "$repo/$f" "$site/$f"; done
  done
  # Python's view of the package (importlib.metadata: `malleable --version`).
  info="$site/malleable_slurm-$version.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: malleable-slurm\nVersion: %s\n' "$version" > "$info/METADATA"
  echo "$installer" > "$info/INSTALLER"
  # The plugin, by the same build the install command runs (slurm_plugin.hooks.spank.build).
  python3 -I -B -c '
import sys; from pathlib import Path
sys.path.insert(0, sys.argv[1])
from slurm_plugin.hooks import spank
print("[node-side] built", spank.build(Path(sys.argv[2]), include=Path(sys.argv[3])))' \
    "$site" "$root/usr/lib/malleable" "$include"
  chmod 0644 "$root/usr/lib/malleable/malleable_spank.so"
  cat > "$root/usr/bin/malleable" <<PY
#!$shebang
# The node side's command (the malleable-slurm package; docs/install.md).
import sys

from slurm_plugin.commands.main import main

sys.exit(main())
PY
  chmod 0755 "$root/usr/bin/malleable"
  install -m 0644 "$repo/slurm_plugin/hooks/templates/malleable-agent@.service" \
                  "$repo/slurm_plugin/hooks/templates/malleable-watcher.service" "$units/"
  install -m 0644 "$repo/docs/install.md" "$root/usr/share/doc/malleable-slurm/install.md"
}
