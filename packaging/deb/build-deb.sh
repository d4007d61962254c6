#!/bin/bash
# Builds the Debian package of the node side, malleable-slurm (docs/install.md, "Build the
# package"): the co-scheduler (agent, watcher, hooks, the `malleable` command) for Debian's
# python3, and the SPANK plugin compiled here, once, against this host's libslurm-dev. A SPANK
# plugin loads only into the Slurm major release it was built for, so the package depends on
# that release (Debian's slurm-client or SchedMD's slurm-smd-client, >= X.Y and < the next; the
# upper bound as Breaks) and its version says it (0.1.0+slurm22.05).
#   packaging/deb/build-deb.sh [OUT_DIR]     (default: dist/) -> OUT_DIR/malleable-slurm_*.deb
# SLURM_INCLUDE=DIR builds against the Slurm headers in DIR/slurm instead of /usr/include's: the
# package for the release a site upgrades to, built before its hosts have it (docs/install.md).
# Needs python3, gcc, Slurm's headers (libslurm-dev, or slurm-smd-dev) and dpkg-deb; runs as any
# user (--root-owner-group). What it holds is staged by packaging/lib/node-side.sh (the RPM's too).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/dist}" && cd "${1:-$REPO/dist}" && pwd)
log() { echo "[build-deb] $*"; }
die() { echo "[build-deb] $*" >&2; exit 1; }

command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (a Debian or Ubuntu host builds this)"
command -v python3 >/dev/null || die "python3 is missing"
# shellcheck source=../lib/node-side.sh
source "$REPO/packaging/lib/node-side.sh"
INCLUDE=${SLURM_INCLUDE:-/usr/include}
release=$(slurm_release "$INCLUDE") \
  || die "no Slurm headers in $INCLUDE/slurm (apt-get install libslurm-dev gcc): the SPANK plugin is built against them"
next=$(next_release "$release")
project=$(project_version "$REPO") || die "no version in $REPO/pyproject.toml"
version="$project+slurm$release"
arch=$(dpkg --print-architecture)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/root"
mkdir -p "$root/DEBIAN"
stage_node_side "$root" /usr/lib/python3/dist-packages /lib/systemd/system \
  "/usr/bin/python3 -I" "$version" dpkg "$INCLUDE"
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
Depends: python3 (>= 3.11), python3-prometheus-client, libmunge2, slurm-client (>= $release) | slurm-smd-client (>= $release)
Breaks: slurm-client (>= $next), slurm-smd-client (>= $next)
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
log "$deb (built against Slurm $release's headers; needs Debian's slurm-client or SchedMD's slurm-smd-client, >= $release, << $next)"
