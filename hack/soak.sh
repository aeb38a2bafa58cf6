#!/usr/bin/env bash
# The soak (make soak DURATION=10m; not part of CI): the end-to-end
# cluster (hack/e2e.sh: three nodes by default), then test/e2e's TestSoak
# for DURATION: checkers between every pair of nodes while agents are
# killed, kubelets restarted, links impaired and the operator restarted at
# random. It prints the report, a table, and writes it to
# bench/results/soak.md (SOAK_REPORT).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10m}
export E2E_SOAK_DURATION=$DURATION
export E2E_SOAK_REPORT=${SOAK_REPORT:-$PWD/bench/results/soak.md}
mkdir -p "$(dirname "$E2E_SOAK_REPORT")"
exec hack/e2e.sh -run '^TestSoak$' -timeout 3h
