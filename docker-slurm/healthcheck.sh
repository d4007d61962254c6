#!/bin/bash
# docker-slurm's healthcheck: the controller answers; a node is registered and usable.
set -eu
case "${1:-}" in
  controller) scontrol ping | grep -q UP ;;
  node)
    state=$(sinfo -h -n "$(hostname)" -o %T)
    case "$state" in idle*|mixed*|allocated*|completing*) exit 0 ;; *) exit 1 ;; esac ;;
  *) exit 2 ;;
esac
