#!/bin/bash
# vm-slurm/build-image.sh: the cached disk image, kernel and initrd of vm-slurm's virtual machines:
# Debian trixie (Slurm 24.11), SUITE=sid: Debian sid (Slurm 26.05), or SUITE=bookworm: Debian 12
# (Slurm 22.05, whose Prolog takes one program), with systemd, cgroup v2, munge, slurmctld,
# slurmd and sshd.
#   build-image.sh            build when missing, else say where the cached one is (idempotent)
#   build-image.sh --force    build again even if the cached one is there
# Everything lives under STATE (default /var/tmp/vm-slurm):
#   STATE/images/<key>/{root.img,vmlinuz,initrd.img,id_ed25519,id_ed25519.pub,manifest.txt}
#   STATE/current -> images/<key>    (what vmctl.py boots)
#   STATE/debs/                      the .deb cache of debootstrap and apt (kept across builds)
# <key> is a hash of this script (which holds the package list and every guest file) and SUITE,
# so an image is rebuilt only when one of them changes. Each VM boots a copy-on-write overlay
# of root.img; the image itself is never written to after the build.
# The guest learns who it is from the kernel command line (set by vmctl.py):
#   vmslurm.name=vm2 vmslurm.n=3 vmslurm.net=10.77.0 [vmslurm.ctld=1]
#   [vmslurm.taskplugin=task/cgroup,task/affinity]   (default task/cgroup)
#   [vmslurm.hwloc_x86=0]   slurmd (so slurmstepd) runs with HWLOC_COMPONENTS=-x86: hwloc's x86
#                           backend then does not pin slurmstepd, whose tasks inherit that pin
#                           (see tests/fixtures/slurm-24.11-cgroup-v2/NOTES.md)
#   [vmslurm.share=TAG]     a 9p folder of the host (vmctl.py's -virtfs ...,mount_tag=TAG),
#                           the same for every VM, mounted at /shared
#   [vmslurm.configless=1]  slurmd runs configless (--conf-server vm1): no Slurm file of its own
#   [vmslurm.logins=vm3,...] the login hosts (no NodeName line); [vmslurm.login=1] on them: no
#                           slurmd, no Slurm file of their own, sackd --conf-server vm1
# Users: root (ssh key STATE/current/id_ed25519) and tester (uid 1000, for jobs not run as root).
set -euo pipefail

STATE=${STATE:-/var/tmp/vm-slurm}
SUITE=${SUITE:-trixie}
JOB_ID_PATHS=${JOB_ID_PATHS:-yes}    # no: Slurm 26.05's job folders keep their SLUID names
# UPGRADE_TO=sid: the image also carries sid's Slurm (and what of sid it needs) as a local apt
# repository, /var/local/slurm-upgrade, for the rolling upgrade the guests run without network
# (tests/vm/test_upgrade.py: apt-get with /etc/apt/slurm-upgrade.list as its only source).
UPGRADE_TO=${UPGRADE_TO:-}
# SLURM_BUILD=production (trixie): Slurm 24.11.5 built from Debian's source WITHOUT
# multiple-slurmd (scripts/build-slurm-production.sh, in the chroot, into /opt/slurm), as most
# sites build it: job folders under system.slice/slurmstepd.scope. Debian's packages stay
# installed (what depends on them), their daemons and commands replaced by the build's.
# SLURM_BUILD=smd (bookworm): SchedMD's own packages (slurm-smd-*, 24.11.5, no multiple-slurmd),
# built from their source's debian/ by scripts/build-slurm-smd.sh (cached in SMD_OUT), in place of
# Debian's, which conflict with them: a site that installs SchedMD's packages.
SLURM_BUILD=${SLURM_BUILD:-debian}
SCRIPTS="$(dirname "$(readlink -f "$0")")/../scripts"
SMD_SCRIPT="$SCRIPTS/build-slurm-smd.sh"
SMD_OUT=${SMD_OUT:-/var/tmp/slurm-smd}
SMD_PACKAGES=(slurm-smd slurm-smd-client slurm-smd-dev slurm-smd-slurmctld slurm-smd-slurmd
              slurm-smd-sackd)
PRODUCTION_SCRIPT="$SCRIPTS/build-slurm-production.sh"
PRODUCTION_LIB="$SCRIPTS/lib/slurm-source.sh"     # it sources this
MIRROR=${MIRROR:-http://deb.debian.org/debian}
FORCE=0
[ "${1:-}" = --force ] && FORCE=1

# Installed into the chroot with --no-install-recommends after a minbase debootstrap.
PACKAGES=(
  systemd systemd-sysv udev dbus kmod
  linux-image-amd64 initramfs-tools
  munge openssh-server python3 iproute2 procps
  # The co-scheduler (tests/vm): the agent's Python modules, and a C toolchain for the SPANK
  # plugin that the guide's step build compiles in the guest.
  python3-psutil python3-prometheus-client gcc libc6-dev make
)
# Debian's Slurm, with its headers (SLURM_BUILD=smd: SchedMD's, installed below).
[ "$SLURM_BUILD" = smd ] || PACKAGES+=(slurmctld slurmd slurm-client libslurm-dev)
# sackd (Slurm 23.11 and later; not in bookworm's 22.05): a login host's configless client
# configuration (in the image that carries the next release for test-upgrade too, whose login
# host is upgraded last).
SACKD=1
{ [ "$SUITE" != bookworm ] || [ "$SLURM_BUILD" = smd ]; } || SACKD=0
[ "$SACKD" = 0 ] || [ "$SLURM_BUILD" = smd ] || PACKAGES+=(sackd)

log() { echo "[vm-slurm] $*"; }

# shellcheck source=../scripts/lib/need-packages.sh
source "$SCRIPTS/lib/need-packages.sh"
# shellcheck source=../scripts/lib/chroot.sh
source "$SCRIPTS/lib/chroot.sh"

if [ "$SLURM_BUILD" = smd ]; then
  [ "$SUITE" = bookworm ] || { echo "SLURM_BUILD=smd is made for SUITE=bookworm (where its packages are built)" >&2; exit 1; }
  OUT="$SMD_OUT" bash "$SMD_SCRIPT"     # cached after the first build
fi
key=$( { cat "$0" "$SCRIPTS/lib/chroot.sh"
          echo "$SUITE $JOB_ID_PATHS $UPGRADE_TO $SLURM_BUILD"
          [ "$SLURM_BUILD" != production ] || cat "$PRODUCTION_SCRIPT" "$PRODUCTION_LIB"
          [ "$SLURM_BUILD" != smd ] || cat "$SMD_OUT/stamp" 2>/dev/null; } | sha256sum | cut -c1-16)
out="$STATE/images/$key"
mkdir -p "$STATE/images" "$STATE/debs"

# One build at a time (a second caller waits, then finds the image made).
exec 9>"$STATE/build.lock"
flock 9

if [ "$FORCE" = 0 ] && [ -f "$out/done" ]; then
  ln -sfn "images/$key" "$STATE/current"
  log "image $key is cached: $out"
  exit 0
fi

need_packages vm-slurm debootstrap qemu-utils qemu-system-x86 e2fsprogs openssh-client
start=$(date +%s)
work="$STATE/build-$key"
rootfs="$work/rootfs"

cleanup() { chroot_unmount "$rootfs"; rm -rf "$work"; }
trap cleanup EXIT
cleanup
mkdir -p "$rootfs"

log "debootstrap $SUITE (minbase) into $rootfs"
debootstrap_minbase "$SUITE" "$rootfs" "$STATE/debs" "$MIRROR" "$work/debootstrap.log"
log "debootstrap done in $(( $(date +%s) - start ))s"

mount -t proc proc "$rootfs/proc"
mount -t sysfs sysfs "$rootfs/sys"
mount --bind /dev "$rootfs/dev"
mount --bind /dev/pts "$rootfs/dev/pts"
mount --bind "$STATE/debs" "$rootfs/var/cache/apt/archives"
in_root() { LC_ALL=C DEBIAN_FRONTEND=noninteractive chroot "$rootfs" "$@"; }

# No daemon starts inside the chroot.
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod +x "$rootfs/usr/sbin/policy-rc.d"
echo "deb $MIRROR $SUITE main" > "$rootfs/etc/apt/sources.list"
# The archive's sid may be a snapshot whose Release file is past its Valid-Until date.
[ "$SUITE" != sid ] || echo 'Acquire::Check-Valid-Until "false";' \
  > "$rootfs/etc/apt/apt.conf.d/99archive-snapshot"

# A small initrd: only the drivers to find the root disk (written before the kernel is
# installed, so the initrd made by its postinst already follows it).
mkdir -p "$rootfs/etc/initramfs-tools/conf.d"
printf 'MODULES=list\nCOMPRESS=gzip\n' > "$rootfs/etc/initramfs-tools/conf.d/vm-slurm.conf"
printf 'virtio_pci\nvirtio_blk\nvirtio_net\next4\n' > "$rootfs/etc/initramfs-tools/modules"

log "apt-get install ${PACKAGES[*]}"
in_root apt-get update -q >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }
in_root apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$work/apt.log" 2>&1 \
  || { tail -30 "$work/apt.log" >&2; exit 1; }
log "packages installed at $(( $(date +%s) - start ))s"

if [ "$SLURM_BUILD" = smd ]; then
  # SchedMD's packages by apt from their files (their Depends resolved from the mirror), as a
  # site installs them from its own repository. They make no slurm user (Debian's do).
  mkdir -p "$rootfs/tmp/smd"
  for p in "${SMD_PACKAGES[@]}"; do cp "$SMD_OUT"/debs/"${p}"_*.deb "$rootfs/tmp/smd/"; done
  in_root sh -c 'apt-get install -y -q --no-install-recommends /tmp/smd/*.deb' >>"$work/apt.log" 2>&1 \
    || { tail -30 "$work/apt.log" >&2; exit 1; }
  rm -rf "$rootfs/tmp/smd"
  in_root sh -c 'getent passwd slurm >/dev/null || useradd --system --no-create-home --shell /usr/sbin/nologin slurm'
  log "SchedMD's packages: $(in_root dpkg-query -W -f='${Package} ${Version}, ' "${SMD_PACKAGES[@]}")"
fi

if [ -n "$UPGRADE_TO" ]; then
  # What `apt-get install -t $UPGRADE_TO` of Slurm's packages would download on this system
  # (Slurm's, and each library of $UPGRADE_TO they need a newer version of), as a flat
  # repository the guest installs from; $UPGRADE_TO's source and lists are gone afterwards.
  log "$UPGRADE_TO's Slurm into /var/local/slurm-upgrade"
  echo "deb $MIRROR $UPGRADE_TO main" > "$rootfs/etc/apt/sources.list.d/upgrade.list"
  echo 'Acquire::Check-Valid-Until "false";' > "$rootfs/etc/apt/apt.conf.d/99archive-snapshot"
  up=/var/local/slurm-upgrade
  mkdir -p "$rootfs$up/partial"
  { in_root apt-get install -y -q --no-install-recommends apt-utils &&
    in_root apt-get update -q &&
    in_root apt-get install -y -q --no-install-recommends --download-only -t "$UPGRADE_TO" \
      -o Dir::Cache::archives="$up" slurmctld slurmd slurm-client libslurm-dev \
      $([ "$SACKD" = 0 ] || echo sackd) &&
    rm -rf "$rootfs$up/partial" "$rootfs$up/lock" &&
    in_root sh -c "cd $up && apt-ftparchive packages . > Packages"; } >>"$work/apt.log" 2>&1 \
    || { tail -30 "$work/apt.log" >&2; exit 1; }
  rm -f "$rootfs/etc/apt/sources.list.d/upgrade.list"
  echo "deb [trusted=yes] file:$up ./" > "$rootfs/etc/apt/slurm-upgrade.list"
  log "$(ls "$rootfs$up"/*.deb | wc -l) packages of $UPGRADE_TO ($(du -sh "$rootfs$up" | cut -f1)):" \
    "$(cd "$rootfs$up" && ls -- *.deb | cut -d_ -f1 | paste -sd' ')"
fi

if [ "$SLURM_BUILD" = production ]; then
  [ "$SUITE" = trixie ] || { echo "SLURM_BUILD=production is made for SUITE=trixie" >&2; exit 1; }
  log "Slurm without multiple-slurmd: scripts/build-slurm-production.sh in the chroot"
  # The source download is kept across image builds (STATE/slurm-src).
  mkdir -p "$STATE/slurm-src" "$rootfs/var/cache/slurm-production"
  mount --bind "$STATE/slurm-src" "$rootfs/var/cache/slurm-production"
  mkdir -p "$rootfs/tmp/lib"
  cp "$PRODUCTION_SCRIPT" "$rootfs/tmp/build-slurm-production.sh"
  cp "$PRODUCTION_LIB" "$rootfs/tmp/lib/slurm-source.sh"
  in_root env SLURM_SUITE=trixie PREFIX=/opt/slurm SYSCONFDIR=/etc/slurm RUNSTATEDIR=/run \
    MALLEABLE_CACHE=/var/cache JOBS="$(nproc)" bash /tmp/build-slurm-production.sh \
    >"$work/slurm-production.log" 2>&1 || { tail -40 "$work/slurm-production.log" >&2; exit 1; }
  grep '^\[slurm-production\]' "$work/slurm-production.log" | tail -3
  umount "$rootfs/var/cache/slurm-production"
  rm -rf "$rootfs"/etc/apt/sources.list.d/malleable-deb-src-*.sources \
    "$rootfs/tmp/build-slurm-production.sh" "$rootfs/tmp/lib"
  # The daemons through Debian's own alternatives (its units run /usr/sbin/slurmd), the
  # commands by diverting Debian's: whatever PATH a unit, a hook or a user has, it is this build.
  in_root update-alternatives --install /usr/sbin/slurmd slurmd /opt/slurm/sbin/slurmd 100 \
    --slave /usr/sbin/slurmstepd slurmstepd /opt/slurm/sbin/slurmstepd >>"$work/apt.log"
  in_root update-alternatives --install /usr/sbin/slurmctld slurmctld /opt/slurm/sbin/slurmctld 100 \
    >>"$work/apt.log"
  for f in "$rootfs"/opt/slurm/bin/*; do
    b=$(basename "$f")
    [ -e "$rootfs/usr/bin/$b" ] || continue
    in_root dpkg-divert --quiet --local --rename --add "/usr/bin/$b"
    ln -s "/opt/slurm/bin/$b" "$rootfs/usr/bin/$b"
  done
  log "production build: $(in_root slurmd -V), commands and daemons:" \
    "$(in_root readlink -f /usr/bin/sinfo /usr/sbin/slurmd /usr/sbin/slurmstepd /usr/sbin/slurmctld | paste -sd' ')"
fi

# --- the guest's configuration -------------------------------------------------------------
R=$rootfs
echo vm > "$R/etc/hostname"
# No name server and no default route in the guests: names come from /etc/hosts only, and the
# only networks are the private one and QEMU's restricted user network (ssh from the host).
: > "$R/etc/resolv.conf"
printf '/dev/vda / ext4 rw,noatime 0 0\n' > "$R/etc/fstab"
mkdir -p "$R/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n' \
  > "$R/etc/systemd/journald.conf.d/vm-slurm.conf"

# The host's way in: root over ssh with this image's own key (the host side is 127.0.0.1 only).
ssh-keygen -q -t ed25519 -N '' -C vm-slurm -f "$work/id_ed25519"
install -d -m 700 "$R/root/.ssh"
install -m 600 "$work/id_ed25519.pub" "$R/root/.ssh/authorized_keys"
printf 'UseDNS no\nPermitRootLogin prohibit-password\n' > "$R/etc/ssh/sshd_config.d/vm-slurm.conf"

# Identity and network from the kernel command line, before munge, Slurm and sshd.
cat > "$R/usr/local/sbin/vmslurm-setup" <<'EOF'
#!/bin/bash
# Hostname, /etc/hosts, both NICs' static addresses and slurm.conf's node list, from
# vmslurm.* on the kernel command line. NICs are told apart by MAC (set by vmctl.py):
# 52:54:00:00:00:<i> is the host link (QEMU user network), 52:54:00:77:00:<i> the private one.
set -eu
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^vmslurm\.$1=//p" | tail -1; }
name=$(arg name); n=$(arg n); net=$(arg net); taskplugin=$(arg taskplugin)
hwloc_x86=$(arg hwloc_x86); share=$(arg share)
if [ -z "$name" ] || [ -z "$n" ] || [ -z "$net" ]; then
  echo "vmslurm-setup: no vmslurm.name/n/net on the kernel command line" >&2; exit 1
fi
i=${name#vm}
echo "$name" > /etc/hostname
hostname "$name"
{ echo "127.0.0.1 localhost"
  for j in $(seq 1 "$n"); do echo "$net.$j vm$j"; done; } > /etc/hosts
modprobe virtio_net 2>/dev/null || true
ifname_of() {
  local d
  for d in /sys/class/net/*; do
    [ "$(cat "$d/address")" = "$1" ] && { basename "$d"; return 0; }
  done
  return 1
}
hx=$(printf '%02x' "$i")
for _ in $(seq 300); do
  hostif=$(ifname_of "52:54:00:00:00:$hx") && privif=$(ifname_of "52:54:00:77:00:$hx") && break
  sleep 0.1
done
ip link set lo up
ip addr add 10.0.2.15/24 dev "$hostif"
ip link set "$hostif" up
ip addr add "$net.$i/24" dev "$privif"
ip link set "$privif" up
# One NodeName line per node: 2 CPUs on one socket, or the SOCKETSxCORESxTHREADS that
# vmslurm.layouts gives it (vm2=2x2x2,...: vmctl.py's server topologies).
layouts=$(arg layouts)
logins=",$(arg logins),"
nodelines=$(for j in $(seq 1 "$n"); do
  [ "${logins#*,vm$j,}" = "$logins" ] || continue    # a login host: no slurmd, no NodeName
  l=$(tr ',' '\n' <<< "$layouts" | sed -n "s/^vm$j=//p")
  IFS=x read -r s c t <<< "${l:-1x2x1}"
  echo "NodeName=vm$j CPUs=$((s * c * t)) Sockets=$s CoresPerSocket=$c ThreadsPerCore=$t State=UNKNOWN"
done)
sed -e "s#@TASKPLUGIN@#${taskplugin:-task/cgroup}#" /etc/slurm/slurm.conf.in |
  awk -v lines="$nodelines" '$0 == "@NODELINES@" { print lines; next } { print }' \
  > /etc/slurm/slurm.conf
if [ "$(arg configless)" = 1 ]; then
  # Configless: no Slurm configuration of the node's own (a local slurm.conf would win over
  # the server's); slurmd fetches vm1's into /run/slurm/conf, the client commands read it there.
  rm -f /etc/slurm/slurm.conf /etc/slurm/site.conf /etc/slurm/cgroup.conf /etc/slurm/plugstack.conf
  printf 'SLURMD_OPTIONS=--conf-server vm1\nSLURM_CONF_SERVER=vm1\n' >> /etc/default/slurmd
fi
if [ "$(arg login)" = 1 ]; then
  # A login host of a configless site: no Slurm file of its own; sackd fetches the controller's
  # client configuration into /run/slurm/conf, where sbatch, salloc and srun read it.
  rm -f /etc/slurm/slurm.conf /etc/slurm/site.conf /etc/slurm/cgroup.conf /etc/slurm/plugstack.conf
  printf 'SACKD_OPTIONS=--conf-server vm1\n' >> /etc/default/sackd
fi
if [ "$hwloc_x86" = 0 ]; then
  echo "HWLOC_COMPONENTS=-x86" >> /etc/default/slurmd
fi
if [ -n "$share" ]; then
  # The host's shared folder (virtio-9p; the modules are in the root file system, not the initrd).
  modprobe 9pnet_virtio && modprobe 9p && mkdir -p /shared &&
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none "$share" /shared ||
    echo "vmslurm-setup: could not mount the 9p share $share on /shared" >&2
fi
echo "vmslurm-setup: $name ($hostif host link, $privif $net.$i), $n nodes${share:+, /shared: 9p $share}"
EOF
chmod 755 "$R/usr/local/sbin/vmslurm-setup"

cat > "$R/etc/systemd/system/vmslurm-setup.service" <<'EOF'
[Unit]
Description=vm-slurm identity, network and slurm.conf from the kernel command line
DefaultDependencies=no
After=systemd-udevd.service local-fs.target
Wants=systemd-udevd.service
Before=network.target munge.service slurmd.service slurmctld.service ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/vmslurm-setup

[Install]
WantedBy=multi-user.target
EOF

for unit in munge slurmd slurmctld sackd ssh; do
  mkdir -p "$R/etc/systemd/system/$unit.service.d"
  printf '[Unit]\nWants=vmslurm-setup.service\nAfter=vmslurm-setup.service\n' \
    > "$R/etc/systemd/system/$unit.service.d/vm-slurm.conf"
done
# A configless slurmd has no slurm.conf: no condition on one (a packaging may set it); it
# retries every 10 s until vm1's slurmctld serves its configuration (both boot at once).
printf 'ConditionPathExists=\n[Service]\nTimeoutStartSec=900\n' \
  >> "$R/etc/systemd/system/slurmd.service.d/vm-slurm.conf"
# slurmctld only where the command line says vmslurm.ctld=1 (vm1); slurmd on every node, sackd
# on the login hosts (vmslurm.login=1) instead.
printf '[Unit]\nConditionKernelCommandLine=vmslurm.ctld=1\n' \
  >> "$R/etc/systemd/system/slurmctld.service.d/vm-slurm.conf"
printf '[Unit]\nConditionKernelCommandLine=!vmslurm.login=1\n' \
  >> "$R/etc/systemd/system/slurmd.service.d/vm-slurm.conf"
if [ "$SACKD" = 1 ]; then
  # sackd retries until vm1's slurmctld answers (both boot at once).
  printf '[Unit]\nConditionKernelCommandLine=vmslurm.login=1\n[Service]\nRestart=on-failure\nRestartSec=5\n' \
    >> "$R/etc/systemd/system/sackd.service.d/vm-slurm.conf"
fi

cat > "$R/etc/slurm/slurm.conf.in" <<'EOF'
# vm-slurm: written at boot from slurm.conf.in by vmslurm-setup (@NODELINES@ from vmslurm.n and
# vmslurm.layouts, @TASKPLUGIN@ from vmslurm.taskplugin, default task/cgroup).
ClusterName=vmslurm
SlurmctldHost=vm1
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
# debug: slurmstepd logs each job's CPUs in Slurm's abstract ids and in Linux's
# (task/cgroup's 'job physical CPUs are'), which tests/vm/test_topology.py compares.
SlurmdDebug=debug
ProctrackType=proctrack/cgroup
TaskPlugin=@TASKPLUGIN@
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdTimeout=120
SlurmctldTimeout=60
MessageTimeout=30
# Nodes may run configless (vmslurm.configless=1: slurmd --conf-server vm1).
SlurmctldParameters=enable_configless
@NODELINES@
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# The site's own settings, in a file of their own: a Prolog of its own (docs/install.md's
# slurm-conf step must keep it, and add ours beside it).
Include site.conf
EOF
cat > "$R/etc/slurm/site.conf" <<'EOF'
# vm-slurm: the site's Prolog (it leaves a mark per job: /run/site-prolog/<job id>).
Prolog=/etc/slurm/site-prolog.sh
EOF
cat > "$R/etc/slurm/site-prolog.sh" <<'EOF'
#!/bin/sh
mkdir -p /run/site-prolog && touch "/run/site-prolog/$SLURM_JOB_ID"
EOF
chmod 755 "$R/etc/slurm/site-prolog.sh"
cat > "$R/etc/slurm/cgroup.conf" <<'EOF'
CgroupPlugin=cgroup/v2
ConstrainCores=yes
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
# Slurm 26.05's cgroup/v2 names a job's folder by its SLUID unless told otherwise (26.05.2 added
# the key; 24.11 refuses a cgroup.conf with a key it does not know). The co-scheduler follows
# both; JOB_ID_PATHS=no leaves Slurm's default (SLUID folders) to test that.
if [ "$JOB_ID_PATHS" = yes ] &&
   in_root dpkg --compare-versions "$(in_root dpkg-query -W -f='${Version}' slurmd)" ge 26.05.2; then
  echo "CgroupJobIdPaths=yes" >> "$R/etc/slurm/cgroup.conf"
fi
install -d -o 0 -g 0 "$R/var/log/slurm"
in_root sh -c 'chown slurm:slurm /var/log/slurm; mkdir -p /var/lib/slurm/slurmctld /var/lib/slurm/slurmd;
  chown slurm:slurm /var/lib/slurm/slurmctld'
# A user for jobs that do not run as root (the same uid on every node: one image).
in_root useradd -m -u 1000 -s /bin/bash tester
# The munge key (the same in every VM of this image).
if [ ! -s "$R/etc/munge/munge.key" ]; then
  dd if=/dev/urandom of="$R/etc/munge/munge.key" bs=1024 count=1 status=none
fi
in_root sh -c 'chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key'

in_root systemctl enable vmslurm-setup.service munge.service slurmd.service slurmctld.service \
  ssh.service $([ "$SACKD" = 0 ] || echo sackd.service) >>"$work/apt.log" 2>&1
# Timers and units a short-lived test VM does not need (boot time under emulation).
for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
    fstrim.timer man-db.timer logrotate.timer systemd-tmpfiles-clean.timer getty@tty1.service \
    e2scrub_reap.service systemd-timesyncd.service; do
  in_root systemctl mask "$u" >/dev/null 2>&1 || true
done

# --- out of the chroot: kernel, initrd, disk image -----------------------------------------
rm -f "$R/usr/sbin/policy-rc.d"
kernel=$(ls "$R"/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$R"/boot/initrd.img-* | sort -V | tail -1)
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"
{
  echo "key=$key suite=$SUITE built=$(date -u +%FT%TZ)"
  echo "kernel=$(basename "$kernel") initrd=$(basename "$initrd") ($(du -h "$initrd" | cut -f1))"
  in_root dpkg-query -W -f='${Package} ${Version}\n' "${PACKAGES[@]}" \
    $([ "$SLURM_BUILD" = smd ] && echo "${SMD_PACKAGES[@]}" || echo slurm-wlm-basic-plugins)
  [ -z "$UPGRADE_TO" ] || (cd "$R/var/local/slurm-upgrade" && ls -- *.deb | sed 's/^/upgrade: /')
  case "$SLURM_BUILD" in
    production) echo "slurm build: production, $(in_root slurmd -V) in /opt/slurm" \
      "($(grep '^debian_version=' "$R/opt/slurm/.build-stamp" | cut -d= -f2), no multiple-slurmd)" ;;
    smd) echo "slurm build: smd, $(in_root slurmd -V) (SchedMD's packages, no multiple-slurmd;" \
      "$(sed -n 2p "$SMD_OUT/stamp"))" ;;
  esac
} > "$work/manifest.txt"
findmnt -rn -o TARGET | grep "^$rootfs/" | sort -r | while read -r m; do umount "$m"; done
rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin "$R"/var/log/*.log "$R"/tmp/*

size_mb=$(( $(du -sm "$R" | cut -f1) * 13 / 10 + 512 ))
log "mkfs.ext4 -d: ${size_mb} MB image (sparse)"
mkfs.ext4 -q -F -L vmroot -E root_owner=0:0 -d "$R" "$work/root.img" "${size_mb}M"
rm -rf "$R"

rm -rf "$out"
mv "$work" "$out"
touch "$out/done"
ln -sfn "images/$key" "$STATE/current"
# Older images are dropped (their overlays, if any VM runs on them, keep them open). Each suite
# has a STATE of its own (the Makefile's), so trixie's and sid's images do not drop each other.
for old in "$STATE"/images/*; do
  [ "$old" = "$out" ] || rm -rf "$old"
done
log "image $key built in $(( $(date +%s) - start ))s: $out"
cat "$out/manifest.txt"
