#!/usr/bin/env bash
# Regenerates the Go code of every .proto file under internal/ with protoc
# (Debian's protobuf-compiler) and protoc-gen-go / protoc-gen-go-grpc built
# from the Go module proxy at the versions pinned here.
set -euo pipefail
cd "$(dirname "$0")/.."
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.5.1
bin="${RDMAVISOR_CACHE:-$HOME/.cache/rdmavisor}/protoc-bin"
mkdir -p "$bin"
command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
[ -x "$bin/protoc-gen-go-$PROTOC_GEN_GO_VERSION" ] || {
  GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
  mv "$bin/protoc-gen-go" "$bin/protoc-gen-go-$PROTOC_GEN_GO_VERSION"
}
[ -x "$bin/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC_VERSION" ] || {
  GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
  mv "$bin/protoc-gen-go-grpc" "$bin/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC_VERSION"
}
for f in $(git ls-files --cached --others --exclude-standard 'internal/*.proto'); do
  protoc -I "$(dirname "$f")" \
    --plugin=protoc-gen-go="$bin/protoc-gen-go-$PROTOC_GEN_GO_VERSION" \
    --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc-$PROTOC_GEN_GO_GRPC_VERSION" \
    --go_out=paths=source_relative:"$(dirname "$f")" \
    --go-grpc_out=paths=source_relative:"$(dirname "$f")" \
    "$f"
done
