#!/usr/bin/env bash
# Builds Kubernetes binaries (and etcd) from source through the Go module proxy,
# since no release download is reachable here. Usage:
#
#   hack/k8s-build.sh BIN...
#
# BIN is etcd or a command under k8s.io/kubernetes/cmd (kube-apiserver, kubectl,
# kubelet, kube-controller-manager, kube-scheduler, kube-proxy, ...).
# Binaries go to ${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/k8s/$K8S_VERSION/bin,
# which is printed on stdout; everything else goes to stderr. A binary already
# built for the same version is kept, so a second run costs nothing.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
cache=${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/k8s/$K8S_VERSION
bin=$cache/bin
src=$cache/src
[ $# -gt 0 ] || { echo "usage: $0 BIN..." >&2; exit 2; }
mkdir -p "$bin" "$src"

# Several engineers (and CI steps) may run this at once: one builder at a time.
exec 9>"$cache/.lock"
flock 9

log() { echo "k8s-build: $*" >&2; }

# built NAME VERSION: true if NAME is in bin and was built from VERSION.
built() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }

# install_from DIR NAME...: move freshly built binaries into bin, so an
# interrupted build never leaves a half-written binary behind.
install_from() {
  local dir=$1 version=$2; shift 2
  for n in "$@"; do
    mv -f "$dir/$n" "$bin/$n"
    echo "$version" >"$bin/.$n.version"
  done
}

# k8s_module prepares a throw-away module that can build k8s.io/kubernetes/cmd/*.
# k8s.io/kubernetes replaces its staging modules (k8s.io/api, ...) with
# ./staging/... paths that do not exist in the module zip; mirror those
# replaces with the published v0.X.Y tags, read from its own go.mod.
k8s_module() {
  local dir=$src/kubernetes staging=v0.${K8S_VERSION#v1.}
  [ -f "$dir/.ready" ] && return 0
  log "preparing module k8s.io/kubernetes@$K8S_VERSION (staging modules at $staging)"
  rm -rf "$dir" && mkdir -p "$dir"
  (
    cd "$dir"
    go mod init rdmavisor.local/k8s-build >&2
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
    [ -f "$gomod" ] || { log "cannot find go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
    local mods
    mods=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod")
    [ -n "$mods" ] || { log "no staging replaces found in $gomod"; exit 1; }
    for m in $mods; do go mod edit -replace="$m=$m@$staging"; done
    log "replaced $(echo "$mods" | wc -l) staging modules"
    go get "k8s.io/kubernetes@$K8S_VERSION" >&2
  )
  touch "$dir/.ready"
}

build_k8s() {
  [ $# -gt 0 ] || return 0
  k8s_module
  local minor tmp pkgs=()
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  # Without the version ldflags the binaries report v0.0.0 and kubectl refuses
  # to talk to such a server.
  local ldflags="-s -w
    -X k8s.io/component-base/version.gitVersion=$K8S_VERSION
    -X k8s.io/component-base/version.gitMajor=1
    -X k8s.io/component-base/version.gitMinor=$minor
    -X k8s.io/component-base/version.gitTreeState=clean
    -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION
    -X k8s.io/client-go/pkg/version.gitMajor=1
    -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for n in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$n"); done
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  log "building $* (a cold build takes minutes)"
  local start=$SECONDS
  (cd "$src/kubernetes" && go build -mod=mod -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") >&2
  install_from "$tmp" "$K8S_VERSION" "$@"
  rm -rf "$tmp"
  log "built $* in $((SECONDS - start))s"
}

# go.etcd.io/etcd/v3 is not served by the proxy; the server module's etcdmain is.
build_etcd() {
  local dir=$src/etcd-$ETCD_VERSION tmp start=$SECONDS
  log "building etcd $ETCD_VERSION"
  if [ ! -f "$dir/.ready" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    (
      cd "$dir"
      go mod init rdmavisor.local/etcd-build >&2
      printf '%s\n' 'package main' '' 'import (' '	"os"' '' '	"go.etcd.io/etcd/server/v3/etcdmain"' ')' '' \
        'func main() { etcdmain.Main(os.Args) }' >main.go
      go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
      go mod tidy >&2
    )
    touch "$dir/.ready"
  fi
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  (cd "$dir" && go build -trimpath -ldflags '-s -w' -o "$tmp/etcd" .) >&2
  install_from "$tmp" "$ETCD_VERSION" etcd
  rm -rf "$tmp"
  log "built etcd in $((SECONDS - start))s"
}

want_k8s=()
for n in "$@"; do
  case $n in
    etcd) built etcd "$ETCD_VERSION" || build_etcd ;;
    */* | .*) echo "k8s-build: bad binary name $n" >&2; exit 2 ;;
    *) built "$n" "$K8S_VERSION" || want_k8s+=("$n") ;;
  esac
done
build_k8s "${want_k8s[@]}"
echo "$bin"
