#!/bin/sh
# Two-guest check of the harness: ibv_rc_pingpong over rxe0 between guest 0
# (server) and guest 1 (client), on the IPv4-mapped RoCE v2 GID.
P=/sys/class/infiniband/rxe0/ports/1
GIDX=
for n in 0 1 2 3 4 5 6 7; do
	case "$(cat $P/gids/$n 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*) GIDX=$n; break ;; esac
done
[ -n "$GIDX" ] || { echo "no IPv4 GID on rxe0"; exit 1; }
if [ "$RDMAVISOR_GUEST_INDEX" = 0 ]; then
	timeout 120 ibv_rc_pingpong -d rxe0 -g "$GIDX" -n 1000 -s 4096
else
	i=0
	while [ $i -lt 60 ]; do
		timeout 60 ibv_rc_pingpong -d rxe0 -g "$GIDX" -n 1000 -s 4096 "$RDMAVISOR_PEER_IP" && exit 0
		sleep 1
		i=$((i + 1))
	done
	exit 1
fi
