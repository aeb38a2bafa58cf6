#!/bin/sh
# In an rxe guest: a node agent on the ibverbs provider whose device does
# not open (a name that is not there, a GID index out of range, a port
# down) keeps running, says why in its log and answers /healthz 200 and
# /readyz 503 with the reason, and stops cleanly on SIGTERM. hack/rxe-vm/
# engine.sh runs it with ./node-agent built with -tags ibverbs.
set -u
ip link add rvbad0 type dummy && rdma link add rxebad type rxe netdev rvbad0 || exit 1
cp node-agent /tmp/node-agent || exit 1 # not from the 9p share: faster to start
probe() { # path: prints "status body"
	perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new("127.0.0.1:7472") or die "connect: $!\n";
		print $s "GET $ARGV[0] HTTP/1.0\r\n\r\n"; local $/; $r = <$s>; $r =~ m{^HTTP/\S+ (\d+)}; $c = $1;
		$r =~ s/.*?\r\n\r\n//s; $r =~ s/\s+$//; print "$c $r\n"' "$1"
}
rc=0
for c in 'names: [mlx5_9]|DeviceNotFound' 'names: [rxe0], gidIndex: 9999|InvalidGIDIndex' 'names: [rxebad]|PortDown'; do
	dev=${c%|*} want=${c#*|}
	printf 'apiVersion: rdmavisor.io/v1alpha1\nkind: AgentConfig\ndevice: {provider: ibverbs, %s}\npeerDiscovery: {mode: static}\nmetricsAddress: 127.0.0.1:7472\nsocketDir: /tmp/rv\nadminSocket: /tmp/rv/admin.sock\n' "$dev" >/tmp/bad.yaml
	/tmp/node-agent -config /tmp/bad.yaml -node-name rxe -node-ip "$RDMAVISOR_GUEST_IP" >/tmp/agent.log 2>&1 &
	pid=$!
	# Under emulation the agent takes seconds to start: wait for its
	# first report of the device, then a retry later (still alive).
	i=0
	until [ "$(grep -c 'Cannot open the RDMA device' /tmp/agent.log)" -ge 2 ] || [ $i -ge 600 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	alive=no
	kill -0 "$pid" 2>/dev/null && alive=yes
	h=$(probe /healthz) r=$(probe /readyz)
	kill -TERM "$pid" 2>/dev/null
	wait "$pid"
	st=$?
	echo "device {$dev}: alive after two tries: $alive; /healthz: $h; /readyz: $r; exit on SIGTERM: $st"
	sed -n 1p /tmp/agent.log
	if [ "$alive" != yes ] || [ "$st" != 0 ] || [ "${h%% *}" != 200 ] || [ "${r%% *}" != 503 ] ||
		! grep -q "reason=\"$want\"" /tmp/agent.log || ! echo "$r" | grep -q "$want"; then
		echo "FAIL: want a live agent reporting $want"
		cat /tmp/agent.log
		rc=1
	fi
done
rdma link del rxebad
exit $rc
