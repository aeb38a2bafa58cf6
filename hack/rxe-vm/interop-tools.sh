#!/bin/sh
# Guest side of interop.sh's tools check: rdma-core's ibv_rc_pingpong on
# rxe0 against the soft provider on the host (10.99.0.1), which plays its
# client first (TestPingpong/soft-client), then its server.
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
