#!/usr/bin/env bash
# Stops the cluster hack/local-cluster/up.sh started and leaves the host as
# it was: the pods are deleted while the kubelets can still tear them down,
# the components are stopped by PID, then each node's PID 1, which takes
# every process left in its PID namespace with it; its network namespace
# (links, routes, iptables rules, pods' networks) and mount namespace go
# with the last process. Then the host's own share: the bridge, its
# FORWARD rule, the nodes' cgroups, the hostPath mount points up.sh made,
# and the cluster's state. Built binaries and certificates stay cached
# (--purge removes the certificates too). It checks that nothing is left
# and fails if something is. Safe to run twice.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/lib.sh
. "$here/lib.sh"
purge=0
[ "${1:-}" = --purge ] && purge=1
[ "$(id -u)" = 0 ] || { echo "local-cluster: run as root" >&2; exit 1; }
kubectl=("$STATE/bin/kubectl" --kubeconfig "$kubeconfig")
first=$(node_name 1)

# The nodes up.sh recorded, whatever NODES says now.
nodes=()
for d in "$STATE"/run/*/; do [ -f "$d/init.pid" ] && nodes+=("$(basename "$d")"); done

# 1. Let the kubelets tear pods down (CNI DEL, unmounts) while they can.
#    A frozen node cannot: thaw it first.
for n in "${nodes[@]}"; do
  f=$(freezer_dir "$n")
  [ -f "$f/freezer.state" ] && echo THAWED >"$f/freezer.state" 2>/dev/null
  [ -f "$f/cgroup.freeze" ] && echo 0 >"$f/cgroup.freeze" 2>/dev/null
done
if running "$first" kube-apiserver; then
  timeout 60 "${kubectl[@]}" delete pods --all -A --grace-period=1 --wait=true >/dev/null 2>&1 || true
fi
# 2. The components, node side first, then each node's containers.
for n in "${nodes[@]}"; do
  stop "$n" kube-proxy
  stop "$n" kubelet
done
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$first" "$c"; done
for n in "${nodes[@]}"; do
  if node_alive "$n" && running "$n" containerd; then
    for t in $(in_node "$n" ctr -n k8s.io tasks ls -q 2>/dev/null); do in_node "$n" ctr -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1; done
  fi
  stop "$n" containerd
done
# 3. Each node's PID 1: the kernel kills what is left in its namespace.
for n in "${nodes[@]}"; do
  pid=$(node_pid "$n")
  [ -n "$pid" ] || continue
  nsino=$(stat -Lc %i "/proc/$pid/ns/pid" 2>/dev/null)
  kill -KILL "$pid" 2>/dev/null
  for _ in $(seq 1 40); do
    left=0
    if [ -n "$nsino" ]; then
      for p in /proc/[0-9]*; do
        [ "$(stat -Lc %i "$p/ns/pid" 2>/dev/null)" = "$nsino" ] && { left=1; break; }
      done
    fi
    [ $left = 0 ] && break
    sleep 0.25
  done
  [ "$left" = 0 ] || log "processes of $n still alive"
  log "node $n down"
done
# 4. The host's share: cgroups (deepest first), links, the FORWARD rule.
for ((i = 1; i <= 9; i++)); do
  n=$(node_name "$i")
  for cg in $(cgroup_dirs "$n"); do
    [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  ip link del "rv-$i" 2>/dev/null
done
ip link del "$BRIDGE" 2>/dev/null
# The FORWARD rules up.sh added, by their comment.
iptables -S FORWARD 2>/dev/null | grep -- '--comment rdmavisor-local-cluster' | sed 's/^-A //' | while read -r r; do
  eval "iptables -D $r" 2>/dev/null
done
# 5. On-disk state: the nodes' files (containerd's snapshots are plain
#    directories once their mount namespace is gone), the mount points.
rm -rf "$STATE/nodes" "$STATE/logs" "$STATE/run" "$STATE/cluster.env"
if [ -f "$STATE/made-dirs" ]; then
  sort -r "$STATE/made-dirs" | while read -r d; do rmdir "$d" 2>/dev/null; done
  rm -f "$STATE/made-dirs"
fi
[ $purge = 1 ] && rm -rf "$STATE/pki" "$STATE/pause.tar"
# A later up.sh starts from an empty etcd: stale objects would confuse tests.
rm -rf "$STATE/etcd"

# 6. Nothing may be left.
problems=()
for ((i = 1; i <= 9; i++)); do
  for cg in $(cgroup_dirs "$(node_name "$i")"); do [ -d "$cg" ] && problems+=("cgroup $cg"); done
done
ip link show "$BRIDGE" >/dev/null 2>&1 && problems+=("link $BRIDGE")
r=$(ip route show | grep -F "$POD_NET." || true)
[ -z "$r" ] || problems+=("routes: $r")
iptables -S FORWARD 2>/dev/null | grep -q rdmavisor-local-cluster && problems+=("iptables rule in FORWARD")
m=$(findmnt -rn -o TARGET | grep -F "$STATE" || true)
[ -z "$m" ] || problems+=("mounts: $m")
for p in /proc/[0-9]*; do
  c=$( (tr '\0' ' ' <"$p/cmdline") 2>/dev/null) || continue
  case $c in *"$here/node-init.sh"*|*"$STATE/bin/"*) problems+=("process ${p#/proc/}: $c") ;; esac
done
if [ ${#problems[@]} -gt 0 ]; then
  log "left behind:"
  printf '  %s\n' "${problems[@]}" >&2
  exit 1
fi
log "down"
