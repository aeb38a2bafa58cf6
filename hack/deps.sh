#!/usr/bin/env bash
# Installs the Debian packages the tests need, when they are missing.
#
#   hack/deps.sh test     what `make test` needs (hack/test.sh calls it)
#   hack/deps.sh e2e      what `make e2e` needs (hack/e2e.sh calls it)
#   hack/deps.sh verify   what `make verify` needs (protoc)
#   hack/deps.sh rxe      what `make test-rxe` needs (qemu, mmdebstrap, libibverbs)
#   hack/deps.sh          all of them (.ci/run)
#
# It checks first, by the commands and files the tests use: when everything
# is there it does nothing (no apt-get update). Otherwise, as root, it runs
# apt-get update once and installs the missing packages; not as root, it
# fails and prints which tools are missing and the apt-get command to run.
# Go (1.26) itself is not a Debian package here: install it from go.dev.
set -euo pipefail

# Tools in /usr/sbin (ip, iptables, conntrack) are found even where a user's
# PATH leaves it out.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

# Each requirement: CHECK|PACKAGE|WHY. CHECK is cmd:NAME (a command on PATH)
# or file:PATH (a file that must exist).
test_deps=(
  "cmd:git|git|make lint and the generators list files with git"
  "cmd:gcc|gcc|go test -race needs cgo"
  "file:/usr/include/stdlib.h|libc6-dev|go test -race needs cgo (C headers)"
  "cmd:make|make|clib's test builds libvconn with its Makefile"
  "cmd:pkg-config|pkg-config|clib's TestInstall builds a program against the installed vconn.pc"
  "file:/etc/ssl/certs/ca-certificates.crt|ca-certificates|helm, etcd and kube-apiserver are built from the Go module proxy (HTTPS)"
  "cmd:ip|iproute2|internal/cni and the demo make network namespaces and links with ip"
  "cmd:tshark|tshark|internal/verbs/soft/roce TestTsharkDecodesRoCEv2 decodes captured packets with tshark"
  "file:/usr/lib/cni/bridge|containernetworking-plugins|internal/cni TestChainedWithReferencePlugins runs the reference CNI plugins"
  "file:/usr/lib/cni/host-local|containernetworking-plugins|internal/cni TestChainedWithReferencePlugins runs the reference CNI plugins"
  "file:/usr/lib/cni/loopback|containernetworking-plugins|internal/cni TestChainedWithReferencePlugins runs the reference CNI plugins"
  "file:/usr/bin/python3|python3|hack/cmd/testagent TestPytest runs the Python package's tests (python/)"
  "file:/usr/lib/python3/dist-packages/pytest/__init__.py|python3-pytest|hack/cmd/testagent TestPytest runs python/tests with Debian's pytest"
  "file:/usr/share/python-wheels|python3-venv|hack/cmd/testagent TestPytest pip-installs python/ into a virtual environment (ensurepip's wheels)"
  "cmd:iperf3|iperf3|test/preload runs iperf3 over vconns through the preload library"
  "cmd:redis-server|redis-server|test/preload runs redis-server over vconns through the preload library"
  "cmd:redis-benchmark|redis-tools|test/preload runs redis-benchmark and redis-cli against it"
  "cmd:curl|curl|test/preload fetches a file from python3 -m http.server with curl over vconns"
)
e2e_deps=(
  "file:/etc/ssl/certs/ca-certificates.crt|ca-certificates|the cluster's binaries and helm are built from the Go module proxy (HTTPS)"
  "cmd:git|git|hack/images.sh labels the image with git describe"
  "cmd:containerd|containerd|hack/local-cluster runs the pods on containerd"
  "cmd:ctr|containerd|hack/local-cluster and hack/images.sh import images with ctr"
  "cmd:runc|runc|containerd runs containers with runc"
  "file:/usr/lib/cni/bridge|containernetworking-plugins|the local cluster's pod network (bridge, host-local, portmap, loopback)"
  "file:/usr/lib/cni/host-local|containernetworking-plugins|the local cluster's pod network (bridge, host-local, portmap, loopback)"
  "file:/usr/lib/cni/portmap|containernetworking-plugins|the local cluster's pod network (bridge, host-local, portmap, loopback)"
  "file:/usr/lib/cni/loopback|containernetworking-plugins|the local cluster's pod network (bridge, host-local, portmap, loopback)"
  "cmd:ip|iproute2|hack/local-cluster finds the node IP and cleans up links with ip"
  "cmd:iptables|iptables|kube-proxy and the bridge plugin program iptables"
  "cmd:conntrack|conntrack|kube-proxy clears conntrack entries"
  "cmd:openssl|openssl|hack/local-cluster makes the cluster's certificates"
  "cmd:curl|curl|hack/local-cluster checks etcd's health"
  "cmd:gcc|gcc|hack/images.sh builds the node agent with cgo (the ibverbs backend)"
  "file:/usr/include/infiniband/verbs.h|libibverbs-dev|hack/images.sh builds the node agent against libibverbs"
  "file:/etc/libibverbs.d/rxe.driver|ibverbs-providers|hack/images.sh copies the rdma-core providers into the image"
)
rxe_deps=(
  "cmd:gcc|gcc|the ibverbs backend is cgo"
  "file:/usr/include/infiniband/verbs.h|libibverbs-dev|the ibverbs backend builds against libibverbs"
  "cmd:qemu-system-x86_64|qemu-system-x86|hack/rxe-vm boots the kernel with rdma_rxe under qemu"
  "cmd:mmdebstrap|mmdebstrap|hack/rxe-vm/build.sh makes the guest's root file system"
  "cmd:depmod|kmod|hack/rxe-vm/build.sh indexes the guest's kernel modules"
  "cmd:cpio|cpio|hack/rxe-vm/build.sh packs the guest's initramfs"
  "cmd:ip|iproute2|hack/rxe-vm bridges the guests in a network namespace"
)
verify_deps=(
  "cmd:git|git|hack/verify.sh diffs the regenerated tree with git"
  "cmd:protoc|protobuf-compiler|hack/protoc.sh regenerates the gRPC code"
)

usage() {
  echo "usage: $0 [test|e2e|verify|rxe|all]...   (no argument: all)" >&2
  exit 2
}

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(test e2e verify rxe)
wanted=()
for g in "${groups[@]}"; do
  case $g in
    test) wanted+=("${test_deps[@]}") ;;
    e2e) wanted+=("${e2e_deps[@]}") ;;
    verify) wanted+=("${verify_deps[@]}") ;;
    rxe) wanted+=("${rxe_deps[@]}") ;;
    all) wanted+=("${test_deps[@]}" "${e2e_deps[@]}" "${verify_deps[@]}" "${rxe_deps[@]}") ;;
    *) usage ;;
  esac
done

present() {
  case $1 in
    cmd:*) command -v "${1#cmd:}" >/dev/null 2>&1 ;;
    file:*) [ -e "${1#file:}" ] ;;
    *) echo "deps: bad check $1" >&2; exit 2 ;;
  esac
}

# missing_now fills missing (the failed checks' lines, once each) and
# packages (their packages, once each, in order).
missing_now() {
  missing=() packages=()
  local req check pkg seen=" " pseen=" "
  for req in "${wanted[@]}"; do
    check=${req%%|*}
    pkg=${req#*|}; pkg=${pkg%%|*}
    [[ $seen == *" $check "* ]] && continue
    seen+="$check "
    present "$check" && continue
    missing+=("$req")
    [[ $pseen == *" $pkg "* ]] && continue
    pseen+="$pkg "
    packages+=("$pkg")
  done
}

report() {
  local req check pkg why
  for req in "${missing[@]}"; do
    check=${req%%|*}; why=${req##*|}
    pkg=${req#*|}; pkg=${pkg%%|*}
    case $check in
      cmd:*) echo "deps:   ${check#cmd:} (command not found; Debian package $pkg): $why" >&2 ;;
      file:*) echo "deps:   ${check#file:} (no such file; Debian package $pkg): $why" >&2 ;;
    esac
  done
}

missing_now
[ ${#missing[@]} -gt 0 ] || exit 0

if [ "$(id -u)" != 0 ]; then
  echo "deps: missing for ${groups[*]}:" >&2
  report
  echo "deps: not root, so not installing them; install them with (or run sudo $0${*:+ $*}):" >&2
  echo "  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${packages[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "deps: missing for ${groups[*]}, and apt-get is not here to install them:" >&2
  report
  echo "deps: install the equivalents of the Debian packages ${packages[*]}" >&2
  exit 1
fi

install=("${packages[@]}")
echo "deps: installing ${install[*]} (for ${groups[*]})" >&2
# dpkg's progress goes to stdout, discarded; apt's errors go to stderr.
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${install[@]}" >/dev/null

missing_now
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: still missing after apt-get install ${install[*]}:" >&2
  report
  exit 1
fi
echo "deps: installed ${install[*]}" >&2
