#!/bin/sh
# Host side of interop.sh's mixed cluster: the server's node agent of
# agents.sh, on the soft provider on 10.99.0.1 in run.sh's namespace, while
# agents.sh plays the client on the ibverbs provider in the guest (its
# peer pointed here). They meet in the guests' /payload: the server says it
# is ready in server.log there, the client that it is done in client.done.
# Usage (run.sh -H): interop-agent.sh RDMAVISOR TRANSPORT VCONNS
RV=$1 TRANSPORT=$2 VCONNS=$3
P=$RDMAVISOR_PAYLOAD
GUEST=${RDMAVISOR_GUEST_IPS%% *}
"$RV" demo --node --server --provider soft --name node-1 --ip "$RDMAVISOR_HOST_IP" \
	--peer-name node-0 --peer-ip "$GUEST" --vconns "$VCONNS" --transport "$TRANSPORT" --timeout 400s >"$P/server.log" 2>&1 &
pid=$!
i=0
while [ ! -e "$P/client.done" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 4000 ]; do
	sleep 0.1
	i=$((i + 1))
done
kill -INT "$pid" 2>/dev/null
wait "$pid"
rc=$?
touch "$P/server.exited" # a client still waiting for it stops
cat "$P/server.log"
[ -e "$P/client.done" ] || { echo "the guest's client never finished"; exit 1; }
exit $rc
