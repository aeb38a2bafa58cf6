#!/usr/bin/env bash
# Builds helm from the Go module proxy at a pinned version, once, into
# ${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/helm-<version>, and prints the
# binary's path. Later runs reuse the cached binary.
# Usage: HELM="$(hack/helm.sh)"
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.22.0}
# Minor version of the k8s.io modules in helm's go.mod (v0.37.x for v3.22.0).
HELM_K8S_MINOR=${HELM_K8S_MINOR:-37}
cache=${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}
dir="$cache/helm-$HELM_VERSION"
if [ ! -x "$dir/helm" ]; then
  echo "Building helm $HELM_VERSION into $dir (first run only, several minutes)" >&2
  mkdir -p "$dir"
  # Outside the repository's module, so go.mod is neither read nor touched.
  # The ldflags are those of helm's Makefile: without the Kubernetes version
  # (that of the k8s.io modules helm is built with), helm assumes v1.20.
  pkg=helm.sh/helm/v3
  ldflags="-s -w -X $pkg/internal/version.version=$HELM_VERSION"
  for p in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X $pkg/$p.k8sVersionMajor=1 -X $pkg/$p.k8sVersionMinor=$HELM_K8S_MINOR"
  done
  (cd "$dir" && GOFLAGS=-mod=mod GOBIN="$dir" CGO_ENABLED=0 \
    go install -trimpath -ldflags "$ldflags" "$pkg/cmd/helm@$HELM_VERSION") >&2
fi
echo "$dir/helm"
