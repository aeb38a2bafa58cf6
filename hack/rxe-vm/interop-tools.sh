#!/bin/sh
# Guest side of interop.sh's tools check: rdma-core's ibv_rc_pingpong, then
# perftest's ib_send_bw and ib_write_bw, on rxe0 against the soft provider
# on the host (10.99.0.1), which plays their client first, then their
# server (TestPingpong, TestPerftest: in this order). The first failure
# ends it: the host side is out of step from there on.
P=/sys/class/infiniband/rxe0/ports/1
HOST=${HOST:-10.99.0.1}
GIDX=
for n in 0 1 2 3 4 5 6 7; do
	case "$(cat $P/gids/$n 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) GIDX=$n; break ;; esac
done
[ -n "$GIDX" ] || { echo "no IPv4 GID on rxe0"; exit 1; }
echo "== ibv_rc_pingpong server; the soft provider is its client"
timeout 240 ibv_rc_pingpong -d rxe0 -g "$GIDX" -n 500 -s 4096 || { echo "ibv_rc_pingpong server: exit $?"; exit 1; }
echo "== ibv_rc_pingpong client; the soft provider is its server"
i=0
until timeout 240 ibv_rc_pingpong -d rxe0 -g "$GIDX" -n 500 -s 4096 "$HOST"; do
	i=$((i + 1))
	[ $i -lt 60 ] || { echo "ibv_rc_pingpong client: never got through"; exit 1; }
	sleep 1
done
# perftest's ib_send_bw and ib_write_bw on RC (TestPerftest): for each, its
# server with the soft provider as client, then its client against the soft
# provider's server, -n 1000 with -s 4096 and 65536 each. Each one's exit
# status (ib_send_bw's server exits 0 only once it received all N) and its
# report (the line under "#bytes #iterations ...", which ib_write_bw's
# server takes from its client) are checked here; the soft side checks the
# rest.
# -F: perftest measures the CPU's clock before it reports, and in an
# emulated guest on a loaded host that measurement can fail ("Correlation
# coefficient r^2 < 0.9", "Can't produce a report", exit 1: a make test-rxe
# failed so); with -F it reports anyway. Its rates are not what is checked.
N=1000
perftest() { # TOOL SIZE [SERVER]
	out=/tmp/perftest.out
	timeout 120 "$1" -d rxe0 -x "$GIDX" -F -n $N -s "$2" ${3:+"$3"} >$out 2>&1
	r=$?
	rep=$(awk '/#bytes/ { getline; print $1, $2; exit }' $out)
	if [ $r -ne 0 ] || [ "$rep" != "$2 $N" ]; then
		cat $out
		echo "$1 -s $2 ${3:-(server)}: exit $r, report \"$rep\"; want exit 0 and \"$2 $N\""
		exit 1
	fi
	grep -A1 '#bytes' $out
}
for tool in ib_send_bw ib_write_bw; do
	for s in 4096 65536; do
		echo "== $tool server -s $s; the soft provider is its client"
		perftest $tool $s
	done
	for s in 4096 65536; do
		echo "== $tool client -s $s; the soft provider is its server"
		perftest $tool $s "$HOST"
	done
done
