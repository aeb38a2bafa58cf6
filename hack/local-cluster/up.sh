#!/usr/bin/env bash
# Brings up a Kubernetes cluster of NODES nodes on this one machine, built
# from source, for the end-to-end tests (test/e2e) and for trying RDMAvisor
# without a cloud. Each node is its own network, mount, PID and UTS
# namespaces, as kind's node containers are (lib.sh, node-init.sh), with
# its own containerd (hack/containerd-build.sh: 1.7, for CDI; runc is Debian's), kubelet and kube-proxy, node IP, pod CIDR
# and hostPath directories; the nodes hang off one bridge on the host and
# route each other's pod CIDRs. The control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) runs on the first node. The
# binaries are built by hack/k8s-build.sh through the Go module proxy and
# cached. No Docker, no registry: images are imported into each node's
# containerd (hack/images.sh, then node.sh NODE import TARBALL).
#
#   NODES=3 hack/local-cluster/up.sh   # idempotent: starts what is not running
#   hack/local-cluster/up.sh --restart kubelet [NODE]   # stop one component, start it again
#   export KUBECONFIG=$(hack/local-cluster/up.sh --kubeconfig)
#   hack/local-cluster/node.sh ...     # a node's shell, freeze, netem, import
#   hack/local-cluster/down.sh         # stops everything, leaves the host clean
#
# Needs root. Each node's processes are recorded in $STATE/run/NODE/*.pid;
# logs are in $STATE/logs. The kubeconfig's path is the last line printed.
#
# Env: STATE (default /var/tmp/rdmavisor-cluster), NODES (default 1),
# NODE_PREFIX (default node: nodes node-1, node-2, ...), NODE_NET (the
# nodes' /24 on the bridge, default 172.30.213), BRIDGE (default rdmav0),
# K8S_VERSION and RDMAVISOR_CACHE (see hack/k8s-build.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
want_nodes=${NODES:-}
# shellcheck source=hack/local-cluster/lib.sh
. "$here/lib.sh"

restart='' restart_node=''
case "${1:-}" in
  --kubeconfig) echo "$kubeconfig"; exit 0 ;;
  --restart) restart=${2:?--restart needs a component name}; restart_node=${3:-} ;;
  "") ;;
  *) echo "usage: $0 [--kubeconfig | --restart COMPONENT [NODE]]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "local-cluster: run as root (namespaces, containerd, kubelet)" >&2; exit 1; }
if [ -n "$want_nodes" ] && [ "$want_nodes" != "$NODES" ] && [ -f "$STATE/cluster.env" ]; then
  echo "local-cluster: a cluster of $NODES nodes is up in $STATE; run hack/local-cluster/down.sh first" >&2
  exit 1
fi
NODES=${want_nodes:-$NODES}
[[ $NODES =~ ^[1-9]$ ]] || { echo "local-cluster: NODES must be 1 to 9, not $NODES" >&2; exit 2; }
first=$(node_name 1)
api_ip=$(node_ip 1)
mkdir -p "$STATE"/{logs,run,bin,nodes} "$pki"
cat >"$STATE/cluster.env" <<EOF
NODES=$NODES
NODE_PREFIX=$NODE_PREFIX
NODE_NET=$NODE_NET
BRIDGE=$BRIDGE
MTU=$MTU
EOF

deps() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v curl >/dev/null || missing+=(curl)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
  fi
}

binaries() {
  local bin
  bin=$("$repo/hack/k8s-build.sh" etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
    ln -sf "$bin/$b" "$STATE/bin/$b"
  done
  # containerd built from source (>= 1.7, which applies CDI devices), with
  # its runc shim; runc is Debian's.
  bin=$("$repo/hack/containerd-build.sh")
  for b in containerd containerd-shim-runc-v2 ctr; do
    ln -sf "$bin/$b" "$STATE/bin/$b"
  done
  if [ ! -f "$STATE/pause.tar" ]; then
    log "building the pause image"
    CGO_ENABLED=0 go build -C "$repo" -trimpath -ldflags '-s -w' -o "$STATE/bin/pause" ./hack/local-cluster/pause
    go run -C "$repo" ./hack/cmd/mkimage -single "$STATE/bin/pause" -tag registry.k8s.io/pause:3.10 -out "$STATE/pause.tar" >&2
  fi
}

# cert NAME SUBJECT EXT [SANS]: a key and a certificate signed by the CA.
cert() {
  local name=$1 subj=$2 ext=$3 sans=${4:-}
  [ -f "$pki/$name.crt" ] && return 0
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$ext"
    [ -z "$sans" ] || echo "subjectAltName=$sans"
  } >"$pki/$name.ext"
  openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

# kubeconfig_for NAME: a kubeconfig for the client certificate NAME. Every
# client, on any node or on the host, reaches the API server at the first
# node's address.
kubeconfig_for() {
  cat >"$pki/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {certificate-authority: $pki/ca.crt, server: "https://$api_ip:6443"}
users:
- name: $1
  user: {client-certificate: $pki/$1.crt, client-key: $pki/$1.key}
contexts:
- name: local
  context: {cluster: local, user: $1}
current-context: local
EOF
}

certs() {
  # Certificates name the nodes and their IPs: another layout means new ones.
  local layout i name ip
  layout="$NODES $NODE_PREFIX $NODE_NET"
  if [ "$(cat "$pki/.layout" 2>/dev/null)" != "$layout" ]; then
    rm -rf "${pki:?}"/* && echo "$layout" >"$pki/.layout"
  fi
  if [ ! -f "$pki/ca.crt" ]; then
    log "generating certificates"
    openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -nodes -key "$pki/ca.key" -subj /CN=rdmavisor-local-ca -days 3650 -out "$pki/ca.crt"
  fi
  local sans="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$first,IP:127.0.0.1,IP:10.96.0.1,IP:$api_ip"
  cert apiserver /CN=kube-apiserver serverAuth "$sans"
  cert admin /O=system:masters/CN=kubernetes-admin clientAuth
  cert kcm /CN=system:kube-controller-manager clientAuth
  cert scheduler /CN=system:kube-scheduler clientAuth
  cert kube-proxy /CN=system:kube-proxy clientAuth
  cert apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client clientAuth
  for ((i = 1; i <= NODES; i++)); do
    name=$(node_name "$i") ip=$(node_ip "$i")
    cert "kubelet-serving-$name" "/CN=$name" serverAuth "DNS:$name,DNS:localhost,IP:127.0.0.1,IP:$ip"
    cert "kubelet-$name" "/O=system:nodes/CN=system:node:$name" clientAuth
    kubeconfig_for "kubelet-$name"
  done
  [ -f "$pki/sa.key" ] || { openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null && openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null; }
  for k in admin kcm scheduler kube-proxy; do kubeconfig_for "$k"; done
}

# fabric: the bridge the nodes hang off, and the host's routes to the
# pods (the suite, on the host, reaches pod IPs as it would on a node).
# Nothing of the cluster leaves the machine: the nodes have no default
# route, and the host drops what the bridge would forward elsewhere. With
# br_netfilter loaded, bridged frames pass the host's FORWARD chain:
# accept the bridge's own.
fabric() {
  local i
  modprobe br_netfilter 2>/dev/null || true
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" mtu "$MTU" type bridge
    ip addr add "$NODE_NET.1/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  for rule in "-i $BRIDGE ! -o $BRIDGE -j DROP" "-i $BRIDGE -o $BRIDGE -j ACCEPT"; do
    # shellcheck disable=SC2086 # a rule is words
    iptables -C FORWARD $rule -m comment --comment rdmavisor-local-cluster 2>/dev/null ||
      iptables -I FORWARD $rule -m comment --comment rdmavisor-local-cluster
  done
  for ((i = 1; i <= NODES; i++)); do
    ip route replace "$(pod_cidr "$i")" via "$(node_ip "$i")" dev "$BRIDGE"
  done
}

# boot I: the node's namespaces, its link on the bridge, routes to the
# other nodes' pod CIDRs, its cgroups and files.
boot() {
  local i=$1 name ip dir run cg d j unshare_pid pid
  name=$(node_name "$i") ip=$(node_ip "$i") dir=$(node_dir "$name") run=$(node_run "$name")
  node_alive "$name" && return 0
  log "booting node $name ($ip)"
  mkdir -p "$dir/root" "$run"
  # The hostPath directories must exist on the host to be mounted over;
  # the ones made here are removed by down.sh.
  for d in "${NODE_DIRS[@]}"; do
    [ -d "/$d" ] || { mkdir -p "/$d" && echo "/$d" >>"$STATE/made-dirs"; }
  done
  # Its cgroups: the kubelet's cgroupRoot in every hierarchy. A cpuset
  # must have CPUs and memory nodes before it takes a task.
  for cg in $(cgroup_dirs "$name"); do
    mkdir -p "$cg"
    if [ -f "$cg/cpuset.cpus" ] && [ -z "$(cat "$cg/cpuset.cpus")" ]; then
      cat "$(dirname "$cg")/cpuset.cpus" >"$cg/cpuset.cpus"
      cat "$(dirname "$cg")/cpuset.mems" >"$cg/cpuset.mems"
    fi
  done
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    sed 's/\([a-z_]*\)/+\1/g' /sys/fs/cgroup/cgroup.subtree_control >"$(freezer_dir "$name")/cgroup.subtree_control" 2>/dev/null || true
  fi
  rm -f "$run/ready"
  setsid bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$(freezer_dir "$name")" \
    unshare --net --mount --pid --uts --fork --propagation private --mount-proc \
    "$here/node-init.sh" "$name" "$dir/root" "$run/ready" "${NODE_DIRS[@]}" \
    >"$STATE/logs/$name-init.log" 2>&1 </dev/null &
  unshare_pid=$!
  for _ in $(seq 1 100); do [ -f "$run/ready" ] && break; sleep 0.1; done
  pid=$(pgrep -P "$unshare_pid" | head -n 1)
  [ -f "$run/ready" ] && [ -n "$pid" ] || { log "node $name did not boot:"; cat "$STATE/logs/$name-init.log" >&2; return 1; }
  echo "$pid" >"$run/init.pid"
  # Its link: eth0 inside, rv-NAME on the bridge.
  ip link del "rv-$i" 2>/dev/null || true
  ip link add "rv-$i" mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "/proc/$pid/ns/net"
  ip link set "rv-$i" master "$BRIDGE" up
  in_node "$name" ip addr add "$ip/24" dev eth0
  in_node "$name" ip link set eth0 up
  for ((j = 1; j <= NODES; j++)); do
    [ "$j" = "$i" ] || in_node "$name" ip route add "$(pod_cidr "$j")" via "$(node_ip "$j")"
  done
  # Service IPs need a route before kube-proxy's DNAT picks an endpoint;
  # one without an endpoint ends at the host, which drops it.
  in_node "$name" ip route add "$SERVICE_CIDR" via "$NODE_NET.1"
  in_node "$name" sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward; echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true'
  # Its files: CNI plugins (Debian's), the pod network, containerd, kubelet.
  mkdir -p "$dir/root/opt/cni/bin" "$dir/root/etc/cni/net.d" "$dir/kubelet"
  for p in /usr/lib/cni/*; do ln -sfn "$p" "$dir/root/opt/cni/bin/$(basename "$p")"; done
  sed "s#@SUBNET@#$(pod_cidr "$i")#" "$here/10-local-bridge.conflist" >"$dir/root/etc/cni/net.d/10-local-bridge.conflist"
  sed -e "s#@PKI@#$pki#g" -e "s#@NODE@#$name#g" -e "s#@CGROUP@#/$(node_cgroup "$name")#g" \
    "$here/kubelet-config.yaml" >"$dir/kubelet/config.yaml"
}

control_plane() {
  local b=$STATE/bin
  start "$first" etcd "$b/etcd" --name local --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster local=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810
  wait_for etcd 60 in_node "$first" curl -sf http://127.0.0.1:23790/health
  # The apiserver refuses to advertise 127.0.0.1 (its endpoint reconciler
  # needs a routable address): bind everywhere, advertise the node IP.
  start "$first" kube-apiserver "$b/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 \
    --bind-address=0.0.0.0 --advertise-address="$api_ip" --secure-port=6443 \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" --client-ca-file="$pki/ca.crt" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --allow-privileged=true
  wait_for kube-apiserver 120 "$b/kubectl" --kubeconfig "$kubeconfig" get --raw /readyz
  start "$first" kube-controller-manager "$b/kube-controller-manager" --kubeconfig="$pki/kcm.kubeconfig" \
    --authentication-kubeconfig="$pki/kcm.kubeconfig" --authorization-kubeconfig="$pki/kcm.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR"
  start "$first" kube-scheduler "$b/kube-scheduler" --kubeconfig="$pki/scheduler.kubeconfig" \
    --authentication-kubeconfig="$pki/scheduler.kubeconfig" --authorization-kubeconfig="$pki/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
}

# node_components I: containerd, the kubelet and kube-proxy of node I.
node_components() {
  local i=$1 name ip dir
  name=$(node_name "$i") ip=$(node_ip "$i") dir=$(node_dir "$name")
  # PATH: containerd finds its shim there before Debian's.
  start "$name" containerd env PATH="$STATE/bin:$PATH" "$STATE/bin/containerd" --config "$here/containerd.toml"
  wait_for "$name-containerd" 30 in_node "$name" ctr version
  in_node "$name" ctr -n k8s.io images import "$STATE/pause.tar" >&2
  start "$name" kubelet "$STATE/bin/kubelet" --config="$dir/kubelet/config.yaml" \
    --kubeconfig="$pki/kubelet-$name.kubeconfig" --hostname-override="$name" --node-ip="$ip" \
    --root-dir=/var/lib/kubelet -v=2
  start "$name" kube-proxy "$STATE/bin/kube-proxy" --kubeconfig="$pki/kube-proxy.kubeconfig" --hostname-override="$name" \
    --proxy-mode=iptables --cluster-cidr="$POD_NET.0.0/16" --conntrack-max-per-core=0 \
    --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256
}

began=$SECONDS
if [ -n "$restart" ]; then
  restart_node=${restart_node:-$first}
  f="$(node_run "$restart_node")/$restart.pid"
  [ -f "$f" ] || { log "$restart was not started on $restart_node by up.sh"; exit 1; }
  log "restarting $restart on $restart_node ($(cat "$f"))"
  stop "$restart_node" "$restart"
fi
deps
binaries
certs
fabric
for ((i = 1; i <= NODES; i++)); do boot "$i"; done
control_plane
for ((i = 1; i <= NODES; i++)); do node_components "$i"; done
k=("$STATE/bin/kubectl" --kubeconfig "$kubeconfig")
for ((i = 1; i <= NODES; i++)); do
  name=$(node_name "$i")
  wait_for "$name-kubelet" 120 "${k[@]}" get node "$name"
done
"${k[@]}" wait --for=condition=Ready node --all --timeout=180s >&2
wait_for kube-controller-manager 60 "${k[@]}" get serviceaccount default
log "$NODES node(s) ready in $((SECONDS - began))s: $(for ((i = 1; i <= NODES; i++)); do echo -n "$(node_name "$i")=$(node_ip "$i") "; done)"
log "kubectl: $STATE/bin/kubectl; a node's shell: hack/local-cluster/node.sh $first sh"
echo "$kubeconfig"
