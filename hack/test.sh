#!/usr/bin/env bash
# The README's test command: every Go test with the race detector, against a
# real kube-apiserver (envtest) built from source by hack/envtest.sh; then,
# without the race detector, the packages whose tests assert what holds only
# without it (allocation counts, memory measures, no spurious retransmission).
# First, the Debian packages the tests need (hack/deps.sh test: installs
# them as root, else says what to install).
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
# The second pass: every package with a test file built only without the
# race detector (//go:build !race: norace_test.go, which sets raceEnabled
# for the tests that check more without it, or alloc_test.go), whole, one
# package at a time, so that no other package's tests stall its pollers.
mapfile -t norace < <(grep -rlx --include='*_test.go' '//go:build !race' . |
  xargs -n1 dirname | sort -u)
go test -count=1 -p 1 -timeout 10m "$@" "${norace[@]}"
