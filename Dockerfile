# syntax=docker/dockerfile:1
# The RDMAvisor image: one image holds every binary. The operator Deployment
# runs `operator`; the agent DaemonSets the operator renders run
# `node-agent`, `device-plugin` and `rdmavisor-cni` by name (they are on
# PATH); the entrypoint is the `rdmavisor` CLI.
#
#   docker build -t ghcr.io/rdmavisor/rdmavisor:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... --push .
#
# Without a Docker engine, hack/images.sh builds the same file system with
# go-containerregistry (hack/cmd/mkimage) into a docker-archive tarball.
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
# Static binaries: no cgo (the ibverbs backend needs cgo and the `ibverbs`
# build tag; it is not part of this image), no build paths.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /rootfs/usr/local/bin /rootfs/etc /rootfs/home/nonroot /rootfs/root /rootfs/tmp \
 && CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /rootfs/usr/local/bin/ \
      ./cmd/operator ./cmd/node-agent ./cmd/device-plugin ./cmd/rdmavisor-cni ./cmd/rdmavisor \
 && cp hack/image/passwd hack/image/group /rootfs/etc/ \
 && chmod 0644 /rootfs/etc/passwd /rootfs/etc/group \
 && chmod 1777 /rootfs/tmp && chmod 0700 /rootfs/root /rootfs/home/nonroot \
 && chown 65532:65532 /rootfs/home/nonroot

FROM scratch
ARG VERSION=dev
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin
WORKDIR /
LABEL org.opencontainers.image.title="rdmavisor" \
      org.opencontainers.image.source="https://github.com/rdmavisor/rdmavisor" \
      org.opencontainers.image.version="${VERSION}"
USER 0:0
ENTRYPOINT ["/usr/local/bin/rdmavisor"]
