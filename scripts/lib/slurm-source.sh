# Debian's source of slurm-wlm, as apt verified its index: sourced by
# scripts/build-slurm-production.sh (Debian's source built without multiple-slurmd) and
# scripts/build-slurm-smd.sh (SchedMD's own packages from the upstream tarball Debian carries).
# Run as root (apt). Both functions print progress on stderr prefixed with [TAG].

# slurm_deb_src TAG SUITE: deb-src entries for SUITE (and its security suite, where trixie's
# slurm-wlm is) unless apt has them, then `apt-get update`.
slurm_deb_src() {
  local tag=$1 suite=$2 want=() missing=() w uri key file
  src_suites() { apt-get indextargets --format '$(RELEASE)' 'Created-By: Sources' 2>/dev/null | sort -u; }
  want=("$suite")
  # trixie's slurm-wlm is a security update (24.11.5-4+deb13u1): its debian tarball is in that pool.
  [ "$suite" = bookworm ] || want+=("$suite-security")
  for w in "${want[@]}"; do src_suites | grep -qx "$w" || missing+=("$w"); done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "[$tag] deb-src entries for ${want[*]} exist" >&2
    return 0
  fi
  # The URI of the suite's binary entry (one-line or deb822), Debian's own otherwise; and its
  # Signed-By (apt refuses two entries of one URI and suite whose keys differ).
  uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null \
        | awk -v s="$suite" '$2 == s { print $1; exit }')
  uri=${uri:-http://deb.debian.org/debian/}
  key=$({ cat /etc/apt/sources.list.d/*.sources 2>/dev/null || :; } | awk -v s="$suite" 'BEGIN { RS = "" }
          $0 ~ ("Suites:[^\n]*[ \t]" s "([ \t\n]|$)") && match($0, /Signed-By:[ \t]*[^\n]+/) {
            v = substr($0, RSTART, RLENGTH); sub(/Signed-By:[ \t]*/, "", v); print v; exit }')
  file="/etc/apt/sources.list.d/malleable-deb-src-$suite.sources"
  {
    echo "# Added by malleable's scripts/lib/slurm-source.sh (the source of slurm-wlm)"
    for w in "${missing[@]}"; do
      echo "Types: deb-src"
      case "$w" in
        *-security) echo "URIs: http://deb.debian.org/debian-security/" ;;
        *)          echo "URIs: $uri"; [ -z "$key" ] || echo "Signed-By: $key" ;;
      esac
      printf 'Suites: %s\nComponents: main\n\n' "$w"
    done
  } > "$file"
  echo "[$tag] wrote $file (${missing[*]})" >&2
  apt-get update -q >&2
}

# slurm_source_fetch TAG VERSION CACHE: the highest Debian revision of slurm-wlm VERSION in the
# deb-src indexes (apt-cache showsrc: the index apt verified, InRelease signature then the
# index's hash); every file but the .dsc (trixie's is not on the mirrors) downloaded into CACHE
# from the pool of whichever deb-src repository serves it, checked against the index's SHA-256
# (kept when already there). Prints the Debian version (e.g. 24.11.5-4+deb13u1).
slurm_source_fetch() {
  apt-cache showsrc slurm-wlm | python3 -c '
import hashlib, subprocess, sys, urllib.request
from pathlib import Path
tag, want, cache = sys.argv[1], sys.argv[2], Path(sys.argv[3])
stanzas = [dict(version="", directory="", files=[])]
key = None
for line in sys.stdin.read().splitlines():
    if not line.strip():
        stanzas.append(dict(version="", directory="", files=[]))
        continue
    if line[0] in " \t":
        if key == "Checksums-Sha256":
            sha, size, name = line.split()
            stanzas[-1]["files"].append((sha, name))
        continue
    key, _, value = line.partition(":")
    if key == "Version":
        stanzas[-1]["version"] = value.strip()
    elif key == "Directory":
        stanzas[-1]["directory"] = value.strip()
found = [s for s in stanzas if s["version"].startswith(want + "-") and s["files"]]
if not found:
    have = sorted({s["version"] for s in stanzas if s["version"]})
    sys.exit(f"no slurm-wlm {want}-* in the deb-src indexes (they have: {have})")
ordered = subprocess.run(["sort", "-V"], input="\n".join(s["version"] for s in found),
                         capture_output=True, text=True, check=True).stdout.split()
version = ordered[-1]
uris = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI)",
                       "Created-By: Sources"], capture_output=True, text=True,
                      check=True).stdout.split()
places = {(u.rstrip("/"), s["directory"]) for s in found if s["version"] == version for u in uris}
files = next(s["files"] for s in found if s["version"] == version)
for sha, name in files:
    if name.endswith(".dsc"):
        continue
    dest = cache / name
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha:
        continue
    for uri, directory in sorted(places):
        try:
            with urllib.request.urlopen(f"{uri}/{directory}/{name}", timeout=120) as r:
                data = r.read()
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() == sha:
            dest.write_bytes(data)
            print(f"[{tag}] downloaded {name} from {uri}", file=sys.stderr)
            break
    else:
        sys.exit(f"{name} ({sha}) is on none of {sorted(places)}")
print(version)
' "$1" "$2" "$3"
}
