#!/usr/bin/env bash
# Runs a command in one or two rxe test guests (Debian kernel, rdma_rxe on
# eth0 as rxe0) and returns its exit status: the largest of the guests'.
#
#   run.sh [-g GUESTS] [-t SECONDS] [-f FILE]... [-H HOSTCMD] [-k] -- COMMAND [ARG]...
#
# FILEs are copied into the guests' working directory (/payload, a 9p share
# of a host directory), where COMMAND runs as root under sh with
# RDMAVISOR_GUEST_INDEX (0, 1), RDMAVISOR_GUEST_IP and RDMAVISOR_PEER_IP set.
# Guests are bridged (br0, 10.99.0.0/24, MTU 9000) in a network namespace
# this script creates and deletes; nothing leaves it. Their output comes
# back on stdout; -k keeps the work directory (consoles, outputs).
# -H gives br0 the address 10.99.0.1/24 and runs HOSTCMD (sh -c) in the
# namespace, in this directory, alongside the guests, with RDMAVISOR_HOST_IP,
# RDMAVISOR_GUEST_IPS (space-separated), RDMAVISOR_PAYLOAD (the guests'
# /payload) and RDMAVISOR_NETNS set; its output follows the guests' and its
# exit status counts with theirs. Run as root.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
GUESTS=1 TIMEOUT=600 KEEP=0 FILES=() HOSTCMD=
while getopts "g:t:f:H:k" o; do
	case $o in
	g) GUESTS=$OPTARG ;;
	t) TIMEOUT=$OPTARG ;;
	f) FILES+=("$OPTARG") ;;
	H) HOSTCMD=$OPTARG ;;
	k) KEEP=1 ;;
	*) sed -n '2,18p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
case $GUESTS in 1 | 2) ;; *) echo "rxe-vm: -g takes 1 or 2" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "rxe-vm: run.sh must run as root" >&2; exit 1; }
log() { echo "[rxe-vm $(date +%T)] $*" >&2; }

IMG=$("$HERE/build.sh")
W=$(mktemp -d /tmp/rxe-vm.XXXXXX)
P=$W/payload
mkdir -p "$P"
for f in "${FILES[@]}"; do cp -L "$f" "$P/"; done
printf '%q ' "$@" >"$P/run"
echo >>"$P/run"

NS=rdmavisor-rxe-$$
PIDS=() HOSTPID=
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
	local rc=$?
	for pid in "${PIDS[@]}" $HOSTPID; do kill "$pid" 2>/dev/null || true; done
	# Whatever else still runs in the namespace is ours: it was made here.
	for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
	ip netns del "$NS" 2>/dev/null || true
	if [ "$KEEP" = 1 ]; then log "kept $W"; else rm -rf "$W"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add br0 type bridge
ip -n "$NS" link set br0 mtu 9000 up
for i in $(seq 0 $((GUESTS - 1))); do
	ip -n "$NS" tuntap add dev "tap$i" mode tap
	ip -n "$NS" link set "tap$i" mtu 9000 master br0 up
done

HOSTIP=10.99.0.1
[ -z "$HOSTCMD" ] || ip -n "$NS" addr add "$HOSTIP/24" dev br0

start=$(date +%s%N)
for i in $(seq 0 $((GUESTS - 1))); do
	ip=10.99.0.$((2 + i)) peer=10.99.0.$((3 - i))
	ip netns exec "$NS" timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -m 2048 -smp 2 \
		-nographic -no-reboot -kernel "$IMG/vmlinuz" -initrd "$IMG/base.cpio" \
		-append "console=ttyS0 quiet loglevel=3 panic=-1 rvidx=$i rvip=$ip rvpeer=$peer rvmtu=9000" \
		-netdev "tap,id=n0,ifname=tap$i,script=no,downscript=no" \
		-device "virtio-net-pci,netdev=n0,mac=52:54:00:99:00:$(printf %02x $((2 + i)))" \
		-virtfs "local,path=$P,mount_tag=payload,security_model=none,id=payload" \
		</dev/null >"$W/console-$i.log" 2>&1 &
	PIDS+=($!)
done
log "booted $GUESTS guest(s), namespace $NS, work $W"
if [ -n "$HOSTCMD" ]; then
	gips=$(for i in $(seq 0 $((GUESTS - 1))); do printf '10.99.0.%d ' $((2 + i)); done)
	(
		rc=0
		RDMAVISOR_HOST_IP=$HOSTIP RDMAVISOR_GUEST_IPS=${gips% } RDMAVISOR_PAYLOAD=$P RDMAVISOR_NETNS=$NS \
			ip netns exec "$NS" timeout "$TIMEOUT" sh -c "$HOSTCMD" >"$W/host.log" 2>&1 </dev/null || rc=$?
		echo "$rc" >"$W/host.rc"
	) &
	HOSTPID=$!
fi
for pid in "${PIDS[@]}" $HOSTPID; do wait "$pid" || true; done
PIDS=() HOSTPID=
ms=$((($(date +%s%N) - start) / 1000000))
log "guests done in $((ms / 1000)).$(printf %03d $((ms % 1000))) s"

rc=0
for i in $(seq 0 $((GUESTS - 1))); do
	if [ -f "$P/out-$i.log" ]; then
		sed "s/^/[guest $i] /" "$P/out-$i.log"
	fi
	if [ -f "$P/rc-$i" ]; then
		r=$(cat "$P/rc-$i")
		log "guest $i: exit $r"
	else
		r=125
		log "guest $i: no exit status (timeout after ${TIMEOUT}s or a crash); its console:"
		tail -n 40 "$W/console-$i.log" | sed "s/^/[console $i] /" >&2
	fi
	[ "$r" -gt "$rc" ] && rc=$r
done
if [ -n "$HOSTCMD" ]; then
	sed "s/^/[host] /" "$W/host.log"
	r=$(cat "$W/host.rc" 2>/dev/null || echo 125)
	log "host: exit $r"
	[ "$r" -gt "$rc" ] && rc=$r
fi
exit "$rc"
