#!/bin/bash
# Builds the Debian package of the node side, malleable-slurm (docs/install.md, "Build the
# package"): the co-scheduler (agent, watcher, hooks, the `malleable` command) for Debian's
# python3, and the SPANK plugin compiled here, once, against this host's libslurm-dev. A SPANK
# plugin loads only into the Slurm major release it was built for, so the package depends on
# that release (slurm-client >= X.Y, << the next) and its version says it (0.1.0+slurm22.05).
#   packaging/deb/build-deb.sh [OUT_DIR]     (default: dist/) -> OUT_DIR/malleable-slurm_*.deb
# Needs python3, gcc, libslurm-dev and dpkg-deb; runs as any user (--root-owner-group).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/dist}" && cd "${1:-$REPO/dist}" && pwd)
log() { echo "[build-deb] $*"; }
die() { echo "[build-deb] $*" >&2; exit 1; }

command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (a Debian or Ubuntu host builds this)"
command -v python3 >/dev/null || die "python3 is missing"
slurm=$(dpkg-query -W -f '${Version}' libslurm-dev 2>/dev/null) \
  || die "libslurm-dev is missing (apt-get install libslurm-dev gcc): the SPANK plugin is built against it"
# 22.05.8-4+deb12u3 -> 22.05; the next release 22.06 bounds the dependency.
release=$(echo "$slurm" | sed -E 's/^([0-9]+)\.([0-9]+).*/\1.\2/')
major=${release%.*}; minor=$((10#${release#*.}))
next="$major.$(printf %02d $((minor + 1)))"
project=$(sed -n -E 's/^version = "([^"]+)"/\1/p' "$REPO/pyproject.toml" | head -1)
[ -n "$project" ] || die "no version in $REPO/pyproject.toml"
version="$project+slurm$release"
arch=$(dpkg --print-architecture)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/root"
site="$root/usr/lib/python3/dist-packages"
mkdir -p "$site" "$root/usr/bin" "$root/usr/lib/malleable" "$root/lib/systemd/system" \
         "$root/usr/share/doc/malleable-slurm" "$root/DEBIAN"
# The node side's packages: the co-scheduler, its pure policy, the protocol it shares with jobs,
# the templates.
# Not the simulator (malleable_sim, `malleable-sim`): a research tool, not root's on every node.
# Nor the development cluster (slurm_plugin/cluster): docker-slurm's images carry it apart.
for pkg in slurm_plugin malleable_policy malleable_protocol sbatch_templates; do
  (cd "$REPO" && find "$pkg" \( -name __pycache__ -o -path slurm_plugin/cluster \) -prune -o -type f \
     \( -name '*.py' -o -name '*.tmpl' -o -name '*.c' -o -name '*.service' \) -print) \
    | while read -r f; do install -D -m 0644 "$REPO/$f" "$site/$f"; done
done
# Python's view of the package (importlib.metadata: `malleable --version`).
info="$site/malleable_slurm-$project+slurm$release.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: malleable-slurm\nVersion: %s\n' "$project+slurm$release" \
  > "$info/METADATA"
echo "dpkg" > "$info/INSTALLER"
# The plugin, by the same build the install command runs (slurm_plugin.hooks.spank.build).
python3 -I -B -c '
import sys; from pathlib import Path
sys.path.insert(0, sys.argv[1])
from slurm_plugin.hooks import spank
print("[build-deb] built", spank.build(Path(sys.argv[2])))' "$site" "$root/usr/lib/malleable"
chmod 0644 "$root/usr/lib/malleable/malleable_spank.so"
cat > "$root/usr/bin/malleable" <<'PY'
#!/usr/bin/python3 -I
# The node side's command (the malleable-slurm package; docs/install.md).
import sys

from slurm_plugin.commands.main import main

sys.exit(main())
PY
chmod 0755 "$root/usr/bin/malleable"
install -m 0644 "$REPO/slurm_plugin/hooks/templates/malleable-agent@.service" \
                "$REPO/slurm_plugin/hooks/templates/malleable-watcher.service" "$root/lib/systemd/system/"
install -m 0644 "$REPO/docs/install.md" "$root/usr/share/doc/malleable-slurm/install.md"
cat > "$root/usr/share/doc/malleable-slurm/copyright" <<'TXT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: malleable-hpc
Files: *
License: Apache-2.0
 On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.
TXT
size=$(du -sk "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CTRL
Package: malleable-slurm
Version: $version
Architecture: $arch
Maintainer: malleable-hpc developers <malleable-hpc@localhost>
Installed-Size: $size
Depends: python3 (>= 3.11), python3-prometheus-client, libmunge2, slurm-client (>= $release), slurm-client (<< $next)
Section: admin
Priority: optional
Description: malleable Slurm jobs: the node side (co-scheduler agent, watcher, hooks)
 Cores of a running Slurm job on a node grow and shrink; the job's TensorFlow thread
 pools follow (the user side, malleable_tf, is installed into users' environments).
 This package: the per-node agent, the cluster's feed watcher, the Prolog/Epilog and
 job_submit hooks, and the SPANK plugin (--malleable) built for Slurm $release.
 Nothing runs until a site configures it: see /usr/share/doc/malleable-slurm/install.md.
CTRL
cat > "$root/DEBIAN/postinst" <<'SH'
#!/bin/sh
set -e
# New or changed units; nothing is enabled or started: the site does (install.md).
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
cat > "$root/DEBIAN/prerm" <<'SH'
#!/bin/sh
set -e
# On removal (not on upgrade) the services stop; a node's lent cores go back at the next Prolog.
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop 'malleable-agent@*' malleable-watcher 2>/dev/null || true
fi
SH
cat > "$root/DEBIAN/postrm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SH
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
deb="$OUT/malleable-slurm_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
log "$deb (Slurm $slurm; depends on slurm-client >= $release, << $next)"
