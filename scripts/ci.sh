#!/usr/bin/env bash
# The whole suite as `make test` and CI run it: the set-up, then two lanes at once, every stage
# timed, a table of the times at the end. Exit 0 iff every stage passed.
#
# Why two lanes: on this 2-core machine the local-cluster suite mostly waits on Slurm (2026-12-07:
# 25 min of wall time for 12 min of CPU), so what shares nothing with it runs beside it.
#   host      what uses the host's Slurm and its cgroup v1 tree, one thing at a time: the tests
#             that start local clusters (run_tests.sh --part cluster, tests/site included), then
#             docker-slurm's containers (they bind-mount that tree; Slurm 22.05 and 24.11), then
#             the unit tests, then the subset of malleable_tf's on TensorFlow 2.17 and 2.19 (here
#             since 2026-12-07: the isolated lane ended 290 s after this one, 3,255 s against
#             2,964 s, and this stage took 142 s; the next whole run's lanes ended 27 s apart).
#             (docker-slurm's images built ahead beside the first stage, niced, gained nothing:
#             beside the VMs bookworm's took 582 s instead of 273, and the local-cluster stage
#             was slower too: 2026-12-07.)
#   isolated  the VM cluster (kernels of their own: cgroup v2, Slurm 26.05 with its job folders
#             named by SLUID, its default), then ruff and mypy, then the tests without Slurm:
#             malleable_tf's on TensorFlow 2.21 and on 2.15 (processes of their own; the cpuset
#             folders they make are named by pid)
# One VM cluster fits in CI's hour, not two (2026-12-07 in a whole run: 26.05's took 2,008 s,
# 24.11's 1,784 s in the run before; 1,243 s for 26.05's almost alone). 26.05 is the one whose
# v2 path nothing else runs live: 24.11's job_<J> folders on v2 are 26.05's with
# CgroupJobIdPaths=yes, docker-slurm runs 24.11 (on v1), and SLUID folders exist only on v2.
# 24.11 on v2 is `make test-v2`; 26.05 in docker-slurm's containers (on this host's v1 tree,
# where systemd 258 and later, sid's, no longer boot) is `make test-slurm26`'s: with it the host
# lane ended 370 s after the other (2026-12-07: whole run 3,507 s, docker's three suites 1,735 s
# with their images built afresh, sid's 529).
# Then, alone: malleable_torch's tests. One measures a process's CPU use against plain PyTorch's
# at 1 and 2 threads, which needs both cores free (beside docker's stage, plain PyTorch at 2
# threads got 1.31 cores: 2026-12-07).
# Each lane's lines start with its name. MALLEABLE_CI_SERIAL=1 runs the lanes one after the other
# (to time a stage alone, or to tell whether a failure needs the other lane beside it).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
T0=$(date +%s)
cpu_ticks() {   # busy and all CPU ticks of the machine so far (/proc/stat; idle and iowait idle)
  awk '/^cpu /{ print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9 }' /proc/stat
}
CPU0=$(cpu_ticks)
TIMES=$(mktemp)   # one line a stage: lane, name, start (s after T0), seconds, exit, its log
LOGS=$(mktemp -d)  # each stage's output, to name what failed at the end (CI shows the tail)
trap 'rm -rf "$TIMES" "$LOGS"' EXIT

stage() {   # lane name command...: the command, timed; its exit
  local lane=$1 name=$2 start rc log
  shift 2
  start=$(date +%s)
  log=$(mktemp -p "$LOGS")
  echo "[ci] $name: started $((start - T0)) s after the run"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%d\t%d\t%d\t%s\n' "$lane" "$name" $((start - T0)) $(($(date +%s) - start)) $rc \
    "$log" >>"$TIMES"
  echo "[ci] $name: exit $rc in $(($(date +%s) - start)) s"
  return $rc
}

# Every stage runs even when one before it failed; the exits are read back from $TIMES.
host_lane() {
  stage host "local clusters: integration, site (TF 2.15)" bash scripts/run_tests.sh --part cluster
  stage host "docker-slurm: Slurm 22.05, 24.11" \
    make -C docker-slurm test-all SUITES="bookworm trixie"
  stage host "run_tests.sh --part unit" bash scripts/run_tests.sh --part unit
  stage host "run_tests.sh --part tf-matrix" bash scripts/run_tests.sh --part tf-matrix
}

isolated_lane() {
  local part
  stage isolated "vm-slurm: Slurm 26.05 on cgroup v2 (SLUID)" \
    make -C vm-slurm test SUITE=sid JOB_ID_PATHS=no
  for part in lint keras3 tf215; do
    stage isolated "run_tests.sh --part $part" bash scripts/run_tests.sh --part "$part"
  done
}

run_lane() {   # name function: its lines prefixed with the name
  "$2" </dev/null 2>&1 | sed -u "s/^/[$1] /"
}

finish() {   # the table, then what failed, last, where a reader of CI's tail sees it: pytest's
             # FAILED/ERROR lines and the test clusters' verdicts, or a stage's last lines when it
             # printed none. Exit 0 iff every stage passed.
  local lane name start secs rc log failed=0
  echo "[ci] ---- stages (seconds; start counted from the run's start) ----"
  printf '[ci] %-9s %-52s %6s %6s %5s\n' lane stage start time exit
  sort -s -t$'\t' -k3,3n "$TIMES" | while IFS=$'\t' read -r lane name start secs rc _; do
    printf '[ci] %-9s %-52s %6d %6d %5d\n' "$lane" "$name" "$start" "$secs" "$rc"
  done
  echo "[ci] whole run: $(($(date +%s) - T0)) s; the machine's $(nproc) CPUs busy" \
    "$(echo "$CPU0 $(cpu_ticks)" | awk '{ printf "%.0f", 100 * ($3 - $1) / ($4 - $2) }')% of it"
  # The tests' waits nearest their limits (tests/conftest.py lists those past half), then failures.
  cut -f6 "$TIMES" | xargs cat 2>/dev/null |
    awk '/ waits that took more than half their time /{on=1; next} on && /^ *$/{next}
         on && /^ *[0-9.]+ s of/{ printf "%.2f\t%s\n", $1 / $4, $0; next} {on=0}' |
    sort -rn | head -n 3 | cut -f2 | sed 's/^ */[ci] nearest wait: /'
  while IFS=$'\t' read -r lane name start secs rc log; do
    [ "$rc" = 0 ] && continue
    failed=1
    echo "[ci] failed: $name (exit $rc)"
    { grep -aE '^(FAILED|ERROR) |\[(docker|vm)-slurm\].*FAILED' "$log" || tail -n 8 "$log"; } |
      head -n 20 | sed 's/^/[ci]   /'
    # The failures' own messages (pytest's "E " lines): a FAILED line keeps only their first
    # line, and a wait's message says on the lines after it where each process waited.
    grep -a '^E  ' "$log" | head -n 40 | cut -c1-200 | sed 's/^/[ci]   | /'
  done <"$TIMES"
  [ "$failed" = 0 ] || exit 1
  echo "[ci] passed"
  exit 0
}

# The set-up, before both lanes: the production Slurm build (tests/site), the venvs.
stage setup "production Slurm build (make site-slurm)" make site-slurm &&
  stage setup "set-up (setup.sh --keras3 --tf-matrix --torch)" \
    bash scripts/setup.sh --keras3 --tf-matrix --torch || finish
if [ "${MALLEABLE_CI_SERIAL:-0}" = 1 ]; then
  run_lane host host_lane
  run_lane isolated isolated_lane
else
  run_lane host host_lane &
  run_lane isolated isolated_lane &
  wait
fi
stage alone "run_tests.sh --part torch" bash scripts/run_tests.sh --part torch
finish
