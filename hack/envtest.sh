#!/usr/bin/env bash
# Prints a directory holding etcd, kube-apiserver and kubectl for envtest
# (KUBEBUILDER_ASSETS), building them from source on first use: setup-envtest's
# download does not work here. Build chatter goes to stderr.
set -euo pipefail
exec "$(dirname "$0")/k8s-build.sh" etcd kube-apiserver kubectl
