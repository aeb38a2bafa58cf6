# shellcheck shell=bash disable=SC2034 # sourced: its variables are the callers'.
# Shared by up.sh, down.sh and node.sh: the cluster's layout and how to run
# a command inside a node. Sourced, not run.
#
# A node is a set of namespaces (network, mount, PID, UTS), as kind's node
# containers are: its PID 1 is node-init.sh, started by unshare(1); every
# component of the node (containerd, kubelet, kube-proxy, and on the first
# node the control plane) joins those namespaces with nsenter(1). Each node
# has its own /run (tmpfs), /sys (its network's sysfs) and its own copies
# of the directories pods reach with hostPath (NODE_DIRS), bind-mounted from
# $STATE/nodes/NAME/root. Nodes hang off one bridge on the host, BRIDGE,
# with a jumbo MTU (RoCE v2 fabrics run 4 KiB RDMA MTU over 9000-byte frames).

STATE=${STATE:-/var/tmp/rdmavisor-cluster}
pki=$STATE/pki
kubeconfig=$pki/admin.kubeconfig

# The layout is written by up.sh into $STATE/cluster.env; a later call
# reads it there, so down.sh and node.sh need no flags.
if [ -f "$STATE/cluster.env" ]; then
  # shellcheck disable=SC1091
  . "$STATE/cluster.env"
fi
NODES=${NODES:-1}
NODE_PREFIX=${NODE_PREFIX:-node}
# NODE_NET.1 is the bridge's address on the host; node i is NODE_NET.(10+i).
NODE_NET=${NODE_NET:-172.30.213}
BRIDGE=${BRIDGE:-rdmav0}
MTU=${MTU:-9000}
POD_NET=10.244
SERVICE_CIDR=10.96.0.0/16

# The paths pods and node components reach through hostPath or use as
# their own state: one copy per node.
NODE_DIRS=(var/lib/kubelet var/lib/containerd var/lib/cni var/lib/rdmavisor var/log/pods var/log/containers etc/cni opt/cni/bin)

log() { echo "local-cluster: $*" >&2; }

node_name() { echo "$NODE_PREFIX-$1"; }
node_ip() { echo "$NODE_NET.$((10 + $1))"; }
pod_cidr() { echo "$POD_NET.$1.0/24"; }
# node_index NAME: the index of a node by name (1-based), or fails.
node_index() {
  local i
  for ((i = 1; i <= NODES; i++)); do
    [ "$(node_name "$i")" = "$1" ] && { echo "$i"; return 0; }
  done
  return 1
}
node_dir() { echo "$STATE/nodes/$1"; }
node_run() { echo "$STATE/run/$1"; }
# The node's PID 1, as the host sees it.
node_pid() { cat "$(node_run "$1")/init.pid" 2>/dev/null; }
node_alive() { local p; p=$(node_pid "$1") && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }
# The cgroup every process of a node lives under, in each hierarchy the
# kubelet uses: its cgroupRoot. The freezer's copy freezes the whole node.
node_cgroup() { echo "rdmavisor-$1"; }

# cgroup_dirs NAME: the node's cgroup directories (v1: one per hierarchy;
# v2: one).
cgroup_dirs() {
  local cg
  cg=$(node_cgroup "$1")
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo "/sys/fs/cgroup/$cg"
  else
    for h in /sys/fs/cgroup/*/; do
      [ -f "$h/cgroup.procs" ] && echo "${h%/}/$cg"
    done
  fi
  return 0
}
# freezer_dir NAME: where the node's freezer state is.
freezer_dir() {
  local cg
  cg=$(node_cgroup "$1")
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "/sys/fs/cgroup/$cg"; else echo "/sys/fs/cgroup/freezer/$cg"; fi
}

# in_node NAME CMD...: run CMD in the node's namespaces and cgroup (the
# caller waits for it).
in_node() {
  local name=$1 pid
  shift
  pid=$(node_pid "$name") || { log "node $name is not running"; return 1; }
  nsenter -t "$pid" -n -m -p -u -- "$@"
}

# running NAME COMPONENT: the node's recorded process is alive.
running() {
  local f
  f="$(node_run "$1")/$2.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# start NAME COMPONENT CMD...: start CMD in the node's namespaces, in the
# node's freezer cgroup, in a session of its own, unless it runs already.
# The PID recorded is the component's own (as the host sees it), so a
# signal reaches it and not nsenter, which forwards none.
start() {
  local name=$1 comp=$2 run pid nspid child
  shift 2
  running "$name" "$comp" && return 0
  run=$(node_run "$name")
  pid=$(node_pid "$name") || { log "node $name is not running"; return 1; }
  log "starting $comp on $name"
  # The wrapper joins the node's freezer cgroup first, so the component
  # and all it starts (containerd's shims, the pods) are frozen with it.
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid bash -c 'for d in $1; do echo $$ >"$d/cgroup.procs"; done; shift; exec nsenter -t "$@"' _ \
    "$(freezer_dir "$name")" "$pid" -n -m -p -u -- "$@" >"$STATE/logs/$name-$comp.log" 2>&1 </dev/null &
  nspid=$!
  for _ in $(seq 1 100); do
    child=$(pgrep -P "$nspid" | head -n 1) && [ -n "$child" ] && break
    kill -0 "$nspid" 2>/dev/null || break
    sleep 0.05
  done
  [ -n "${child:-}" ] || { log "$comp on $name did not start; its log:"; tail -n 20 "$STATE/logs/$name-$comp.log" >&2; return 1; }
  echo "$child" >"$run/$comp.pid"
}

# stop NAME COMPONENT: TERM, then KILL after 10 s.
stop() {
  local f pid
  f="$(node_run "$1")/$2.pid"
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    # kube-apiserver may need a second SIGTERM to skip its graceful wait.
    kill -0 "$pid" 2>/dev/null && { kill -TERM "$pid"; sleep 2; }
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    log "stopped $2 on $1 ($pid)"
  fi
  rm -f "$f"
}

# wait_for WHAT SECONDS CMD...: poll CMD once a second.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs; i++)); do
    if "$@" >/dev/null 2>&1; then log "$what ready after ${i}s"; return 0; fi
    sleep 1
  done
  log "$what not ready after ${secs}s; last log lines:"
  for f in "$STATE/logs/"*"$what"*.log; do [ -f "$f" ] && tail -n 20 "$f" >&2; done
  return 1
}
