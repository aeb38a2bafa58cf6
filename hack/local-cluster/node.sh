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
#                                    node name and its pod CIDR) with tc
#                                    netem ARGS, e.g. "loss 5% reorder 5%
#                                    delay 1ms", replacing any impairment
#                                    before; where the kernel has no netem,
#                                    with hack/cmd/impair on an NFQUEUE
#                                    (loss, reorder and delay only;
#                                    IMPAIR_SEED seeds it)
#   node.sh NODE netem clear         remove every impairment of the node;
#                                    prints each impair tool's counters
#   node.sh NODE netem stats PEER    the impair tool's counters to PEER,
#                                    JSON: packets, dropped, reordered
#   node.sh NODE stop|start COMPONENT  containerd, kubelet or kube-proxy
#   node.sh NODE dir                 the node's copy of /, as the host sees
#                                    it (its hostPath directories)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/local-cluster/lib.sh
. "$here/lib.sh"
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }

# --- netem: tc netem where the kernel has it, else hack/cmd/impair ---
impair_comment=rdmavisor-impair
impair_stats() { echo "$(node_run "$1")/impair-$2.json"; }
# impair_json NODE PEER: the tool's counters, with the node and peer added.
impair_json() { sed "s/^{/{\"node\":\"$1\",\"peer\":\"$2\",/" "$(impair_stats "$1" "$2")"; }

# netem_tc NODE PEER-INDEX ARGS...: tc netem on the packets to the peer's
# node IP and pod CIDR. Returns 3 when the kernel lacks prio or netem.
netem_tc() {
  local node=$1 pidx=$2 err dst
  shift 2
  # Only the packets to PEER pass the netem band; the rest go as before.
  if ! err=$(in_node "$node" tc qdisc add dev eth0 root handle 1: prio bands 4 2>&1) ||
    ! err=$(in_node "$node" tc qdisc add dev eth0 parent 1:4 handle 40: netem "$@" 2>&1); then
    in_node "$node" tc qdisc del dev eth0 root 2>/dev/null || true
    case $err in
      *"qdisc kind is unknown"*) return 3 ;;
      *) echo "node.sh: tc netem $*: $err" >&2; return 1 ;;
    esac
  fi
  for dst in "$(node_ip "$pidx")/32" "$(pod_cidr "$pidx")"; do
    in_node "$node" tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$dst" flowid 1:4 || return 1
  done
}

# impair_flags ARGS...: the impair tool's flags for netem's ARGS, in
# IMPAIR_FLAGS; the words it cannot do are refused.
impair_flags() {
  IMPAIR_FLAGS=()
  while [ $# -gt 0 ]; do
    case $1 in
      loss)
        [ "${2:-}" = random ] && shift
        [ $# -ge 2 ] || { echo "node.sh: netem loss needs a percentage" >&2; return 1; }
        IMPAIR_FLAGS+=(--loss "$2"); shift 2 ;;
      reorder)
        [ $# -ge 2 ] || { echo "node.sh: netem reorder needs a percentage" >&2; return 1; }
        IMPAIR_FLAGS+=(--reorder "$2"); shift 2 ;;
      delay)
        [ $# -ge 2 ] || { echo "node.sh: netem delay needs a time, e.g. 1ms" >&2; return 1; }
        IMPAIR_FLAGS+=(--delay "$2"); shift 2 ;;
      *)
        echo "node.sh: netem $1: this kernel has no sch_netem and the impair tool does only \"loss P%\", \"reorder P%\" and \"delay TIME\" (no correlation, jitter, duplicate, corrupt or rate)" >&2
        return 1 ;;
    esac
  done
}

# netem_impair NODE PEER PEER-INDEX ARGS...: the impair tool on an NFQUEUE
# queue of its own (100 + the peer's index) for the packets the node sends
# or forwards (its pods') to the peer's node IP and pod CIDR.
netem_impair() {
  local node=$1 peer=$2 pidx=$3 repo bin stats q chain dst
  shift 3
  impair_flags "$@" || exit 2
  repo=$(cd "$here/../.." && pwd)
  bin=$STATE/bin/impair
  # Built once, again only when its sources change.
  if [ ! -x "$bin" ] || [ -n "$(find "$repo/hack/cmd/impair" -newer "$bin" -name '*.go' -print -quit)" ]; then
    mkdir -p "$STATE/bin"
    CGO_ENABLED=0 go build -C "$repo" -trimpath -o "$bin" ./hack/cmd/impair
  fi
  q=$((100 + pidx))
  stats=$(impair_stats "$node" "$peer")
  rm -f "$stats"
  start "$node" "impair-$peer" "$bin" --queue "$q" --seed "${IMPAIR_SEED:-1}" --interval 1s --stats "$stats" "${IMPAIR_FLAGS[@]}"
  # The tool writes its counters once it has bound the queue.
  for _ in $(seq 1 100); do [ -f "$stats" ] && break; running "$node" "impair-$peer" || break; sleep 0.05; done
  [ -f "$stats" ] || { log "impair-$peer on $node did not bind queue $q; its log:"; tail -n 20 "$STATE/logs/$node-impair-$peer.log" >&2; stop "$node" "impair-$peer"; exit 1; }
  for chain in OUTPUT FORWARD; do
    for dst in "$(node_ip "$pidx")" "$(pod_cidr "$pidx")"; do
      # --queue-bypass: if the tool dies, packets pass rather than drop.
      in_node "$node" iptables -I "$chain" -d "$dst" -m comment --comment "$impair_comment" -j NFQUEUE --queue-num "$q" --queue-bypass
    done
  done
}

# netem_clear NODE: no netem qdisc, no impair rule or tool; prints each
# stopped tool's counters.
netem_clear() {
  local node=$1 chain rule f comp
  local -a words
  in_node "$node" tc qdisc del dev eth0 root 2>/dev/null || true
  for chain in OUTPUT FORWARD; do
    while rule=$(in_node "$node" iptables -S "$chain" | grep -m 1 -- "--comment $impair_comment"); do
      read -ra words <<<"${rule/#-A/-D}"
      in_node "$node" iptables "${words[@]}"
    done
  done
  for f in "$(node_run "$node")"/impair-*.pid; do
    [ -f "$f" ] || continue
    comp=$(basename "$f" .pid)
    stop "$node" "$comp"
    [ -f "$(impair_stats "$node" "${comp#impair-}")" ] && impair_json "$node" "${comp#impair-}"
  done
  return 0
}

# freezer_is NODE frozen|thawed: whether the node's cgroup is so (v1's
# freezer.state, v2's cgroup.events).
freezer_is() {
  local f
  f=$(freezer_dir "$1")
  if [ -f "$f/freezer.state" ]; then
    [ "$(cat "$f/freezer.state")" = "${2^^}" ]
  else
    grep -qx "frozen $([ "$2" = frozen ] && echo 1 || echo 0)" "$f/cgroup.events"
  fi
}

# freezer_write NODE freeze|thaw: asks the node's cgroup freezer.
freezer_write() {
  local f
  f=$(freezer_dir "$1")
  if [ -f "$f/freezer.state" ]; then
    echo "$([ "$2" = freeze ] && echo FROZEN || echo THAWED)" >"$f/freezer.state"
  else
    echo "$([ "$2" = freeze ] && echo 1 || echo 0)" >"$f/cgroup.freeze"
  fi
}

# set_freezer NODE freeze|thaw, waiting until the node is so. A freeze can
# stick half-way: a thread in exec (a probe's runc exec) waits, unfrozen,
# for its sibling threads to exit, and they are frozen. As runc does, the
# node is thawed a moment and frozen again; a freeze that never completes
# leaves the node thawed, not half frozen, and fails.
set_freezer() {
  local node=$1 cmd=$2 want try
  want=$([ "$cmd" = freeze ] && echo frozen || echo thawed)
  for try in 1 2 3 4 5 6 7 8 9 10; do
    freezer_write "$node" "$cmd"
    for _ in $(seq 1 10); do
      if freezer_is "$node" "$want"; then
        log "$node: $cmd (attempt $try)"
        return 0
      fi
      sleep 0.05
    done
    [ "$cmd" = freeze ] || continue
    freezer_write "$node" thaw
    sleep 0.05
  done
  [ "$cmd" = freeze ] && freezer_write "$node" thaw
  echo "node.sh: $node did not become $want in 10 attempts" >&2
  return 1
}

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
    set_freezer "$node" "$cmd" ;;
  netem)
    peer=${1:?netem needs a peer node, clear, or stats PEER}
    shift
    case $peer in
      clear) netem_clear "$node" ;;
      stats)
        p=${1:?netem stats needs a peer node}
        node_index "$p" >/dev/null || { echo "node.sh: no node $p" >&2; exit 2; }
        f=$(impair_stats "$node" "$p")
        [ -f "$f" ] || { echo "node.sh: no impair tool has run on $node for $p (no $f; tc netem keeps no counters)" >&2; exit 1; }
        impair_json "$node" "$p" ;;
      *)
        pidx=$(node_index "$peer") || { echo "node.sh: no node $peer" >&2; exit 2; }
        [ $# -gt 0 ] || { echo "node.sh: netem needs its parameters, e.g. loss 5% reorder 5% delay 1ms" >&2; exit 2; }
        netem_clear "$node" >/dev/null
        rc=0
        netem_tc "$node" "$pidx" "$@" || rc=$?
        case $rc in
          0) log "$node to $peer: netem $*" ;;
          3) netem_impair "$node" "$peer" "$pidx" "$@"; log "$node to $peer: impair (no netem in this kernel) $*" ;;
          *) exit 1 ;;
        esac ;;
    esac ;;
  stop) stop "$node" "${1:?stop needs a component}" ;;
  start)
    comp=${1:?start needs a component}
    case $comp in
      containerd|kubelet|kube-proxy) NODES=$NODES "$here/up.sh" >/dev/null ;;
      *) echo "node.sh: start containerd, kubelet or kube-proxy (up.sh starts the rest)" >&2; exit 2 ;;
    esac ;;
  *) usage ;;
esac
