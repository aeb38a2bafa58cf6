#!/usr/bin/env bash
# make test-rxe: the libibverbs backend against the Linux kernel's rxe.
# Builds internal/verbs/ibv's tests (tag ibverbs; the conformance suite
# among them, its fault cases over a lossy veth pair between two rxe
# devices) and runs them in one rxe guest, then checks guest-to-guest
# RoCEv2 across the bridge with ibv_rc_pingpong in two guests, and runs two
# node agents on the ibverbs provider, one per guest, with 1,000 vconns
# echoing between them over auto and over rc, every byte checked
# (agents.sh). Run as root.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
GO=${GO:-go}
log() { echo "[rxe-vm $(date +%T)] $*" >&2; }
[ "$(id -u)" -eq 0 ] || { echo "rxe-vm: test.sh must run as root" >&2; exit 1; }
hack/deps.sh rxe
OUT=$(mktemp -d /tmp/rxe-test.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
start=$SECONDS
# On the host, which has no RDMA device: selection and its errors there.
CGO_ENABLED=1 "$GO" test -count=1 -tags ibverbs -run 'TestConfig|TestOpenWithoutDevices' ./internal/verbs/ibv
CGO_ENABLED=1 "$GO" build -tags ibverbs -o "$OUT/node-agent" ./cmd/node-agent
CGO_ENABLED=1 "$GO" build -tags ibverbs -o "$OUT/rdmavisor" ./cmd/rdmavisor
CGO_ENABLED=1 "$GO" test -c -tags ibverbs -o "$OUT/ibv.test" ./internal/verbs/ibv
# Each step's output also goes to a file: a CI log keeps only its head and
# tail, so a failed step's failing lines are repeated at the end.
failed=() n=0
step() {
	local name=$1 r=0
	shift
	n=$((n + 1))
	"$@" 2>&1 | tee "$OUT/step-$n.log" || r=$?
	log "$name: exit $r"
	[ "$r" -eq 0 ] || failed+=("$n")
}
step "ibv tests" hack/rxe-vm/run.sh -t 600 -f "$OUT/ibv.test" -- \
	env RDMAVISOR_RXE_VM=1 ./ibv.test -test.v -test.timeout 540s -test.skip TestOpenWithoutDevices
# The engine's device tests, the device errors and an agent waiting for a
# bad device, on rxe0.
step "engine tests, device errors, a waiting agent on rxe0" hack/rxe-vm/engine.sh
# The soft provider on the host against rxe in a guest, on the wire.
step "soft <-> rxe interop" hack/rxe-vm/interop.sh
step "two guests, ibv_rc_pingpong" hack/rxe-vm/run.sh -g 2 -t 300 -f hack/rxe-vm/pingpong.sh -- sh pingpong.sh
for tr in auto rc; do
	step "two guests, two ibverbs node agents, 1,000 vconns echoing over $tr" \
		hack/rxe-vm/run.sh -g 2 -t 420 -f "$OUT/rdmavisor" -f hack/rxe-vm/agents.sh -- env TRANSPORT=$tr sh agents.sh
done
log "test-rxe took $((SECONDS - start)) s"
[ ${#failed[@]} -eq 0 ] && exit 0
for i in "${failed[@]}"; do
	log "FAILED: step $i; its failing lines, then its last 40:"
	grep -E -e '--- FAIL|^FAIL|panic:|exit [1-9]|timed out|[Ee]rror:' "$OUT/step-$i.log" | head -40 >&2 || true
	tail -40 "$OUT/step-$i.log" >&2
done
log "test-rxe FAILED: steps ${failed[*]} (1 ibv, 2 engine, 3 interop, 4 pingpong, 5 agents auto, 6 agents rc)"
exit 1
