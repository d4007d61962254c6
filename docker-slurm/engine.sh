#!/bin/bash
# The Docker engine and the base image docker-slurm needs, made offline when they are missing.
#   engine.sh start STATE      use the running engine, or start Debian's dockerd with its state
#                              in STATE/engine (installing docker.io first); STATE/engine/started
#                              records that this script started it
#   engine.sh stop STATE       stop the dockerd this script started (and nothing else)
#   engine.sh base SUITE STATE malleable-debian:SUITE: pulled debian:SUITE if a registry answers,
#                              else debootstrap + docker import (cached: made once)
set -euo pipefail
cmd=${1:?usage: engine.sh start|stop STATE | base SUITE STATE}

# shellcheck source=../scripts/lib/need-packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib/need-packages.sh"

case "$cmd" in
  start)
    state=${2:?state folder}/engine
    need_packages engine docker.io docker-compose debootstrap
    if docker info >/dev/null 2>&1; then
      echo "[engine] a Docker engine is running"
      exit 0
    fi
    mkdir -p "$state"
    echo "[engine] starting dockerd (state in $state)"
    # cgroupfs: no systemd here to delegate cgroups to.
    setsid dockerd --data-root "$state/data" --exec-root "$state/exec" \
      --pidfile "$state/dockerd.pid" --exec-opt native.cgroupdriver=cgroupfs \
      >"$state/dockerd.log" 2>&1 < /dev/null &
    echo $! > "$state/started"
    for _ in $(seq 150); do docker info >/dev/null 2>&1 && exit 0; sleep 0.2; done
    echo "[engine] dockerd did not answer in 30 s; last lines of $state/dockerd.log:" >&2
    tail -20 "$state/dockerd.log" >&2
    exit 1
    ;;
  stop)
    state=${2:?state folder}/engine
    [ -f "$state/started" ] || exit 0
    pid=$(cat "$state/started")
    # Only the dockerd this script started: its pid file and its command line must agree.
    if [ "$(cat "$state/dockerd.pid" 2>/dev/null)" = "$pid" ] && \
       tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "^dockerd --data-root $state/data"; then
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      echo "[engine] dockerd stopped"
    fi
    rm -f "$state/started"
    ;;
  base)
    suite=${2:?suite}; state=${3:?state folder}
    image="malleable-debian:$suite"
    docker image inspect "$image" >/dev/null 2>&1 && exit 0
    if timeout 60 docker pull -q "debian:$suite" >/dev/null 2>&1; then
      docker tag "debian:$suite" "$image"
      echo "[engine] $image from the registry's debian:$suite"
      exit 0
    fi
    echo "[engine] no registry: building $image with debootstrap"
    rootfs="$state/rootfs-$suite"
    rm -rf "$rootfs"
    debootstrap --variant=minbase "$suite" "$rootfs" http://deb.debian.org/debian \
      >"$state/debootstrap-$suite.log" 2>&1 \
      || { tail -20 "$state/debootstrap-$suite.log" >&2; exit 1; }
    tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
    rm -rf "$rootfs"
    echo "[engine] $image imported"
    ;;
  *) echo "usage: engine.sh start|stop STATE | base SUITE STATE" >&2; exit 2 ;;
esac
