#!/bin/bash
# A container of docker-slurm: `controller` (munged, slurmctld, the co-scheduler's watcher) or
# `node NAME` (munged, slurmd, the node's agent, its feed in the container's own
# /run/malleable/feed, over the feed link); `prepare ARGS` writes the cluster folder.
# The container stops when any of its daemons does, so compose and the healthcheck see it.
set -euo pipefail
ROOT=/cluster
HOOKS=$ROOT/hooks

if [ "${1:-}" = prepare ]; then
  shift
  # The development cluster is not in the node package: the image carries it (and the code it
  # renders the hooks with, the package's own source) in /opt/malleable/devcluster. The hooks it
  # writes run the Debian package's node side, under Debian's python3 -I (docs/install.md).
  exec env PYTHONPATH=/opt/malleable/devcluster /usr/bin/python3 -P -s \
    -m slurm_plugin.cluster.docker prepare "$@"
fi

install -d -m 0755 /run/munge
munged --foreground --key-file="$ROOT/munge/munge.key" --socket=/run/munge/munge.socket.2 \
  --pid-file=/run/munge/munged.pid --seed-file=/run/munge/munged.seed \
  --log-file="$ROOT/log/munged-$(hostname).log" &
for _ in $(seq 100); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done

case "${1:-}" in
  controller)
    # A backup controller host (a SlurmctldHost after the first) logs apart from the primary.
    log=()
    [ "$(hostname)" = "$(awk -F'[=(]' '/^SlurmctldHost=/ {print $2; exit}' "$SLURM_CONF")" ] \
      || log=(-L "$ROOT/log/slurmctld-$(hostname).log")
    slurmctld -D -f "$SLURM_CONF" "${log[@]}" &
    if [ -f "$HOOKS/agent.json" ]; then
      # The nodes' agents connect to it over the feed link (agent.json: port, munge); beside a
      # backup slurmctld it stands by until that one is in control.
      out="$ROOT/log/watcher.out"
      [ ${#log[@]} = 0 ] || out="$ROOT/log/watcher-$(hostname).out"
      /usr/bin/malleable watcher --feed-dir "$MALLEABLE_FEED_DIR" --slurm-conf "$SLURM_CONF" \
        --config "$HOOKS/agent.json" --link-address 0.0.0.0 >> "$out" 2>&1 &
    fi
    ;;
  node)
    node="${2:?node name}"
    slurmd -D -f "$SLURM_CONF" -N "$node" &
    if [ -f "$HOOKS/agent.json" ]; then
      /usr/bin/malleable agent --config "$HOOKS/agent.json" --node "$node" \
        >> "$ROOT/log/agent-$node.out" 2>&1 &
    fi
    ;;
  *)
    echo "usage: entrypoint.sh controller | node NAME | prepare ARGS" >&2
    exit 2
    ;;
esac
wait -n
status=$?
echo "entrypoint: a daemon exited (status $status); stopping the container" >&2
exit "$status"
