# syntax=docker/dockerfile:1
# The RDMAvisor image: one image holds every binary. The operator Deployment
# runs `operator`; the agent DaemonSets the operator renders run
# `node-agent`, `device-plugin`, `dra-driver` and `rdmavisor-cni` by name (they are on
# PATH); the entrypoint is the `rdmavisor` CLI.
#
#   docker build -t ghcr.io/rdmavisor/rdmavisor:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... --push .
#
# Without a Docker engine, hack/images.sh builds the same file system with
# go-containerregistry (hack/cmd/mkimage) into a docker-archive tarball.
# The node agent is the one dynamically linked binary: it carries the
# libibverbs backend, and the image the libraries and rdma-core providers
# it loads.
#
# User: the image's default user is root (0:0). The node agent and the
# device plugin write root-owned host paths (/var/lib/kubelet/device-plugins,
# /var/lib/kubelet/pod-resources, /opt/cni/bin, /etc/cni/net.d) and run in the
# host network namespace, and the DaemonSet the operator renders sets no
# user. The operator needs none of that: the Helm chart runs it as the
# "nonroot" user 65532 (hack/image/passwd) with a read-only root file system
# and no capabilities.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Static binaries: no cgo, no build paths. The node agent is built apart
# (stage agent): it needs cgo for the ibverbs backend.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /rootfs/usr/local/bin /rootfs/etc /rootfs/home/nonroot /rootfs/root /rootfs/tmp \
 && CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /rootfs/usr/local/bin/ \
      ./cmd/operator ./cmd/device-plugin ./cmd/dra-driver ./cmd/rdmavisor-cni ./cmd/rdmavisor \
 && cp hack/image/passwd hack/image/group /rootfs/etc/ \
 && chmod 0644 /rootfs/etc/passwd /rootfs/etc/group \
 && chmod 1777 /rootfs/tmp && chmod 0700 /rootfs/root /rootfs/home/nonroot \
 && chown 65532:65532 /rootfs/home/nonroot

# The node agent with the libibverbs backend (cgo, -tags ibverbs), built
# on the target platform (cgo does not cross-compile here), and what it
# loads: the dynamic loader, libibverbs and its libraries, every rdma-core
# provider with theirs, and /etc/libibverbs.d, as hack/cmd/mkimage lists
# them (hack/images.sh copies the same files). The soft provider needs
# none of it and works the same.
FROM golang:${GO_VERSION} AS agent
ARG VERSION=dev
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends libibverbs-dev ibverbs-providers \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /rootfs/usr/local/bin \
 && CGO_ENABLED=1 go build -trimpath -tags ibverbs -ldflags "-s -w" -o /rootfs/usr/local/bin/node-agent ./cmd/node-agent \
 && go run ./hack/cmd/mkimage -arch "$(go env GOARCH)" -ibverbs-files /rootfs/usr/local/bin/node-agent >/tmp/ibverbs.files \
 && tar -chf - -T /tmp/ibverbs.files | tar -xf - -C /rootfs

FROM scratch
ARG VERSION=dev
COPY --from=build /rootfs/ /
COPY --from=agent /rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
WORKDIR /
LABEL org.opencontainers.image.title="rdmavisor" \
      org.opencontainers.image.source="https://github.com/rdmavisor/rdmavisor" \
      org.opencontainers.image.version="${VERSION}"
USER 0:0
ENTRYPOINT ["/usr/local/bin/rdmavisor"]
