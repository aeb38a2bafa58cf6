#!/usr/bin/env bash
# Builds containerd (the daemon, its runc shim and ctr) from source through
# the Go module proxy, as hack/k8s-build.sh builds Kubernetes: Debian 12's
# containerd 1.6 ignores CDI, which the device plugin (-cdi) and the DRA
# driver deliver their allocations by; containerd reads it from 1.7 on.
# runc stays Debian's. Usage:
#
#   hack/containerd-build.sh
#
# Binaries go to ${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/containerd/$CONTAINERD_VERSION/bin,
# which is printed on stdout; everything else goes to stderr. Built once per
# version.
set -euo pipefail

# 1.7 keeps the version-2 configuration hack/local-cluster/containerd.toml is
# written in (2.x migrates it) and builds with the toolchain's Go.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v1.7.35}
mod=github.com/containerd/containerd
cache=${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/containerd/$CONTAINERD_VERSION
bin=$cache/bin
src=$cache/src
bins=(containerd containerd-shim-runc-v2 ctr)
mkdir -p "$bin" "$src"

exec 9>"$cache/.lock"
flock 9

log() { echo "containerd-build: $*" >&2; }

ready=1
for n in "${bins[@]}"; do
  { [ -x "$bin/$n" ] && [ "$(cat "$bin/.$n.version" 2>/dev/null)" = "$CONTAINERD_VERSION" ]; } || ready=
done
if [ -n "$ready" ]; then echo "$bin"; exit 0; fi

start=$SECONDS
if [ ! -f "$src/.ready" ]; then
  log "preparing module $mod@$CONTAINERD_VERSION"
  rm -rf "$src" && mkdir -p "$src"
  (
    cd "$src"
    go mod init rdmavisor.local/containerd-build >&2
    go get "$mod@$CONTAINERD_VERSION" >&2
  )
  touch "$src/.ready"
fi
tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The tags of containerd's own Makefile for a build without btrfs headers;
# the shim is static, as its release is (it runs in any mount namespace).
tags="no_btrfs urfave_cli_no_docs"
ldflags="-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Package=$mod"
log "building ${bins[*]} $CONTAINERD_VERSION (a cold build takes minutes)"
(cd "$src" && go build -mod=mod -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "$mod/cmd/containerd" "$mod/cmd/ctr") >&2
(cd "$src" && CGO_ENABLED=0 go build -mod=mod -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "$mod/cmd/containerd-shim-runc-v2") >&2
for n in "${bins[@]}"; do
  mv -f "$tmp/$n" "$bin/$n"
  echo "$CONTAINERD_VERSION" >"$bin/.$n.version"
done
log "built ${bins[*]} in $((SECONDS - start))s"
echo "$bin"
