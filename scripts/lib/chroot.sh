# A Debian chroot for the project's builds: sourced by vm-slurm/build-image.sh (the VMs' disk
# image) and scripts/build-slurm-smd.sh (SchedMD's packages).

# chroot_unmount ROOT: everything mounted under ROOT, deepest first (lazily: a mount still in use
# goes when its last user does).
chroot_unmount() {
  local root=$1 m
  [ -d "$root" ] || return 0
  { findmnt -rn -o TARGET | grep "^$root/" || true; } | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true; done
}

# debootstrap_minbase SUITE ROOT CACHE MIRROR LOG: a minbase Debian SUITE in ROOT, its packages
# kept in CACHE for the next build; LOG's last lines on failure.
debootstrap_minbase() {
  debootstrap --variant=minbase --cache-dir="$3" "$1" "$2" "$4" >"$5" 2>&1 \
    || { tail -30 "$5" >&2; return 1; }
}
