#!/usr/bin/env bash
# Build Slurm from Debian's own source package (Debian's patches applied) the way SchedMD's
# packages and most sites run it: WITHOUT --enable-multiple-slurmd. Its job cgroups are then the
# production layout (/sys/fs/cgroup/cpuset/slurm/uid_U/job_J/step_S on cgroup v1,
# system.slice/slurmstepd.scope on v2) instead of Debian's slurm_<node> / <node>_slurmstepd.scope.
#   SLURM_SUITE=bookworm   22.05.8 (default; the local cluster's tests/site)
#   SLURM_SUITE=trixie     24.11.5 (vm-slurm's SLURM_BUILD=production image, built in its chroot)
#
# It is installed into a prefix of its own (Debian's slurm packages are not touched):
# PREFIX/{bin,sbin,lib/slurm-wlm,etc}. Run as root (apt). Idempotent: the whole install is
# cached, a second run returns at once when PREFIX/.build-stamp names the same Slurm version and
# the same hash of this script.
#
#   PREFIX           (default /opt/malleable/slurm-production-<version>)
#   SYSCONFDIR       where it reads slurm.conf (default PREFIX/etc)
#   RUNSTATEDIR      where its daemons keep their run-time files, a configless slurmd its copy of
#                    the configuration (default PREFIX/var/run; Debian's build: /run)
#   MALLEABLE_CACHE  (default $HOME/.cache/malleable): the source is downloaded into
#                    $MALLEABLE_CACHE/slurm-production/, the build tree lives there while building
#   JOBS             make -j (default 2)
#   KEEP_BUILD=1     keep the build tree after a successful install (default: removed)
#
# The source: the suite's Sources index as apt fetched and verified it (a deb-src entry for the
# suite, and for its security suite where it has one; added when missing), the orig and debian
# tarballs downloaded from the pool of a deb-src repository and checked against the index's
# SHA-256, Debian's patches applied in their series' order (what dpkg-source -x does; the .dsc
# itself is not needed: trixie's is not on the mirrors).
#
# Build dependencies: a minimal explicit list, not `apt-get build-dep slurm-wlm` (on a machine
# with Debian's slurm already installed that would install 119 packages and upgrade 23 others,
# for GTK, MySQL, HDF5, RRD, IPMI, ROCm, PAM, Perl ... which this build leaves out).
set -euo pipefail

SUITE="${SLURM_SUITE:-bookworm}"
ARCH="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine)"
BUILD_DEPS=(build-essential pkg-config dpkg-dev xz-utils patch
            autoconf automake libtool   # autoreconf, as Debian's dh does: two Debian patches
                                        # change configure.ac / Makefile.am
            libmunge-dev munge          # auth/munge, cred/munge (+ munged to run it)
            liblua5.1-0-dev             # job_submit/lua, cli_filter/lua (Debian's lua version)
            libjson-c-dev               # serializer/json: squeue --json, sinfo --json
            libdbus-1-dev               # cgroup/v2 is only built with dbus (and linux/bpf.h)
            linux-libc-dev              # linux/bpf.h for cgroup/v2
            libhwloc-dev                # task/affinity, node topology (as Debian's build)
            libpmix-dev                 # mpi/pmix (Debian's PMIx; in .../pmix2 in both suites)
            python3)                    # the source download; 24.11's make runs it for its docs
# The plugins the build must have (a missing library silently drops one).
REQUIRED=(auth_munge cred_munge cgroup_v1 cgroup_v2 task_cgroup task_affinity proctrack_cgroup
          select_cons_tres sched_backfill job_submit_lua cli_filter_lua serializer_json mpi_pmix)
EXTRA_CONFIGURE=()
case "$SUITE" in
  bookworm) SLURM_VERSION=22.05.8
            REQUIRED+=(openapi_v0_0_38) ;;
  trixie)   SLURM_VERSION=24.11.5
            # cgroup/v2 or a failed configure (by default a missing dbus drops it silently)
            EXTRA_CONFIGURE=(--enable-cgroupv2 --disable-sview)
            REQUIRED+=(data_parser_v0_0_41) ;;
  *) echo "[slurm-production] SLURM_SUITE=$SUITE: bookworm (22.05.8) or trixie (24.11.5)" >&2
     exit 1 ;;
esac
PREFIX="${PREFIX:-/opt/malleable/slurm-production-$SLURM_VERSION}"
SYSCONFDIR="${SYSCONFDIR:-$PREFIX/etc}"
CACHE="${MALLEABLE_CACHE:-${HOME}/.cache/malleable}/slurm-production"
JOBS="${JOBS:-2}"
STAMP="$PREFIX/.build-stamp"
MARKER="$PREFIX/.malleable-slurm-production"   # says PREFIX is ours (safe to wipe on rebuild)
SCRIPT="$(readlink -f "${BASH_SOURCE[0]}")"
LIB="$(dirname "$SCRIPT")/lib/slurm-source.sh"
# shellcheck source=lib/slurm-source.sh
source "$LIB"
SCRIPT_SHA="$(cat "$SCRIPT" "$LIB" | sha256sum | cut -d' ' -f1)"

CONFIGURE_ARGS=(--prefix="$PREFIX" --sysconfdir="$SYSCONFDIR"
                --disable-debug --disable-static --disable-dependency-tracking
                --with-munge --with-json --with-hwloc
                --with-pmix="/usr/lib/$ARCH/pmix2"
                --disable-slurmrestd --without-jwt --without-http-parser --without-yaml
                --without-mysql_config --with-hdf5=no --without-rrdtool --without-freeipmi
                --without-nvml --without-rsmi --with-oneapi=no --without-ucx --without-lz4
                --without-netloc --without-ofed --without-datawarp
                "${EXTRA_CONFIGURE[@]}" ${RUNSTATEDIR:+--runstatedir="$RUNSTATEDIR"}
                SUCMD=/bin/su SLEEP_CMD=/bin/sleep)

T0=$EPOCHREALTIME
step_name=""
step_start=$T0
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
step() { step_name="$1"; step_start=$EPOCHREALTIME; printf '[slurm-production] %s ...\n' "$1"; }
done_step() { printf '[slurm-production] %s: done in %ss\n' "$step_name" "$(since "$step_start")"; }
trap 'rc=$?; [ $rc -ne 0 ] && printf "[slurm-production] FAILED at step: %s (exit %s)\n" "$step_name" "$rc" >&2' EXIT

# ---- the cached install: a stamp with the same version and script hash means nothing to do ----
stamp_ok() {
  [ -f "$STAMP" ] && [ -x "$PREFIX/sbin/slurmd" ] \
    && grep -qx "version=$SLURM_VERSION" "$STAMP" \
    && grep -qx "script_sha256=$SCRIPT_SHA" "$STAMP"
}
if stamp_ok; then
  printf '[slurm-production] cached: %s (%s) in %ss\n' "$PREFIX" \
    "$(grep '^debian_version=' "$STAMP" | cut -d= -f2)" "$(since "$T0")"
  trap - EXIT
  exit 0
fi

[ "$(id -u)" = 0 ] || { echo "[slurm-production] must run as root (apt-get, make install into $PREFIX)" >&2; exit 1; }
mkdir -p "$CACHE"
# One build at a time (another session may run this script too); re-check the stamp once in.
exec 9>"$CACHE/.lock"
flock 9
if stamp_ok; then
  printf '[slurm-production] cached (built by a concurrent run): %s\n' "$PREFIX"; trap - EXIT; exit 0
fi
export DEBIAN_FRONTEND=noninteractive

# ---- 1. build dependencies (a minimal explicit list) ----
step "build dependencies (${BUILD_DEPS[*]})"
missing=()
for p in "${BUILD_DEPS[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[slurm-production] installing: ${missing[*]}"
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[slurm-production] all present"
fi
done_step

# ---- 2. deb-src entries for the suite (and its security suite) ----
step "deb-src entries for $SUITE"
slurm_deb_src slurm-production "$SUITE"
done_step

# ---- 3. the source (orig and debian tarballs, checked) with Debian's patches ----
step "slurm-wlm $SLURM_VERSION's source into $CACHE, Debian's patches applied"
DEB_VERSION=$(slurm_source_fetch slurm-production "$SLURM_VERSION" "$CACHE")
BUILD="$CACHE/build-$DEB_VERSION"
rm -rf "$BUILD"
mkdir -p "$BUILD"
tar -xf "$CACHE/slurm-wlm_$SLURM_VERSION.orig.tar."* -C "$BUILD" --strip-components=1
tar -xf "$CACHE/slurm-wlm_$DEB_VERSION.debian.tar."* -C "$BUILD"
# 3.0 (quilt): debian/patches/series, in order; a line may carry patch's -pN.
applied=0
while read -r name opt; do
  case "$name" in ''|'#'*) continue ;; esac
  patch -s -d "$BUILD" ${opt:--p1} --no-backup-if-mismatch < "$BUILD/debian/patches/$name"
  applied=$((applied + 1))
done < "$BUILD/debian/patches/series"
echo "[slurm-production] $DEB_VERSION: $applied Debian patches applied"
grep -q -- '--enable-multiple-slurmd' "$BUILD/debian/rules" \
  && echo "[slurm-production] (debian/rules uses --enable-multiple-slurmd; this build does not)"
done_step

# ---- 4. autoreconf (what dh_autoreconf does in Debian's build) ----
# Debian's patches "rpath" (private libs and plugins in lib/slurm-wlm, package name slurm-wlm) and
# "miscellanea-manpages" (slurm.1 -> slurm.7) edit configure.ac and Makefile.am: without this
# step the shipped configure still lists doc/man/man1/slurm.1 and make fails there. configure.ac
# calls glib's and gtk's m4 macros (for sview); stubs that take the "not found" branch stand in
# for libglib2.0-dev/libgtk2.0-dev, so sview is not built.
step "autoreconf -fi"
mkdir -p "$BUILD/m4-stubs"
cat > "$BUILD/m4-stubs/no-gtk.m4" <<'M4'
AC_DEFUN([AM_PATH_GLIB_2_0], [$3])
AC_DEFUN([AM_PATH_GTK_2_0], [$3])
M4
(cd "$BUILD" && autoreconf -fi -I m4-stubs > "$BUILD/autoreconf.out" 2>&1) \
  || { tail -30 "$BUILD/autoreconf.out" >&2; exit 1; }
done_step

# ---- 5. configure ----
step "configure"
CONFIGURE_LINE="./configure ${CONFIGURE_ARGS[*]}"
echo "[slurm-production] $CONFIGURE_LINE"
(cd "$BUILD" && ./configure -q "${CONFIGURE_ARGS[@]}" > "$BUILD/configure.out" 2>&1) \
  || { tail -30 "$BUILD/configure.out" >&2; echo "(full log: $BUILD/config.log)" >&2; exit 1; }
grep -E 'WARNING' "$BUILD/configure.out" | sort -u | sed 's/^/[slurm-production]   /' || true
if grep -q '^#define MULTIPLE_SLURMD' "$BUILD/config.h"; then
  echo "[slurm-production] MULTIPLE_SLURMD is defined: not a production build" >&2; exit 1
fi
for need in HAVE_LUA HAVE_JSON HAVE_PMIX HAVE_HWLOC HAVE_BPF; do
  grep -q "^#define $need 1" "$BUILD/config.h" || echo "[slurm-production]   note: $need not defined"
done
done_step

# ---- 6. make ----
step "make -j$JOBS"
(cd "$BUILD" && make -s -j"$JOBS" > "$BUILD/make.out" 2>&1) \
  || { tail -40 "$BUILD/make.out" >&2; exit 1; }
done_step

# ---- 7. make install into PREFIX (a fresh one) ----
step "make install into $PREFIX"
if [ -e "$PREFIX" ]; then
  if [ -e "$MARKER" ] || [ -z "$(ls -A "$PREFIX")" ]; then
    rm -rf "$PREFIX"
  else
    echo "[slurm-production] $PREFIX exists and was not made by this script: not overwriting" >&2
    exit 1
  fi
fi
mkdir -p "$PREFIX"
touch "$MARKER"
(cd "$BUILD" && make -s install > "$BUILD/install.out" 2>&1) || { tail -40 "$BUILD/install.out" >&2; exit 1; }
mkdir -p "$PREFIX/etc"
find "$PREFIX/lib" -name '*.la' -delete   # libtool archives: not needed at run time (Debian drops them too)
done_step

# ---- 8. check what the build must have, then the stamp ----
step "check plugins and binaries"
# Private libslurmfull and the plugins: lib/slurm-wlm (Debian's rpath patch), lib/slurm upstream.
PLUGDIR="$(dirname "$(find "$PREFIX/lib" -name libslurmfull.so | head -1)")"
absent=()
for p in "${REQUIRED[@]}"; do [ -e "$PLUGDIR/$p.so" ] || absent+=("$p"); done
if [ ${#absent[@]} -gt 0 ]; then
  echo "[slurm-production] missing plugins: ${absent[*]}" >&2; exit 1
fi
version_out="$("$PREFIX/sbin/slurmd" -V)"
# "slurm-wlm 22.05.8": Debian's rpath patch renames the autoconf package (Debian's slurmd says so too)
case "$version_out" in "slurm $SLURM_VERSION" | "slurm-wlm $SLURM_VERSION") ;; *) false ;; esac || { echo "[slurm-production] slurmd -V says: $version_out" >&2; exit 1; }
# Its own libslurm (rpath), not Debian's /usr/lib/$ARCH/libslurm.so
ldd_out="$(ldd "$PREFIX/bin/squeue")"
grep -qF "$PLUGDIR/libslurmfull.so" <<<"$ldd_out" \
  || { echo "[slurm-production] squeue does not load $PLUGDIR/libslurmfull.so:" >&2; ldd "$PREFIX/bin/squeue" >&2; exit 1; }
echo "[slurm-production] $version_out; plugins in $PLUGDIR: ${#REQUIRED[@]} required present, $(ls "$PLUGDIR"/*.so | wc -l) in all"
done_step

{
  echo "version=$SLURM_VERSION"
  echo "debian_version=$DEB_VERSION"
  echo "script_sha256=$SCRIPT_SHA"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "configure=$CONFIGURE_LINE"
} > "$STAMP.tmp"
mv "$STAMP.tmp" "$STAMP"
if [ "${KEEP_BUILD:-0}" != 1 ]; then rm -rf "$BUILD"; fi
printf '[slurm-production] installed %s (%s, %s) in %ss\n' "$PREFIX" "$DEB_VERSION" \
  "$(du -sh "$PREFIX" | cut -f1)" "$(since "$T0")"
trap - EXIT
