#!/bin/sh
# PID 1 of the rxe test guest. Brings up eth0 and the kernel's rxe0 on it,
# mounts the host's payload share (9p tag "payload") at /payload, runs
# /payload/run there and writes its exit status to /payload/rc-$IDX and its
# output to /payload/out-$IDX.log (also on the console), then powers off.
# Kernel command line: rvidx=0 rvip=10.99.0.2 rvpeer=10.99.0.3 rvmtu=9000
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /run /tmp /payload
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
# shellcheck disable=SC2013 # the command line is words, not lines
for kv in $(cat /proc/cmdline); do
	case "$kv" in rvidx=* | rvip=* | rvpeer=* | rvmtu=*) eval "$kv" ;; esac
done
: "${rvidx:=0}" "${rvip:=10.99.0.2}" "${rvpeer:=}" "${rvmtu:=9000}"
say() { echo "RXEVM[$rvidx]: $*" >/dev/console; }
fail() { say "setup failed: $*"; sync; echo o >/proc/sysrq-trigger; sleep 10; }
hostname "rxe-$rvidx"
modprobe virtio_pci
modprobe virtio_net
modprobe 9pnet_virtio
modprobe 9p
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
ip link set lo up
# Jumbo frames: the active MTU of rxe0 follows the netdev (9000 gives 4096).
ip link set eth0 mtu "$rvmtu"
ip addr add "$rvip/24" dev eth0
ip link set eth0 up
modprobe crc32_generic
modprobe rdma_rxe
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 payload /payload || fail "mount payload"
i=0
while [ "$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)" != "4: ACTIVE" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
say "rxe0 $(cat /sys/class/infiniband/rxe0/ports/1/state) uptime $(cut -d' ' -f1 /proc/uptime)"
cd /payload || fail "cd /payload"
RDMAVISOR_GUEST_INDEX=$rvidx RDMAVISOR_GUEST_IP=$rvip RDMAVISOR_PEER_IP=$rvpeer \
	sh /payload/run >"/payload/out-$rvidx.log" 2>&1
rc=$?
echo "$rc" >"/payload/rc-$rvidx"
say "exit $rc uptime $(cut -d' ' -f1 /proc/uptime)"
sync
echo o >/proc/sysrq-trigger
sleep 10
