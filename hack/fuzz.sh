#!/usr/bin/env bash
# Runs every Fuzz target in the module for a short time each ($1, default 10s).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r f; do
  dir=$(dirname "$f")
  for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | cut -d' ' -f2); do
    echo "fuzz $dir $target ($fuzztime)"
    go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" "$dir"
  done
done
