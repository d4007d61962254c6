# need_packages TAG PKG...: apt-get install those of Debian's packages that are not installed
# (with `apt-get update` first when the package lists do not have them). Sourced by
# docker-slurm/engine.sh and vm-slurm/build-image.sh; TAG prefixes what it prints. Both may run at
# once (scripts/ci.sh's lanes): apt-get waits for the other's lock instead of failing.
need_packages() {
  local tag=$1 missing=() p wait=(-o DPkg::Lock::Timeout=600)
  shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[$tag] apt-get install ${missing[*]}"
    local -x DEBIAN_FRONTEND=noninteractive
    apt-get "${wait[@]}" install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
      { apt-get "${wait[@]}" update -q >/dev/null &&
        apt-get "${wait[@]}" install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
  fi
}
