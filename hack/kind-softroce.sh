#!/usr/bin/env bash
# A kind cluster with RDMAvisor installed, for machines with a Docker engine.
#
#   hack/kind-softroce.sh up     create (or reuse) the cluster, give every node
#                                a Soft-RoCE link, load the image, install the
#                                chart and a sample RDMAService, wait for Ready
#   hack/kind-softroce.sh down   delete the cluster
#
# Needs: docker, kind, kubectl, Go (for hack/images.sh and hack/helm.sh), and
# for the Soft-RoCE links the host kernel's rdma_rxe module (kind nodes share
# the host kernel; the script loads it with modprobe when it can) and the
# `rdma` tool (iproute2) in the node image or, failing that, on the host.
#
# The image hack/images.sh builds is static (no cgo), so its agents use the
# software provider (RoCEv2 over UDP between the agents); the sample
# RDMAService is config/samples/rdmavisor_v1alpha1_rdmaservice_soft.yaml.
# The rxe0 links are there for an image built with the `ibverbs` tag and an
# RDMAService with provider ibverbs, and for tools such as ibv_devices.
#
# Env: CLUSTER (default rdmavisor), WORKERS (default 2), KIND_NODE_IMAGE
# (kind's default when empty), TAG (default local.test/rdmavisor:dev),
# NAMESPACE (default rdmavisor-system), TIMEOUT (default 300s).
set -euo pipefail
cd "$(dirname "$0")/.."

cluster=${CLUSTER:-rdmavisor}
workers=${WORKERS:-2}
tag=${TAG:-local.test/rdmavisor:dev}
namespace=${NAMESPACE:-rdmavisor-system}
timeout=${TIMEOUT:-300s}
sample=config/samples/rdmavisor_v1alpha1_rdmaservice_soft.yaml

log() { echo "kind-softroce: $*" >&2; }
die() { log "$*"; exit 1; }

need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null || die "$c is required and not on PATH"
  done
}

create_cluster() {
  if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
    log "Reusing kind cluster $cluster"
    return
  fi
  log "Creating kind cluster $cluster with $workers workers"
  local config i
  config=$(mktemp)
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "nodes:"
    echo "- role: control-plane"
    for ((i = 0; i < workers; i++)); do echo "- role: worker"; done
  } >"$config"
  local args=(create cluster --name "$cluster" --config "$config" --wait "$timeout")
  [ -z "${KIND_NODE_IMAGE:-}" ] || args+=(--image "$KIND_NODE_IMAGE")
  local rc=0
  kind "${args[@]}" || rc=$?
  rm -f "$config"
  return "$rc"
}

# add_rxe gives node a Soft-RoCE device rxe0 on its eth0, with the node
# image's rdma tool or else the host's, run in the node's network namespace.
add_rxe() {
  local node=$1 pid
  if docker exec "$node" rdma link show rxe0/1 >/dev/null 2>&1; then
    log "$node already has rxe0"
    return
  fi
  log "Adding Soft-RoCE link rxe0 on $node (eth0)"
  if docker exec "$node" sh -c 'command -v rdma' >/dev/null 2>&1; then
    docker exec "$node" rdma link add rxe0 type rxe netdev eth0
  else
    need rdma nsenter
    pid=$(docker inspect -f '{{.State.Pid}}' "$node")
    nsenter -t "$pid" -n rdma link add rxe0 type rxe netdev eth0
  fi
}

up() {
  need docker kind kubectl go
  if [ ! -d /sys/module/rdma_rxe ]; then
    modprobe rdma_rxe 2>/dev/null || die "the host kernel's rdma_rxe module is not loaded and modprobe failed: run 'sudo modprobe rdma_rxe'"
  fi
  create_cluster
  local node
  for node in $(kind get nodes --name "$cluster"); do
    add_rxe "$node"
  done

  local tarball
  tarball=$(TAG=$tag hack/images.sh --no-import | tail -n 1)
  log "Loading $tag into the nodes"
  kind load image-archive "$tarball" --name "$cluster"

  local helm
  helm=$(hack/helm.sh)
  kubectl config use-context "kind-$cluster" >/dev/null
  log "Installing the chart into namespace $namespace"
  "$helm" upgrade --install rdmavisor charts/rdmavisor \
    --namespace "$namespace" --create-namespace \
    --set image.repository="${tag%:*}" --set image.tag="${tag##*:}" --set image.pullPolicy=Never \
    --wait --timeout "$timeout"

  log "Applying $sample with image $tag"
  sed "s|image: local.test/rdmavisor:dev|image: $tag|" "$sample" | kubectl apply -f -
  log "Waiting for RDMAService soft to be Ready"
  kubectl wait rdmaservice/soft --for=condition=Ready --timeout="$timeout"
  kubectl get rdmaservices,rdmanodes
  kubectl -n "$namespace" get pods -o wide
}

down() {
  need kind
  log "Deleting kind cluster $cluster"
  kind delete cluster --name "$cluster"
}

case ${1:-up} in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 [up|down]" >&2; exit 2 ;;
esac
