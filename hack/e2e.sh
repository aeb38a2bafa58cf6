#!/usr/bin/env bash
# End-to-end tests on a real Kubernetes cluster: a fresh local cluster of
# NODES nodes (default 3; hack/local-cluster, as root), the images imported
# into every node's containerd and the cluster's DNS (hack/cluster-up.sh),
# helm (hack/helm.sh), then test/e2e. The cluster is torn down afterwards unless E2E_KEEP=1, and the
# teardown must leave the host clean. Prints the wall time of each part.
#
#   hack/e2e.sh [go test flags]      e.g. hack/e2e.sh -run 'TestE2E'
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
# The Debian packages the cluster and the suite need (containerd, runc, CNI
# plugins, iptables, ...): installed as root, else a message what to install.
hack/deps.sh e2e
export STATE=${STATE:-/var/tmp/rdmavisor-cluster}
export NODES=${NODES:-3}
lc=hack/local-cluster
# A fresh cluster: objects left by an earlier run would confuse the suite.
$lc/down.sh >/dev/null 2>&1 || $lc/down.sh
if [ "${E2E_KEEP:-0}" != 1 ]; then
  trap '$lc/down.sh >/dev/null 2>&1; hack/prev-images.sh --clean' EXIT
fi
t=$SECONDS
# The cluster, the images imported into every node, the cluster's DNS: as
# the README's quick start has them (make cluster-up).
KUBECONFIG=$(hack/cluster-up.sh | tail -n 1)
echo "e2e: $NODES-node cluster, images and DNS ready in $((SECONDS - t))s" >&2
# The previous release's chart and images, which the suite upgrades from
# (hack/previous-release).
t=$SECONDS
E2E_PREV_CHART=$(hack/prev-images.sh | tail -n 1)
echo "e2e: the previous release's images ready in $((SECONDS - t))s" >&2
HELM=$(hack/helm.sh)
KUBECTL=$STATE/bin/kubectl
E2E_NODE_SH=$PWD/$lc/node.sh
export KUBECONFIG HELM KUBECTL E2E_NODE_SH E2E_PREV_CHART
echo "e2e: cluster and images ready after $((SECONDS - began))s" >&2
status=0
t=$SECONDS
# The suite is TestE2E; TestSoak runs through hack/soak.sh, which passes
# its own -run (the last -run wins).
out=$(mktemp)
# The suite writes its measured figures there after a run that passed.
export E2E_RESULTS=${E2E_RESULTS:-$PWD/bench/results/e2e.md}
go test -tags e2e -count=1 -timeout 40m -v -run '^TestE2E$' "$@" ./test/e2e/ 2>&1 | tee "$out" || status=$?
echo "e2e: suite took $((SECONDS - t))s (exit $status)" >&2
if [ "${E2E_KEEP:-0}" != 1 ]; then
  trap - EXIT
  t=$SECONDS
  # The teardown must leave nothing behind: a failure here fails the run.
  $lc/down.sh || status=1
  hack/prev-images.sh --clean || status=1
  echo "e2e: teardown took $((SECONDS - t))s" >&2
fi
# A failed step's messages again, last: CI keeps only a log's head and
# tail, and the state dump and the teardown push them out of both.
if [ "$status" != 0 ]; then
  echo "e2e: what failed:" >&2
  grep -E -A20 'step ".*" failed|--- FAIL|^panic:|^FAIL|test timed out' "$out" | grep -v -- '--- PASS' | tail -n 40 >&2 || true
fi
rm -f "$out"
echo "e2e: wall time $((SECONDS - began))s (exit $status)" >&2
exit $status
