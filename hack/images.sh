#!/usr/bin/env bash
# Builds the RDMAvisor image without a Docker engine: the static binaries
# (CGO_ENABLED=0, -trimpath) and the node agent with the libibverbs
# backend (CGO_ENABLED=1 -tags ibverbs, linked against this host's
# libibverbs: libibverbs-dev, ibverbs-providers and gcc, which
# `hack/deps.sh rxe` installs), then a docker-archive tarball of the same
# layout as the Dockerfile's final stage, written by hack/cmd/mkimage
# (go-containerregistry) with the agent's shared libraries, the rdma-core
# providers and /etc/libibverbs.d copied from this host (-ibverbs), and
# read back to check it (every library the agent and the providers load is
# in the image). When ctr and a running
# containerd exist, the image is imported into containerd's k8s.io namespace,
# where the kubelet finds it (pods then use imagePullPolicy: Never).
#
# Usage: hack/images.sh [--no-import]
# It also builds the example applications (examples/echo, examples/grpcecho,
# and examples/echo-c: C, statically linked with libvconn) and the local
# cluster's DNS (hack/cmd/localdns, run by hack/local-cluster/dns.yaml) as
# one-binary images, and examples/echo-py as an image of its script with
# this host's Python interpreter (/usr/bin/python3), its standard library
# (pruned) and the shared libraries they load, and python/rdmavisor
# (mkimage -add); each is read back (mkimage -verify-app: the entrypoint,
# a script's interpreter and every library are in the image). The end-to-end
# tests run them in pods; they are written next to the tarball, whose
# directory hack/e2e.sh imports whole.
#
# Env:   TAG      image reference (default local.test/rdmavisor:dev)
#        ECHO_TAG example image reference (default local.test/rdmavisor-echo:dev)
#        GRPCECHO_TAG  gRPC example image (default local.test/rdmavisor-grpcecho:dev)
#        ECHO_C_TAG    C example image (default local.test/rdmavisor-echo-c:dev)
#        ECHO_PY_TAG   Python example image (default local.test/rdmavisor-echo-py:dev)
#        DNS_TAG  local cluster DNS image (default local.test/localdns:dev)
#        OUT      output directory (default bin/image; bin/ is git-ignored)
#        GOARCH   architecture to build for (default: go env GOARCH)
#        VERSION  version label (default: git describe, else dev)
#        CONTAINERD_ADDRESS  containerd socket (default /run/containerd/containerd.sock)
# Prints the tarball's path on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

import=1
for arg in "$@"; do
  case $arg in
    --no-import) import=0 ;;
    *) echo "usage: $0 [--no-import]" >&2; exit 2 ;;
  esac
done

tag=${TAG:-local.test/rdmavisor:dev}
echo_tag=${ECHO_TAG:-local.test/rdmavisor-echo:dev}
grpcecho_tag=${GRPCECHO_TAG:-local.test/rdmavisor-grpcecho:dev}
echo_c_tag=${ECHO_C_TAG:-local.test/rdmavisor-echo-c:dev}
echo_py_tag=${ECHO_PY_TAG:-local.test/rdmavisor-echo-py:dev}
dns_tag=${DNS_TAG:-local.test/localdns:dev}
out=${OUT:-bin/image}
arch=${GOARCH:-$(go env GOARCH)}
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
bindir="$out/linux_$arch"
tarball="$out/rdmavisor-$arch.tar"
echo_tarball="$out/rdmavisor-echo-$arch.tar"
grpcecho_tarball="$out/rdmavisor-grpcecho-$arch.tar"
echo_c_tarball="$out/rdmavisor-echo-c-$arch.tar"
echo_py_tarball="$out/rdmavisor-echo-py-$arch.tar"
dns_tarball="$out/localdns-$arch.tar"
# The image's binaries; keep in step with Binaries in hack/cmd/mkimage.
binaries=(operator node-agent device-plugin dra-driver rdmavisor-cni rdmavisor)

mkdir -p "$bindir"
pkgs=()
for b in "${binaries[@]}"; do [ "$b" = node-agent ] || pkgs+=("./cmd/$b"); done
echo "Building ${binaries[*]} for linux/$arch into $bindir" >&2
CGO_ENABLED=0 GOOS=linux GOARCH="$arch" \
  go build -trimpath -ldflags "-s -w" -o "$bindir/" "${pkgs[@]}" ./examples/echo ./examples/grpcecho ./hack/cmd/localdns
# The agent links libibverbs: built for this host's architecture, against
# its libraries, which the image then carries.
if [ "$arch" != "$(go env GOHOSTARCH)" ]; then
  echo "the ibverbs node agent is built with cgo against this host's libibverbs: build $arch images on a $arch host (or with the Dockerfile)" >&2
  exit 1
fi
if [ ! -e /usr/include/infiniband/verbs.h ] || ! command -v gcc >/dev/null || [ ! -d /etc/libibverbs.d ]; then
  echo "the ibverbs node agent needs gcc, libibverbs-dev and ibverbs-providers: run hack/deps.sh rxe (as root)" >&2
  exit 1
fi
CGO_ENABLED=1 GOOS=linux GOARCH="$arch" \
  go build -trimpath -tags ibverbs -ldflags "-s -w" -o "$bindir/node-agent" ./cmd/node-agent

echo "Writing $tag to $tarball" >&2
go run ./hack/cmd/mkimage -bin-dir "$bindir" -rootfs hack/image -arch "$arch" -ibverbs \
  -version "$version" -tag "$tag" -out "$tarball" >&2
go run ./hack/cmd/mkimage -verify "$tarball" -tag "$tag" >&2
echo "Writing $echo_tag to $echo_tarball" >&2
go run ./hack/cmd/mkimage -single "$bindir/echo" -arch "$arch" -version "$version" -tag "$echo_tag" -out "$echo_tarball" >&2
echo "Writing $grpcecho_tag to $grpcecho_tarball" >&2
go run ./hack/cmd/mkimage -single "$bindir/grpcecho" -arch "$arch" -version "$version" -tag "$grpcecho_tag" -out "$grpcecho_tarball" >&2
echo "Writing $dns_tag to $dns_tarball" >&2
go run ./hack/cmd/mkimage -single "$bindir/localdns" -arch "$arch" -version "$version" -tag "$dns_tag" -out "$dns_tarball" >&2

# The C example: gcc -static with libvconn.a (its Makefile), for this
# host's architecture like the agent.
echo "Writing $echo_c_tag to $echo_c_tarball" >&2
make -s -C examples/echo-c BUILD="$PWD/$bindir/echo-c" CFLAGS="-O2" >&2
go run ./hack/cmd/mkimage -single "$bindir/echo-c/echo" -arch "$arch" -version "$version" -tag "$echo_c_tag" -out "$echo_c_tarball" >&2
go run ./hack/cmd/mkimage -verify-app "$echo_c_tarball" -tag "$echo_c_tag" >&2

# The Python example: /echo.py (#!/usr/bin/python3) with Debian's
# interpreter and its standard library from this host, less what a pod
# never runs (tests, IDLE, Tk, ensurepip, the static libpython, caches),
# and the rdmavisor package where Debian's python3 looks for packages.
if [ ! -x /usr/bin/python3 ]; then
  echo "the Python example's image carries this host's /usr/bin/python3: run hack/deps.sh test (Debian python3)" >&2
  exit 1
fi
py=$(readlink -f /usr/bin/python3)
echo "Writing $echo_py_tag to $echo_py_tarball ($py)" >&2
go run ./hack/cmd/mkimage -single examples/echo-py/echo.py -arch "$arch" -version "$version" -tag "$echo_py_tag" -out "$echo_py_tarball" \
  -add /usr/bin/python3 -add "/usr/lib/$(basename "$py")" -add python/rdmavisor=/usr/lib/python3/dist-packages/rdmavisor \
  -prune __pycache__ -prune test -prune tests -prune idlelib -prune tkinter -prune turtledemo -prune ensurepip \
  -prune lib2to3 -prune pydoc_data -prune 'config-3.*' -prune '_test*' -prune 'xxlimited*' >&2
go run ./hack/cmd/mkimage -verify-app "$echo_py_tarball" -tag "$echo_py_tag" >&2

sock=${CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}
if [ "$import" = 0 ]; then
  echo "Skipping the import into containerd (--no-import)" >&2
elif ! command -v ctr >/dev/null; then
  echo "ctr not found: skipping the import into containerd; load $tarball where the cluster runs" >&2
elif [ ! -S "$sock" ]; then
  echo "no containerd socket at $sock: skipping the import; set CONTAINERD_ADDRESS or load $tarball yourself" >&2
else
  echo "Importing $tag, $echo_tag, $grpcecho_tag, $echo_c_tag, $echo_py_tag and $dns_tag into containerd ($sock, namespace k8s.io)" >&2
  for t in "$tarball" "$echo_tarball" "$grpcecho_tarball" "$echo_c_tarball" "$echo_py_tarball" "$dns_tarball"; do
    ctr --address "$sock" -n k8s.io images import "$t" >&2
  done
fi
echo "$tarball"
