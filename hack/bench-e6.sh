#!/usr/bin/env bash
# E6, the ladder (test/ladder): every way a program reaches a vconn (the
# engine called directly, package vconn on shared memory and on the socket,
# libvconn, the preload library under a plain TCP program, the Python
# package) and TCP on loopback (Go, and the C program without the preload
# library), between two agents, both ends on the same path. Runs the
# measurement quiet, then busy (two CPU-bound processes beside it, which the
# test starts and kills), and writes bench/results/: e6.txt (every round's
# figures, both runs), e6.md (a table per mode, medians over rounds) and
# e6-ladder.svg (p50 and p99 round trip per path, quiet and busy); and
# idle.md, the CPU two idle agents holding 1,000 open vconns each use.
# ROUNDS (default 7) and SCALE (a round's work, default 1) shape each run;
# QUICK=1 (as hack/bench.sh takes it) means ROUNDS=2 SCALE=0.2, a trial of
# the script, not a measurement. A full run took 5 minutes on the 2-CPU
# machine, with other work on it (load average 8 to 14): quiet 1m44s, busy
# 2m59s, the rest building.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=bench/results
rounds=${ROUNDS:-7}
scale=${SCALE:-1}
if [ -n "${QUICK:-}" ]; then rounds=${ROUNDS:-2} scale=${SCALE:-0.2}; fi
mkdir -p "$out"
: >"$out/e6.txt"
# Built once, run twice: the test binary carries nothing of the mode.
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go test -c -o "$bin/ladder.test" ./test/ladder/
# Each run's output is kept in a file too, named when the run fails: a
# failing round prints the agents' log and counters (test/ladder).
for mode in quiet busy; do
  echo "== E6, the ladder: $mode ($rounds rounds)" >&2
  log=$(mktemp "${TMPDIR:-/tmp}/e6-$mode-XXXXXX.log")
  if ! (cd test/ladder && RDMAVISOR_E6="$root/$out/e6.txt" RDMAVISOR_E6_MODE=$mode \
    RDMAVISOR_E6_ROUNDS=$rounds RDMAVISOR_E6_SCALE=$scale \
    "$bin/ladder.test" -test.run '^TestE6$' -test.v -test.timeout 60m) 2>&1 | tee "$log" >&2; then
    echo "E6 $mode failed; its output is kept in $log" >&2
    exit 1
  fi
  rm -f "$log"
done
# Beside the ladder: what two idle agents holding 1,000 open vconns each
# burn (TestIdleCPU), into idle.md.
(cd test/ladder && RDMAVISOR_IDLE_REPORT="$root/$out/idle.md" \
  "$bin/ladder.test" -test.run '^TestIdleCPU$' -test.v) >&2
go run ./hack/cmd/e6report -in "$out/e6.txt" -md "$out/e6.md" -svg "$out/e6-ladder.svg" >&2
cat "$out/e6.md"
