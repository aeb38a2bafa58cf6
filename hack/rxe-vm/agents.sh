#!/bin/sh
# Two node agents on the ibverbs provider, one per guest, each on its
# guest's rxe0: guest 1 runs an echo server on its agent, guest 0 opens
# VCONNS vconns to it through its own agent and checks every byte of
# ROUNDS round trips on each (the demo's node mode, as make demo runs it
# between network namespaces on the soft provider). /payload is shared by
# both guests: the server says it is ready there, the client that it is done.
# make test-rxe runs it (hack/rxe-vm/test.sh); by hand:
#
#   CGO_ENABLED=1 go build -tags ibverbs -o /tmp/rv/rdmavisor ./cmd/rdmavisor
#   hack/rxe-vm/run.sh -g 2 -t 420 -f /tmp/rv/rdmavisor -f hack/rxe-vm/agents.sh \
#     -- env TRANSPORT=rc VCONNS=10 sh agents.sh
VCONNS=${VCONNS:-1000} ROUNDS=${ROUNDS:-3} TRANSPORT=${TRANSPORT:-auto}
me=node-$RDMAVISOR_GUEST_INDEX
if [ "$RDMAVISOR_GUEST_INDEX" = 1 ]; then
	peer=node-0
	./rdmavisor demo --node --server --provider ibverbs --name "$me" --ip "$RDMAVISOR_GUEST_IP" \
		--peer-name "$peer" --peer-ip "$RDMAVISOR_PEER_IP" --vconns "$VCONNS" --transport "$TRANSPORT" --timeout 280s >/payload/server.log 2>&1 &
	pid=$!
	i=0
	while [ ! -e /payload/client.done ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 2700 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	kill -INT "$pid" 2>/dev/null
	wait "$pid"
	rc=$?
	touch /payload/server.exited # a client still waiting for it stops
	cat /payload/server.log
	exit $rc
fi
peer=node-1
i=0
until grep -q "node ready" /payload/server.log 2>/dev/null; do
	# A server that exited will never be ready: say so now, not at the
	# end of the wait (interop-agent.sh's host server says it too).
	[ ! -e /payload/server.exited ] || { echo "the server's agent exited before it was ready"; cat /payload/server.log; touch /payload/client.done; exit 1; }
	[ $i -lt 1200 ] || { echo "the server's agent never became ready"; cat /payload/server.log; touch /payload/client.done; exit 1; }
	sleep 0.1
	i=$((i + 1))
done
./rdmavisor demo --node --provider ibverbs --name "$me" --ip "$RDMAVISOR_GUEST_IP" \
	--peer-name "$peer" --peer-ip "$RDMAVISOR_PEER_IP" --vconns "$VCONNS" --rounds "$ROUNDS" --transport "$TRANSPORT" --timeout 240s
rc=$?
touch /payload/client.done
exit $rc
