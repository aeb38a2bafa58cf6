#!/usr/bin/env bash
# Brings up a single-node Kubernetes cluster built from source, for the
# end-to-end tests (test/e2e) and for trying RDMAvisor without a cloud:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy (built by hack/k8s-build.sh through the Go module proxy and
# cached), on Debian's containerd, runc and CNI plugins. No Docker, no
# registry: images are imported into containerd (hack/images.sh).
#
#   hack/local-cluster/up.sh        # idempotent: starts what is not running
#   hack/local-cluster/up.sh --restart kubelet   # stop one component, start it again
#   export KUBECONFIG=$(hack/local-cluster/up.sh --kubeconfig)
#   hack/local-cluster/down.sh      # stops everything by PID, cleans up
#
# Needs root. Every process is recorded in $STATE/run/NAME.pid; logs are in
# $STATE/logs. The kubeconfig's path is the last line printed.
#
# Env: STATE (default /var/tmp/rdmavisor-cluster), NODE_NAME (default the
# host name), NODE_IP (default the source address of the default route),
# K8S_VERSION and RDMAVISOR_CACHE (see hack/k8s-build.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
STATE=${STATE:-/var/tmp/rdmavisor-cluster}
NODE_NAME=${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}
NODE_IP=${NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')}
pki=$STATE/pki
kubeconfig=$pki/admin.kubeconfig

restart=
case "${1:-}" in
  --kubeconfig) echo "$kubeconfig"; exit 0 ;;
  --restart) restart=${2:?--restart needs a component name} ;;
  "") ;;
  *) echo "usage: $0 [--kubeconfig | --restart COMPONENT]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "local-cluster: run as root (containerd, kubelet, iptables)" >&2; exit 1; }
[ -n "$NODE_IP" ] || { echo "local-cluster: cannot find the node IP; set NODE_IP" >&2; exit 1; }

log() { echo "local-cluster: $*" >&2; }
mkdir -p "$STATE"/{logs,run,bin} "$pki"

# running NAME: the recorded process is alive.
running() { [ -f "$STATE/run/$1.pid" ] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null; }

# start NAME CMD...: start CMD in its own session unless NAME runs already.
start() {
  local name=$1; shift
  if running "$name"; then return 0; fi
  log "starting $name"
  setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/run/$name.pid"
}

# wait_for WHAT SECONDS CMD...: poll CMD once a second.
wait_for() {
  local what=$1 secs=$2; shift 2
  for ((i = 0; i < secs; i++)); do
    if "$@" >/dev/null 2>&1; then log "$what ready after ${i}s"; return 0; fi
    sleep 1
  done
  log "$what not ready after ${secs}s; last log lines:"
  tail -n 20 "$STATE/logs/"*"$what"*.log >&2 2>/dev/null || true
  return 1
}

deps() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v conntrack >/dev/null || missing+=(conntrack)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
  fi
  # CNI plugins where Kubernetes nodes keep them (and where RDMAvisor's
  # installer puts its own).
  mkdir -p /opt/cni/bin
  for p in /usr/lib/cni/*; do
    [ -e "/opt/cni/bin/$(basename "$p")" ] || ln -s "$p" "/opt/cni/bin/$(basename "$p")"
  done
}

binaries() {
  local bin
  bin=$("$repo/hack/k8s-build.sh" etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
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

# kubeconfig NAME: a kubeconfig for the client certificate NAME.
kubeconfig_for() {
  cat >"$pki/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {certificate-authority: $pki/ca.crt, server: "https://127.0.0.1:6443"}
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
  # Certificates name the node IP: a new IP means new certificates.
  if [ "$(cat "$pki/.node" 2>/dev/null)" != "$NODE_NAME $NODE_IP" ]; then
    rm -rf "${pki:?}"/* && echo "$NODE_NAME $NODE_IP" >"$pki/.node"
  fi
  if [ ! -f "$pki/ca.crt" ]; then
    log "generating certificates"
    openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -nodes -key "$pki/ca.key" -subj /CN=rdmavisor-local-ca -days 3650 -out "$pki/ca.crt"
  fi
  local sans="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$NODE_NAME,IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP"
  cert apiserver /CN=kube-apiserver serverAuth "$sans"
  cert kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  cert admin /O=system:masters/CN=kubernetes-admin clientAuth
  cert kcm /CN=system:kube-controller-manager clientAuth
  cert scheduler /CN=system:kube-scheduler clientAuth
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert kube-proxy /CN=system:kube-proxy clientAuth
  cert apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client clientAuth
  [ -f "$pki/sa.key" ] || { openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null && openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null; }
  for k in admin kcm scheduler kubelet kube-proxy; do kubeconfig_for "$k"; done
}

control_plane() {
  local b=$STATE/bin
  start etcd "$b/etcd" --name local --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster local=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810
  wait_for etcd 60 curl -sf http://127.0.0.1:23790/health
  # The apiserver refuses to advertise 127.0.0.1 (its endpoint reconciler
  # needs a routable address): bind everywhere, advertise the node IP.
  start kube-apiserver "$b/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 \
    --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" --client-ca-file="$pki/ca.crt" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --allow-privileged=true
  wait_for kube-apiserver 120 "$b/kubectl" --kubeconfig "$kubeconfig" get --raw /readyz
  start kube-controller-manager "$b/kube-controller-manager" --kubeconfig="$pki/kcm.kubeconfig" \
    --authentication-kubeconfig="$pki/kcm.kubeconfig" --authorization-kubeconfig="$pki/kcm.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --service-cluster-ip-range=10.96.0.0/16
  start kube-scheduler "$b/kube-scheduler" --kubeconfig="$pki/scheduler.kubeconfig" \
    --authentication-kubeconfig="$pki/scheduler.kubeconfig" --authorization-kubeconfig="$pki/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
}

node() {
  echo 1 >/proc/sys/net/ipv4/ip_forward
  modprobe br_netfilter 2>/dev/null || true
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || true
  mkdir -p /etc/cni/net.d "$STATE/kubelet"
  [ -f /etc/cni/net.d/10-local-bridge.conflist ] || cp "$here/10-local-bridge.conflist" /etc/cni/net.d/
  start containerd containerd --config "$here/containerd.toml"
  wait_for containerd 30 ctr version
  ctr -n k8s.io images import "$STATE/pause.tar" >&2
  sed "s#@PKI@#$pki#g" "$here/kubelet-config.yaml" >"$STATE/kubelet/config.yaml"
  start kubelet "$STATE/bin/kubelet" --config="$STATE/kubelet/config.yaml" --kubeconfig="$pki/kubelet.kubeconfig" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --root-dir=/var/lib/kubelet -v=2
  start kube-proxy "$STATE/bin/kube-proxy" --kubeconfig="$pki/kube-proxy.kubeconfig" --hostname-override="$NODE_NAME" \
    --proxy-mode=iptables --cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 \
    --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256
  local k=("$STATE/bin/kubectl" --kubeconfig "$kubeconfig")
  wait_for kubelet 120 "${k[@]}" get node "$NODE_NAME"
  "${k[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s >&2
  wait_for kube-controller-manager 60 "${k[@]}" get serviceaccount default
}

began=$SECONDS
if [ -n "$restart" ]; then
  [ -f "$STATE/run/$restart.pid" ] || { log "$restart was not started by up.sh"; exit 1; }
  pid=$(cat "$STATE/run/$restart.pid")
  log "restarting $restart ($pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$STATE/run/$restart.pid"
fi
deps
binaries
certs
control_plane
node
log "node $NODE_NAME ($NODE_IP) ready in $((SECONDS - began))s; kubectl: $STATE/bin/kubectl"
echo "$kubeconfig"
