#!/bin/bash
# Builds the RPM of the node side, malleable-slurm, for RHEL 9 and its rebuilds (Rocky, Alma):
# the same files as the Debian package (packaging/lib/node-side.sh), for RHEL's python3.11 (its
# python3 is 3.9; the node side needs 3.11 or newer), the SPANK plugin compiled here against the
# Slurm headers found (SchedMD's slurm-devel, or libslurm-dev where rpmbuild runs on Debian).
# A SPANK plugin loads only into the Slurm release it was built for: the package requires that
# release of SchedMD's RPMs (slurm >= X.Y with slurm < the next) and its version says it.
#   packaging/rpm/build-rpm.sh [OUT_DIR]   (default: dist/) -> OUT_DIR/malleable-slurm-*.rpm
# Needs rpmbuild, python3, gcc and Slurm's headers. PYTHON_VERSION=3.12 builds for python3.12.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/dist}" && cd "${1:-$REPO/dist}" && pwd)
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
INCLUDE=${SLURM_INCLUDE:-/usr/include}
log() { echo "[build-rpm] $*"; }
die() { echo "[build-rpm] $*" >&2; exit 1; }

command -v rpmbuild >/dev/null || die "rpmbuild is missing (dnf install rpm-build; apt-get install rpm)"
case "$PYTHON_VERSION" in 3.1[1-9]) ;; *) die "PYTHON_VERSION must be 3.11 or newer" ;; esac
# shellcheck source=../lib/node-side.sh
source "$REPO/packaging/lib/node-side.sh"
release=$(slurm_release "$INCLUDE") \
  || die "no Slurm headers in $INCLUDE/slurm (slurm-devel): the SPANK plugin is built against them"
next=$(next_release "$release")
project=$(project_version "$REPO") || die "no version in $REPO/pyproject.toml"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/stage"
# RPM versions take no "+": the Slurm release goes into the release field (1.slurm22.05).
stage_node_side "$root" "/usr/lib/python$PYTHON_VERSION/site-packages" /usr/lib/systemd/system \
  "/usr/bin/python$PYTHON_VERSION -I" "$project+slurm$release" rpm "$INCLUDE"
# The files, and the folders that are the package's own (erased with it).
site="/usr/lib/python$PYTHON_VERSION/site-packages"
{ (cd "$root" && find . -type f -o -type l) | sed 's/^\.//'
  (cd "$root" && find ".$site"/* ./usr/lib/malleable ./usr/share/doc/malleable-slurm -type d) \
    | sed -e 's/^\.//' -e 's/^/%dir /'
} | sort -u > "$work/files"
mkdir -p "$work/rpmbuild/SPECS"
cat > "$work/rpmbuild/SPECS/malleable-slurm.spec" <<SPEC
Name:           malleable-slurm
Version:        $project
Release:        1.slurm$release
Summary:        malleable Slurm jobs: the node side (co-scheduler agent, watcher, hooks)
License:        Apache-2.0
URL:            https://github.com/malleable-hpc/malleable-hpc
Requires:       python$PYTHON_VERSION
Requires:       munge-libs
Requires:       (slurm >= $release with slurm < $next)
%global debug_package %{nil}
%global __os_install_post %{nil}
%global _build_id_links none

%description
Cores of a running Slurm job on a node grow and shrink; the job's TensorFlow thread pools
follow (the user side, malleable_tf, is installed into users' environments). This package:
the per-node agent, the cluster's feed watcher, the Prolog/Epilog and job_submit hooks, and
the SPANK plugin (--malleable) built for Slurm $release. Nothing runs until a site configures
it: see /usr/share/doc/malleable-slurm/install.md. Metrics (--metrics-port) need
prometheus_client for Python $PYTHON_VERSION, which the package does not require.

%install
mkdir -p %{buildroot}
cp -a $root/. %{buildroot}/

%post
if [ -d /run/systemd/system ]; then systemctl daemon-reload || :; fi

%preun
# On removal (not on upgrade) the services stop; a node's lent cores go back at the next Prolog.
if [ \$1 -eq 0 ] && [ -d /run/systemd/system ]; then
  systemctl stop 'malleable-agent@*' malleable-watcher 2>/dev/null || :
fi

%postun
if [ -d /run/systemd/system ]; then systemctl daemon-reload || :; fi

%files
%defattr(-,root,root,-)
$(cat "$work/files")
SPEC
rpmbuild -bb --quiet --define "_topdir $work/rpmbuild" --define "_rpmdir $OUT" \
  --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
  "$work/rpmbuild/SPECS/malleable-slurm.spec" >"$work/rpmbuild.log" 2>&1 \
  || { tail -20 "$work/rpmbuild.log" >&2; die "rpmbuild failed"; }
rpm=$(ls "$OUT"/malleable-slurm-"$project"-1.slurm"$release".*.rpm)
log "$rpm (built against Slurm $release's headers; requires slurm >= $release, < $next, python$PYTHON_VERSION)"
