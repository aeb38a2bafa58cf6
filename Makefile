# RDMAvisor. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
# Tools and cluster binaries built from source are cached here across runs.
export RDMAVISOR_CACHE ?= $(HOME)/.cache/rdmavisor
FUZZTIME ?= 10s
BENCHTIME ?= 2s

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every package, and the kubectl plugin into bin/kubectl-rdmavisor (put it on PATH: `kubectl rdmavisor`).
	$(GO) build ./...
	$(GO) build -o bin/kubectl-rdmavisor ./cmd/kubectl-rdmavisor

.PHONY: demo
demo: ## Run the main job: two node agents on the software RDMA provider, 1,000 vconns.
	$(GO) run ./cmd/rdmavisor demo

.PHONY: test
test: generate manifests lint ## Regenerate, then run vet, gofmt and all tests with -race (envtest included).
	hack/test.sh

.PHONY: lint
lint: ## go vet and gofmt.
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: e2e
e2e: ## As root: a local cluster of NODES nodes (default 3), then the end-to-end suite (hack/e2e.sh).
	hack/e2e.sh

.PHONY: soak
soak: ## As root, not in CI: checkers between all nodes for DURATION (default 10m) under random faults (hack/soak.sh).
	hack/soak.sh

.PHONY: test-rxe
test-rxe: ## As root: the ibverbs backend's tests and verbstest in qemu VMs on the kernel's rxe (hack/rxe-vm/test.sh).
	hack/rxe-vm/test.sh

.PHONY: cluster-up
cluster-up: ## As root: a local cluster of NODES nodes (default 1), each in its own namespaces, with RDMAvisor's images imported and cluster DNS (hack/cluster-up.sh).
	hack/cluster-up.sh

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and clean up the host.
	hack/local-cluster/down.sh

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each.
	hack/fuzz.sh $(FUZZTIME)

.PHONY: verify
verify: lint ## Check that generated code and manifests are up to date.
	hack/verify.sh

CONTROLLER_GEN ?= $(GO) tool controller-gen

.PHONY: generate
generate: ## Generate deepcopy code of the API types (controller-gen).
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: proto
proto: ## Generate the gRPC code of internal/**/*.proto (protoc + pinned plugins).
	hack/protoc.sh

.PHONY: manifests
manifests: ## Generate CRDs and the operator's RBAC role (controller-gen).
	$(CONTROLLER_GEN) crd rbac:roleName=rdmavisor-operator paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

.PHONY: chart-crds
chart-crds: manifests ## Copy the generated CRDs into the Helm chart (make verify checks they match).
	rm -f charts/rdmavisor/crds/*.yaml
	cp config/crd/bases/*.yaml charts/rdmavisor/crds/

.PHONY: images
images: ## Build the binaries and the image tarball without Docker (hack/images.sh); imports it when ctr is there.
	hack/images.sh

.PHONY: bench
bench: ## Run benchmarks and write bench/results/ with a summary of ratios.
	hack/bench.sh $(BENCHTIME)
