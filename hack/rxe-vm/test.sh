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
rc=0
hack/rxe-vm/run.sh -t 600 -f "$OUT/ibv.test" -- \
	env RDMAVISOR_RXE_VM=1 ./ibv.test -test.v -test.timeout 540s -test.skip TestOpenWithoutDevices || rc=$?
log "ibv tests: exit $rc"
# The engine's device tests, the device errors and an agent waiting for a
# bad device, on rxe0.
erc=0
hack/rxe-vm/engine.sh || erc=$?
log "engine tests, device errors, a waiting agent on rxe0: exit $erc"
# The soft provider on the host against rxe in a guest, on the wire.
irc=0
hack/rxe-vm/interop.sh || irc=$?
log "soft <-> rxe interop: exit $irc"
prc=0
hack/rxe-vm/run.sh -g 2 -t 300 -f hack/rxe-vm/pingpong.sh -- sh pingpong.sh || prc=$?
log "two guests, ibv_rc_pingpong: exit $prc"
arc=0
for tr in auto rc; do
	r=0
	hack/rxe-vm/run.sh -g 2 -t 420 -f "$OUT/rdmavisor" -f hack/rxe-vm/agents.sh -- env TRANSPORT=$tr sh agents.sh || r=$?
	log "two guests, two ibverbs node agents, 1,000 vconns echoing over $tr: exit $r"
	[ "$r" -eq 0 ] || arc=$r
done
log "test-rxe took $((SECONDS - start)) s"
[ "$rc" -eq 0 ] && [ "$erc" -eq 0 ] && [ "$irc" -eq 0 ] && [ "$prc" -eq 0 ] && [ "$arc" -eq 0 ]
