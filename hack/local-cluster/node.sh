#!/usr/bin/env bash
# Works on one node of the local cluster (hack/local-cluster/up.sh):
#
#   node.sh list                     each node's name and IP
#   node.sh NODE sh|exec CMD...      a command in the node's namespaces
#   node.sh NODE import TARBALL...   images into the node's containerd
#   node.sh NODE freeze|thaw         stop every process of the node (the
#                                    cgroup freezer: the node is lost to
#                                    its peers, its sockets stay open), or
#                                    let them run again
#   node.sh NODE netem PEER ARGS...  impair the node's packets to PEER (a
#                                    node name) with tc netem ARGS, e.g.
#                                    "loss 5% reorder 5% delay 1ms"
#   node.sh NODE netem clear         remove every impairment of the node
#   node.sh NODE stop|start COMPONENT  containerd, kubelet or kube-proxy
#   node.sh NODE dir                 the node's copy of /, as the host sees
#                                    it (its hostPath directories)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
if [ "$1" = list ]; then
  for ((i = 1; i <= NODES; i++)); do echo "$(node_name "$i") $(node_ip "$i")"; done
  exit 0
fi
[ $# -ge 2 ] || usage
node=$1 cmd=$2
shift 2
node_index "$node" >/dev/null || { echo "node.sh: no node $node (nodes: $(for ((i = 1; i <= NODES; i++)); do echo -n "$(node_name "$i") "; done))" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "node.sh: run as root" >&2; exit 1; }

case $cmd in
  sh) in_node "$node" "${@:-bash}" ;;
  exec) in_node "$node" "$@" ;;
  dir) echo "$(node_dir "$node")/root" ;;
  import)
    # Entering the node's mount namespace moves to its root: absolute paths.
    for t in "$@"; do in_node "$node" ctr -n k8s.io images import "$(realpath "$t")" >&2; done ;;
  freeze|thaw)
    f=$(freezer_dir "$node")
    if [ -f "$f/freezer.state" ]; then
      echo "$([ "$cmd" = freeze ] && echo FROZEN || echo THAWED)" >"$f/freezer.state"
      want=$([ "$cmd" = freeze ] && echo FROZEN || echo THAWED)
      for _ in $(seq 1 100); do [ "$(cat "$f/freezer.state")" = "$want" ] && break; sleep 0.1; done
      [ "$(cat "$f/freezer.state")" = "$want" ] || { echo "node.sh: $node is $(cat "$f/freezer.state"), not $want" >&2; exit 1; }
    else
      echo "$([ "$cmd" = freeze ] && echo 1 || echo 0)" >"$f/cgroup.freeze"
    fi
    log "$node: $cmd" ;;
  netem)
    peer=${1:?netem needs a peer node or clear}
    shift
    in_node "$node" tc qdisc del dev eth0 root 2>/dev/null || true
    if [ "$peer" != clear ]; then
      pidx=$(node_index "$peer") || { echo "node.sh: no node $peer" >&2; exit 2; }
      [ $# -gt 0 ] || { echo "node.sh: netem needs its parameters, e.g. loss 5% reorder 5% delay 1ms" >&2; exit 2; }
      # Only the packets to PEER pass the netem band; the rest go as before.
      in_node "$node" tc qdisc add dev eth0 root handle 1: prio bands 4
      in_node "$node" tc qdisc add dev eth0 parent 1:4 handle 40: netem "$@"
      in_node "$node" tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$(node_ip "$pidx")/32" flowid 1:4
      log "$node to $peer: netem $*"
    fi ;;
  stop) stop "$node" "${1:?stop needs a component}" ;;
  start)
    comp=${1:?start needs a component}
    case $comp in
      containerd|kubelet|kube-proxy) NODES=$NODES "$here/up.sh" >/dev/null ;;
      *) echo "node.sh: start containerd, kubelet or kube-proxy (up.sh starts the rest)" >&2; exit 2 ;;
    esac ;;
  *) usage ;;
esac
