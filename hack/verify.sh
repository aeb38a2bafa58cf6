#!/usr/bin/env bash
# Regenerates generated code and fails if the tree changes.
set -euo pipefail
cd "$(dirname "$0")/.."
go mod tidy
git diff --exit-code -- go.mod go.sum || { echo "go.mod/go.sum are not tidy"; exit 1; }
