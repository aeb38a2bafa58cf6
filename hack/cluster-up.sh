#!/usr/bin/env bash
# A local cluster ready for RDMAvisor, as the README's quick start and the
# end-to-end suite use it: the cluster (hack/local-cluster/up.sh, NODES
# nodes, default 1), RDMAvisor's images built and imported into every
# node's containerd (no registry), and the cluster's DNS (hack/cmd/localdns)
# running, so pods resolve Services' names. Idempotent. As root. The last
# line printed is the kubeconfig's path.
#
#   NODES=3 hack/cluster-up.sh
set -euo pipefail
cd "$(dirname "$0")/.."
lc=hack/local-cluster
hack/deps.sh e2e >&2
export STATE=${STATE:-/var/tmp/rdmavisor-cluster}
t=$SECONDS
kubeconfig=$($lc/up.sh | tail -n 1)
echo "cluster-up: ${NODES:-1}-node cluster up in $((SECONDS - t))s" >&2
t=$SECONDS
out=$(hack/images.sh --no-import)
tarball=$(echo "$out" | tail -n 1)
dir=$(dirname "$tarball")
# The image the cluster will run, checked before it is imported: the tag is
# there, every library the agent loads, every binary a real one.
RDMAVISOR_IMAGE_TARBALL=$(realpath "$tarball") go test -count=1 -run '^TestImageTarball$' ./hack/cmd/mkimage/ >&2
for n in $($lc/node.sh list | awk '{print $1}'); do
  $lc/node.sh "$n" import "$dir"/*.tar >&2
done
echo "cluster-up: images built and imported in $((SECONDS - t))s" >&2
t=$SECONDS
KUBECONFIG=$kubeconfig "$STATE/bin/kubectl" apply -f $lc/dns.yaml >&2
KUBECONFIG=$kubeconfig "$STATE/bin/kubectl" -n kube-system rollout status deployment/localdns --timeout=180s >&2
echo "cluster-up: cluster DNS ready in $((SECONDS - t))s" >&2
echo "$kubeconfig"
