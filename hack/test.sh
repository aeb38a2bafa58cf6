#!/usr/bin/env bash
# The README's test command: every Go test with the race detector, against a
# real kube-apiserver (envtest) built from source by hack/envtest.sh; then
# the allocation tests, which need a build without the race detector (it
# allocates on its own). First, the Debian packages the tests need
# (hack/deps.sh test: installs them as root, else says what to install).
set -euo pipefail
cd "$(dirname "$0")/.."
hack/deps.sh test
if [ -x hack/envtest.sh ]; then
  KUBEBUILDER_ASSETS="$(hack/envtest.sh)"
  export KUBEBUILDER_ASSETS
fi
# helm, built once from the Go module proxy, for charts/chart_test.go.
HELM="$(hack/helm.sh)"
export HELM
go test -race -count=1 -timeout 20m "$@" ./...
go test -count=1 -timeout 10m -run 'Alloc' "$@" ./...
