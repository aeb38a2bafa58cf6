#!/usr/bin/env bash
# Builds the rxe test guest: Debian's kernel (whose rdma_rxe is the RDMA
# implementation under test) and a minbase initramfs with rdma-core and the
# providers, cached under $RDMAVISOR_CACHE/rxe-vm. Idempotent: a second run
# with the same kernel package and the same guest files reuses the cache.
# Run as root (mmdebstrap --mode=root, apt). Prints the cache directory.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/rxe-vm
SUITE=${RXE_VM_SUITE:-bookworm}
log() { echo "[rxe-vm $(date +%T)] $*" >&2; }

[ "$(id -u)" -eq 0 ] || { echo "rxe-vm: build.sh must run as root" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
need=()
for p in qemu-system-x86_64:qemu-system-x86 mmdebstrap:mmdebstrap modprobe:kmod depmod:kmod cpio:cpio ip:iproute2 dpkg-deb:dpkg; do
	command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	log "apt install ${need[*]}"
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE"
# The kernel package linux-image-amd64 points at today.
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$KPKG" ]; then
	apt-get update -q >/dev/null
	KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$KPKG" ] || { echo "rxe-vm: cannot find the Debian kernel package" >&2; exit 1; }
KV=${KPKG#linux-image-}
KVER=$(apt-cache policy "$KPKG" | awk '/Candidate:/{print $2}')
# The key names everything that goes into the image (the scripts' contents,
# not their paths: CI's clone is elsewhere); a change rebuilds it.
KEY=$(printf '%s\n' "$SUITE" "$KPKG" "$KVER" "$(cat "$HERE/build.sh" "$HERE/guest-init.sh" | sha256sum)" | sha256sum | cut -c1-16)
if [ -f "$CACHE/key" ] && [ "$(cat "$CACHE/key")" = "$KEY" ] && [ -f "$CACHE/vmlinuz" ] && [ -f "$CACHE/base.cpio" ]; then
	log "cached image $KEY ($KPKG $KVER)"
	echo "$CACHE"
	exit 0
fi

W=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$W"' EXIT
log "kernel $KPKG $KVER"
mkdir -p "$W/dl" "$W/k"
# As root: the cache may sit where apt's _apt user cannot write (/root).
(cd "$W/dl" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" >/dev/null)
dpkg-deb -x "$W"/dl/*.deb "$W/k"
depmod -b "$W/k" "$KV"

log "rootfs (mmdebstrap $SUITE minbase)"
mmdebstrap --variant=minbase --mode=root -q \
	--include=rdma-core,ibverbs-utils,ibverbs-providers,perftest,iproute2,kmod \
	--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
	"$SUITE" "$W/rootfs"
# Modules: rxe and what it needs, virtio for the NIC, 9p for the share,
# dummy (a netdev that stays down, for port-down tests), veth and sch_netem
# (a lossy wire between two rxe devices, for the conformance suite's fault
# cases) and crc32_generic (rxe's ICRC asks for the "crc32" shash; `rdma
# link add` fails without it).
for m in rdma_rxe virtio_net virtio_pci crc32_generic 9p 9pnet_virtio dummy veth sch_netem; do
	modprobe -d "$W/k" -S "$KV" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | sort -u | while read -r f; do
	rel=${f#"$W"/k/lib/modules/"$KV"/}
	mkdir -p "$W/rootfs/lib/modules/$KV/$(dirname "$rel")"
	cp "$f" "$W/rootfs/lib/modules/$KV/$rel"
done
cp "$W"/k/lib/modules/"$KV"/modules.builtin* "$W/k/lib/modules/$KV/modules.order" "$W/rootfs/lib/modules/$KV/"
depmod -b "$W/rootfs" "$KV"
install -m755 "$HERE/guest-init.sh" "$W/rootfs/init"
printf '127.0.0.1\tlocalhost\n' >"$W/rootfs/etc/hosts" # minbase has none
(cd "$W/rootfs" && find . -xdev | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$W/base.cpio"
cp "$W/k/boot/vmlinuz-$KV" "$W/vmlinuz"
mv "$W/vmlinuz" "$W/base.cpio" "$CACHE/"
echo "$KEY" >"$CACHE/key"
log "image $KEY: initramfs $(du -h "$CACHE/base.cpio" | cut -f1)"
echo "$CACHE"
