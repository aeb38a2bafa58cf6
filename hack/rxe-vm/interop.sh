#!/usr/bin/env bash
# The soft provider against the kernel's rxe on one wire (issue 13, parts 4
# and 5): the host side of each check runs in run.sh's namespace on
# 10.99.0.1 (run.sh -H) on the soft provider's UDP wire, the other side in
# an rxe guest. Each check is one run.sh run:
#   verbs   internal/verbs/interop's tests: RC, UC and UD; SEND with and
#           without immediate, RDMA WRITE with and without immediate and
#           READ both ways, single- and multi-packet; one packet dropped at
#           a time (sequence NAKs, lost ACKs, lost read responses, either
#           side); remote access NAKs either way;
#   tools   the soft provider as ibv_rc_pingpong's client, then its server
#           (TestPingpong), then as the client and the server of perftest's
#           ib_send_bw and ib_write_bw (TestPerftest); the guest runs
#           interop-tools.sh;
#   agents  a node agent on the soft provider (host, interop-agent.sh)
#           serving one on the ibverbs provider (guest, agents.sh) over
#           VCONNS vconns, every byte checked, over auto and over rc.
# tshark captures the bridge during each check when it is installed
# (CAPTURE=DIR keeps the captures). CHECKS picks some (default: all,
# "verbs tools agents"). Run as root.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
GO=${GO:-go}
VCONNS=${VCONNS:-1000}
CHECKS=${CHECKS:-verbs tools agents}
log() { echo "[rxe-vm $(date +%T)] $*" >&2; }
[ "$(id -u)" -eq 0 ] || { echo "rxe-vm: interop.sh must run as root" >&2; exit 1; }
OUT=$(mktemp -d /tmp/rxe-interop.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
CAPTURE=${CAPTURE:-$OUT/captures}
mkdir -p "$CAPTURE"
start=$SECONDS
CGO_ENABLED=1 "$GO" test -c -tags ibverbs -o "$OUT/interop.test" ./internal/verbs/interop
CGO_ENABLED=1 "$GO" build -tags ibverbs -o "$OUT/rdmavisor" ./cmd/rdmavisor

# hostcmd NAME CMD: the run.sh -H command that runs CMD with tshark writing
# the bridge's traffic to $CAPTURE/NAME.pcapng, when tshark is here.
hostcmd() {
	if command -v tshark >/dev/null; then
		# tshark flushes its file when stopped with INT; run.sh's
		# cleanup would kill it outright.
		# shellcheck disable=SC2016 # expanded by the host command's shell
		printf 'tshark -q -i br0 -w %q/%s.pcapng >/dev/null 2>&1 & ts=$!; sleep 2; r=0; %s || r=$?; sleep 1; kill -INT $ts; wait $ts; exit $r' "$CAPTURE" "$1" "$2"
	else
		printf '%s' "$2"
	fi
}

rc=0
check() { # NAME RUN.SH-ARGS...
	local name=$1 r=0 t0=$SECONDS
	shift
	case " $CHECKS " in *" ${name%%-*} "*) ;; *) return 0 ;; esac
	hack/rxe-vm/run.sh "$@" || r=$?
	log "interop $name: exit $r ($((SECONDS - t0)) s)"
	[ "$r" -eq 0 ] || rc=$r
}
T=$OUT/interop.test
check verbs -t 600 -f "$T" -H "$(hostcmd verbs "RDMAVISOR_INTEROP=host $T -test.v -test.timeout 560s -test.skip '^(TestPingpong|TestPerftest)\$'")" -- \
	env RDMAVISOR_INTEROP=guest RDMAVISOR_HOST_IP=10.99.0.1 ./interop.test -test.v -test.timeout 560s -test.skip '^(TestPingpong|TestPerftest)$'
check tools -t 600 -f hack/rxe-vm/interop-tools.sh -H "$(hostcmd tools "RDMAVISOR_INTEROP=tools $T -test.v -test.timeout 560s -test.run '^(TestPingpong|TestPerftest)\$'")" -- \
	sh interop-tools.sh
for tr in auto rc; do
	check "agents-$tr" -t 600 -f "$OUT/rdmavisor" -f hack/rxe-vm/agents.sh \
		-H "$(hostcmd "agents-$tr" "sh hack/rxe-vm/interop-agent.sh $OUT/rdmavisor $tr $VCONNS")" -- \
		env RDMAVISOR_PEER_IP=10.99.0.1 TRANSPORT=$tr VCONNS="$VCONNS" sh agents.sh
done
log "interop took $((SECONDS - start)) s"
exit "$rc"
