#!/usr/bin/env bash
# Compares two git revisions' performance in one run: builds each one's
# rdmavisor and engine test binary (in temporary worktrees), then runs
# hack/cmd/benchpair, which alternates them round by round and prints the
# after/before ratios. Usage: hack/bench-pair.sh BEFORE [AFTER] [benchpair flags]
# (AFTER defaults to the work tree as it is).
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: hack/bench-pair.sh BEFORE [AFTER] [benchpair flags]}
shift
after=
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then after=$1; shift; fi
tmp=$(mktemp -d)
trap 'for w in "$tmp"/src-*; do [ -d "$w" ] && git worktree remove --force "$w"; done; rm -rf "$tmp"' EXIT
build() { # build SRC OUT
  (cd "$1" && go build -o "$2/rdmavisor" ./cmd/rdmavisor && go test -c -o "$2/engine.test" ./internal/engine)
}
git worktree add --detach "$tmp/src-before" "$before" >/dev/null
build "$tmp/src-before" "$tmp/before"
if [ -n "$after" ]; then
  git worktree add --detach "$tmp/src-after" "$after" >/dev/null
  build "$tmp/src-after" "$tmp/after"
else
  build . "$tmp/after"
fi
go run ./hack/cmd/benchpair -before "$tmp/before" -after "$tmp/after" "$@"
