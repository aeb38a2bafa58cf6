#!/usr/bin/env bash
# Regenerates generated code and fails if the tree changes.
# Usage: hack/verify.sh [CHECK...]   CHECK: tidy, generated, proto, chart (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."

tidy() {
  go mod tidy
  git diff --exit-code -- go.mod go.sum || { echo "go.mod/go.sum are not tidy"; exit 1; }
}

# generated: deepcopy, CRDs and the operator's RBAC role, by controller-gen.
# Generated files are removed first, so one whose source is gone shows up as
# a deletion; an untracked generated file shows up as untracked.
generated() {
  local dirs=(api config)
  rm -f api/*/zz_generated.deepcopy.go config/crd/bases/*.yaml config/rbac/role.yaml
  make --no-print-directory generate manifests
  local untracked
  untracked=$(git ls-files --others --exclude-standard -- "${dirs[@]}")
  if ! git diff --exit-code -- "${dirs[@]}" || [ -n "$untracked" ]; then
    [ -z "$untracked" ] || printf 'untracked (not in git):\n%s\n' "$untracked"
    echo "generated code or manifests are out of date: run 'make generate manifests' and commit the result"
    exit 1
  fi
}

# proto: the gRPC code generated from internal/**/*.proto by hack/protoc.sh.
proto() {
  hack/protoc.sh
  local untracked
  untracked=$(git ls-files --others --exclude-standard -- 'internal/*.pb.go')
  if ! git diff --exit-code -- 'internal/*.pb.go' || [ -n "$untracked" ]; then
    [ -z "$untracked" ] || printf 'untracked (not in git):\n%s\n' "$untracked"
    echo "generated protobuf code is out of date: run hack/protoc.sh and commit the result"
    exit 1
  fi
}

# chart: the Helm chart's CRDs are the generated ones, byte for byte
# (after `generated`, which regenerates config/crd/bases).
chart() {
  if ! diff -r config/crd/bases charts/rdmavisor/crds; then
    echo "charts/rdmavisor/crds differ from config/crd/bases: run 'make chart-crds' and commit the result"
    exit 1
  fi
}

for check in "${@:-tidy generated proto chart}"; do
  for c in $check; do
    case $c in
      tidy | generated | proto | chart) "$c" ;;
      *) echo "unknown check $c" >&2; exit 2 ;;
    esac
  done
done
