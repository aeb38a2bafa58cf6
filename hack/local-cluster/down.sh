#!/usr/bin/env bash
# Stops the cluster hack/local-cluster/up.sh started, by the PIDs it
# recorded, and removes what it left on the host: pods' containers and
# mounts, network namespaces, the cni0 bridge, iptables chains of
# kube-proxy, the kubelet and the bridge plugin, and the cluster's state.
# Built binaries and certificates stay cached (--purge removes the
# certificates too). Safe to run twice.
set -uo pipefail
STATE=${STATE:-/var/tmp/rdmavisor-cluster}
purge=0
[ "${1:-}" = --purge ] && purge=1
log() { echo "local-cluster: $*" >&2; }
kubectl=("$STATE/bin/kubectl" --kubeconfig "$STATE/pki/admin.kubeconfig")

running() { [ -f "$STATE/run/$1.pid" ] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null; }

stop() {
  local f=$STATE/run/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    # kube-apiserver may need a second SIGTERM to skip its graceful wait.
    kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid"; sleep 2; }
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    log "stopped $1 ($pid)"
  fi
  rm -f "$f"
}

# 1. Let the kubelet tear pods down (CNI DEL, unmounts) while it can.
if running kube-apiserver && running kubelet; then
  timeout 60 "${kubectl[@]}" delete pods --all -A --grace-period=1 --wait=true >/dev/null 2>&1 || true
fi
# 2. The components, node side first.
for n in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$n"; done
# 3. Remaining containers, then containerd.
if [ -S /run/containerd/containerd.sock ]; then
  for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1; done
  sleep 1
  for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks rm -f "$t" >/dev/null 2>&1; done
  for c in $(ctr -n k8s.io containers ls -q 2>/dev/null); do ctr -n k8s.io containers rm "$c" >/dev/null 2>&1; done
fi
stop containerd
# 4. iptables: rules jumping to KUBE-*/CNI-* chains, then the chains.
[ -x "$STATE/bin/kube-proxy" ] && "$STATE/bin/kube-proxy" --cleanup >/dev/null 2>&1
for ipt in iptables ip6tables; do
  command -v $ipt >/dev/null || continue
  for t in filter nat mangle; do
    $ipt -t $t -S 2>/dev/null | grep -E '^-A .* -j (KUBE-|CNI-)' | sed 's/^-A //' | while read -r r; do
      eval "$ipt -t $t -D $r" 2>/dev/null
    done
    for op in -F -X; do
      for ch in $($ipt -t $t -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/{print $2}'); do $ipt -t $t $op "$ch" 2>/dev/null; done
    done
  done
done
# 5. Mounts (deepest first) and network namespaces of pods.
findmnt -rn -o TARGET | grep -E '^(/run/containerd|/var/lib/containerd|/var/lib/kubelet|/run/netns)' | sort -r |
  while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns del "$ns"; done
# 6. Network and on-disk state.
ip link del cni0 2>/dev/null
rm -f /etc/cni/net.d/10-local-bridge.conflist
# The links up.sh made to Debian's plugins.
find /opt/cni/bin -maxdepth 1 -type l -lname '/usr/lib/cni/*' -delete 2>/dev/null
rm -rf /var/lib/cni/networks/local-pods /var/lib/cni/results /var/lib/kubelet /var/lib/containerd /run/containerd
rm -rf "$STATE/logs" "$STATE/run"
[ $purge = 1 ] && rm -rf "$STATE/pki" "$STATE/pause.tar"
# A later up.sh starts from an empty etcd: stale objects would confuse tests.
rm -rf "$STATE/etcd"
left=$(findmnt -rn -o TARGET | grep -E 'containerd|kubelet|/run/netns/cni-' || true)
[ -z "$left" ] || { log "mounts left behind:"; echo "$left" >&2; exit 1; }
log "down"
