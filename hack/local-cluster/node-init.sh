#!/usr/bin/env bash
# PID 1 of a local cluster node (up.sh starts it with unshare(1) in new
# network, mount, PID and UTS namespaces, /proc already its own). It makes
# the node's file system view, then reaps orphans until it is stopped:
#   - its own sysfs (so /sys/class/net shows the node's links), with the
#     host's cgroup hierarchies under it, as a container runtime does;
#   - a tmpfs /run (the node's containerd state, pods' network namespaces,
#     /run/rdmavisor);
#   - ROOT/<dir> bind-mounted on /<dir> for each directory in NODE_DIRS;
#   - mount propagation shared inside the node (the kubelet and the
#     container runtime need it), private to the host.
# Usage: node-init.sh NAME ROOT READY-FILE DIR...
set -euo pipefail
name=$1 root=$2 ready=$3
shift 3
hostname "$name"
# Everything below is private to this mount namespace (unshare made the
# copy of the host's mounts private).
mkdir -p "$root/.cgroup"
mount --rbind /sys/fs/cgroup "$root/.cgroup"
mount -t sysfs sysfs /sys
mount --move "$root/.cgroup" /sys/fs/cgroup
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/netns /run/rdmavisor
for d in "$@"; do
  mkdir -p "$root/$d"
  mount --bind "$root/$d" "/$d"
done
mount --make-rshared /
ip link set lo up
echo "$$" >"$ready"
# SIGTERM ends the node: the kernel then kills every process in its PID
# namespace.
trap 'exit 0' TERM INT
while :; do
  sleep 3600 &
  wait $! || true
done
