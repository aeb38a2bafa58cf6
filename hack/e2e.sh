#!/usr/bin/env bash
# End-to-end tests on a real Kubernetes cluster: a fresh local single-node
# cluster (hack/local-cluster, as root), the images imported into its
# containerd (hack/images.sh), helm (hack/helm.sh), then test/e2e. The
# cluster is torn down afterwards unless E2E_KEEP=1. Prints the wall time.
#
#   hack/e2e.sh [go test flags]      e.g. hack/e2e.sh -run 'TestE2E'
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
# The Debian packages the cluster and the suite need (containerd, runc, CNI
# plugins, iptables, ...): installed as root, else a message what to install.
hack/deps.sh e2e
export STATE=${STATE:-/var/tmp/rdmavisor-cluster}
# A fresh cluster: objects left by an earlier run would confuse the suite.
hack/local-cluster/down.sh >/dev/null 2>&1 || true
if [ "${E2E_KEEP:-0}" != 1 ]; then
  trap 'hack/local-cluster/down.sh' EXIT
fi
KUBECONFIG=$(hack/local-cluster/up.sh | tail -n 1)
hack/images.sh >/dev/null
HELM=$(hack/helm.sh)
KUBECTL=$STATE/bin/kubectl
# The suite runs on the node: it may check the node's CNI files.
E2E_CNI_CONF_DIR=/etc/cni/net.d E2E_CNI_BIN_DIR=/opt/cni/bin
export KUBECONFIG HELM KUBECTL E2E_CNI_CONF_DIR E2E_CNI_BIN_DIR
echo "e2e: cluster and images ready after $((SECONDS - began))s" >&2
status=0
go test -tags e2e -count=1 -timeout 25m -v "$@" ./test/e2e/ || status=$?
echo "e2e: wall time $((SECONDS - began))s (exit $status)" >&2
exit $status
