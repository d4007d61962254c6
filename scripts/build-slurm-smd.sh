#!/usr/bin/env bash
# SchedMD's own Debian packages of Slurm (slurm-smd, slurm-smd-client, slurm-smd-dev,
# slurm-smd-slurmctld, slurm-smd-slurmd, ...), built the way their source's debian/ builds them,
# for the test of our package beside them (tests/smd). Debian's packages of Slurm conflict with
# them (slurm-smd-client: Conflicts: slurm-client).
#
# The source: the upstream tarball Debian's pool carries for trixie's slurm-wlm (24.11.5, whose
# orig tarball is SchedMD's tag slurm-24-11-5-1 with their debian/ inside), fetched and checked
# against trixie's Sources index as scripts/lib/slurm-source.sh does; Debian's own packaging and
# patches are not used. Built in a bookworm chroot (debootstrap) with SchedMD's Build-Depends
# (GTK, HDF5, MariaDB, Perl, ...), so none of them lands on the host. Run as root.
#
#   OUT    (default /var/tmp/slurm-smd): OUT/debs/*.deb and OUT/stamp; cached: a second run
#          returns at once when the stamp names this version and this script's (and lib's) hash
#   MIRROR (default http://deb.debian.org/debian)
#   JOBS   (default nproc)
set -euo pipefail
SLURM_VERSION=24.11.5
SOURCE_SUITE=trixie       # whose pool holds the tarball
CHROOT_SUITE=bookworm     # the build's Debian (SchedMD builds per distribution)
OUT=${OUT:-/var/tmp/slurm-smd}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
JOBS=${JOBS:-$(nproc)}
HERE="$(dirname "$(readlink -f "$0")")"
LIB="$HERE/lib/slurm-source.sh"
KEY=$(cat "$0" "$LIB" "$HERE/lib/chroot.sh" | sha256sum | cut -c1-16)
STAMP="$OUT/stamp"
log() { echo "[slurm-smd] $*"; }

[ "$(id -u)" = 0 ] || { echo "[slurm-smd] must run as root (debootstrap, chroot)" >&2; exit 1; }
mkdir -p "$OUT/apt-cache"
exec 9>"$OUT/.lock"
flock 9
if grep -qx "key=$KEY version=$SLURM_VERSION" "$STAMP" 2>/dev/null && ls "$OUT"/debs/*.deb >/dev/null 2>&1; then
  log "cached: $(ls "$OUT"/debs/*.deb | wc -l) packages in $OUT/debs ($(sed -n 2p "$STAMP"))"
  exit 0
fi
# shellcheck source=lib/need-packages.sh
source "$HERE/lib/need-packages.sh"
# shellcheck source=lib/chroot.sh
source "$HERE/lib/chroot.sh"
need_packages slurm-smd debootstrap

start=$(date +%s)
root="$OUT/root"
cleanup() { chroot_unmount "$root"; rm -rf "$root"; }
trap cleanup EXIT
cleanup
rm -f "$STAMP"

log "debootstrap $CHROOT_SUITE (minbase) into $root"
debootstrap_minbase "$CHROOT_SUITE" "$root" "$OUT/apt-cache" "$MIRROR" "$OUT/debootstrap.log"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind "$OUT/apt-cache" "$root/var/cache/apt/archives"
in_root() { LC_ALL=C DEBIAN_FRONTEND=noninteractive chroot "$root" "$@"; }
echo "deb $MIRROR $CHROOT_SUITE main" > "$root/etc/apt/sources.list"
mkdir -p "$root/build/lib"
cp "$LIB" "$root/build/lib/slurm-source.sh"
in_root apt-get update -q >"$OUT/build.log" 2>&1
in_root apt-get install -y -q --no-install-recommends python3 dpkg-dev >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log" >&2; exit 1; }

log "slurm-wlm $SLURM_VERSION's upstream tarball from $SOURCE_SUITE's pool (checked against its Sources index)"
deb_version=$(in_root bash -c "set -euo pipefail; source /build/lib/slurm-source.sh
  slurm_deb_src slurm-smd $SOURCE_SUITE; slurm_source_fetch slurm-smd $SLURM_VERSION /build" \
  2>>"$OUT/build.log") || { tail -30 "$OUT/build.log" >&2; exit 1; }
src="/build/slurm-$SLURM_VERSION"
mkdir -p "$root$src"
tar -xf "$root/build/slurm-wlm_$SLURM_VERSION.orig.tar."* -C "$root$src" --strip-components=1
[ -f "$root$src/debian/control" ] || { echo "[slurm-smd] the tarball of $deb_version has no debian/ of SchedMD's" >&2; exit 1; }
log "$(grep -m1 '^Source:' "$root$src/debian/control") $(head -1 "$root$src/debian/changelog" | cut -d' ' -f2) from slurm-wlm $deb_version's tarball"

log "SchedMD's Build-Depends (apt-get build-dep on their debian/control)"
in_root bash -c "cd $src && apt-get build-dep -y -q --no-install-recommends ./" >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log" >&2; exit 1; }

log "dpkg-buildpackage -b (-j$JOBS)"
t=$(date +%s)
in_root bash -c "cd $src && dpkg-buildpackage -b -uc -us -j$JOBS" >>"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log" >&2; exit 1; }
log "built in $(( $(date +%s) - t ))s"

rm -rf "$OUT/debs"
mkdir -p "$OUT/debs"
cp "$root"/build/*.deb "$OUT/debs/"
printf 'key=%s version=%s\n%s, %s packages, built %s\n' "$KEY" "$SLURM_VERSION" "$deb_version" \
  "$(ls "$OUT"/debs/*.deb | wc -l)" "$(date -u +%FT%TZ)" > "$STAMP"
log "$(ls "$OUT"/debs/*.deb | wc -l) packages in $OUT/debs in $(( $(date +%s) - start ))s:" \
  "$(cd "$OUT/debs" && ls -- *.deb | cut -d_ -f1 | paste -sd' ')"
