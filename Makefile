# Sandbox provisioner: a Knative Function that provisions DeerFlow sandboxes.
# `make help` lists the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -o errexit -o nounset -o pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/deerflow-sandbox/provisioner/pkg/httpapi.Version=$(VERSION)
BIN_DIR  := bin
E2E_TIMEOUT ?= 40m
# The e2e tests marked t.Parallel run this many at once, after the serial
# ones: most of their time is waiting on the API server and kwok.
E2E_PARALLEL ?= 4
RUN_TEST_TIMEOUT ?= 15m
KNATIVE_TIMEOUT ?= 30m

##@ General

## help: show this help
.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*?## "} /^##@/ {printf "\n\033[1m%s\033[0m\n", substr($$0, 5)} /^## / {sub(/^## /, ""); i = index($$0, ": "); printf "  \033[36m%-14s\033[0m %s\n", substr($$0, 1, i - 1), substr($$0, i + 2)}' $(MAKEFILE_LIST)

##@ Develop

## build: build the provisioner binary into bin/
.PHONY: build
build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/provisioner ./cmd/provisioner

## run: serve the function on 127.0.0.1:8080 (a local kwok cluster when KUBECONFIG is unset; NODE=real: sandboxes in real containers)
.PHONY: run
run:
	LDFLAGS='$(LDFLAGS)' hack/run.sh $(BIN_DIR)/provisioner

## tools: build/install etcd, kwok, the Kubernetes control plane and kubectl, and the func CLI (cached)
.PHONY: tools
tools:
	hack/install-tools.sh

## image: build the function's OCI image offline with func's host builder (IMAGE=… to name it)
.PHONY: image
image:
	hack/image.sh $(IMAGE)

## deploy: build, push to IMAGE (required) the function, its egress proxy, the E2B router and agent, and apply config/ pinned to the pushed digests (DRY_RUN=1 prints)
.PHONY: deploy
deploy:
	hack/deploy.sh $(IMAGE)

## node: build the real test node's parts (kubelet, kube-proxy, containerd, CNI, kube-network-policies, gVisor's runsc and shim) and images (cached)
.PHONY: node
node:
	hack/node-images.sh

## e2b: install E2B's SDK (test/e2b's pinned e2b package) into the cache with npm ci, for the tests that judge the E2B API with it
.PHONY: e2b
e2b:
	hack/install-e2b.sh

## e2b-suite: run E2B's own SDK test suite, unmodified, from the copy at E2B_SUITE (a path) against a running `make run NODE=real` (its three E2B lines exported), and print its counts per file
.PHONY: e2b-suite
e2b-suite:
	E2B_SUITE='$(E2B_SUITE)' hack/e2b-suite.sh

## knative-build: build real Knative Serving, Eventing, Traefik and CoreDNS and their images (cached), without starting them
.PHONY: knative-build
knative-build:
	hack/install-knative.sh

## knative: build real Knative Serving, Eventing, Traefik and CoreDNS (cached) and bring up the local Knative cluster on the real node
.PHONY: knative
knative:
	hack/knative-up.sh

## knative-down: take the local Knative cluster down
.PHONY: knative-down
knative-down:
	hack/knative-down.sh

## deploy-local: build, push to a local registry and apply config/ to the local Knative cluster; prints FUNCTION_URL, PROVISIONER_API_KEY, KUBECONFIG
.PHONY: deploy-local
deploy-local:
	hack/deploy-local.sh

## cluster-up: bring up the local kwok cluster and print its kubeconfig path
.PHONY: cluster-up
cluster-up:
	hack/cluster-up.sh

## cluster-down: delete the local kwok cluster
.PHONY: cluster-down
cluster-down:
	hack/cluster-down.sh

##@ Test

## test: run every test: unit, fuzz seed corpora, end-to-end against a real API server and real node, make run NODE=real, and on real Knative (whose build runs beside the others at idle priority)
.PHONY: test
test:
	hack/test.sh

## test-unit: run the unit tests (and the fuzz seed corpora)
.PHONY: test-unit
test-unit:
	$(GO) test -race -count=1 ./...

## test-e2e: run the end-to-end suite against a kwok cluster and a real node it starts itself (REAL_NODE=0: kwok only)
.PHONY: test-e2e
test-e2e: tools image node e2b
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -parallel $(E2E_PARALLEL) -v ./test/e2e/... 2>&1 | hack/summarize-tests.sh

## test-run: `make run NODE=real` starts every time: after Ctrl-C, kill -9 or kill of make, beside plain `make run` (root; after test-e2e, never beside it)
.PHONY: test-run
test-run: tools node
	$(GO) test -tags e2e -count=1 -timeout $(RUN_TEST_TIMEOUT) -v ./test/runreal/... 2>&1 | hack/summarize-tests.sh

## test-knative: the end-to-end suite on real Knative Serving and Eventing on the real node (its own cluster; run after test-e2e, never beside it)
.PHONY: test-knative
test-knative: tools image node e2b
	hack/install-knative.sh
	$(GO) test -tags e2e -count=1 -timeout $(KNATIVE_TIMEOUT) -v ./test/knative/... 2>&1 | hack/summarize-tests.sh

## bench: measure latency, throughput, cold start and memory against the client-go floor, and the cold start from zero on real Knative; last, print each figure more than 25 % worse than docs/performance.md records
.PHONY: bench
bench: tools node image e2b
	mkdir -p results
	$(GO) test -tags e2e -count=1 -timeout 90m -run '^$$' -bench . -benchtime 1x ./test/bench/... | tee results/bench-run.txt
	hack/install-knative.sh
	$(GO) test -tags e2e -count=1 -timeout 30m -run '^$$' -bench . -benchtime 1x ./test/knative/... | tee -a results/bench-run.txt
	$(GO) run ./test/framework/benchcompare docs/performance.md results/bench-run.txt

## load: create and destroy 1,000 sandboxes at concurrency 32 on kwok and check nothing is left behind (make test runs 200 at 8)
.PHONY: load
load: tools
	LOAD=1 REAL_NODE=0 $(GO) test -tags e2e -count=1 -timeout 20m -v -run '^TestLoad$$' ./test/e2e/...

## soak: the fault soak for SOAK_DURATION (default 10m; make test runs 2m): two principals, two replicas, aborts, 5xx, a kill, an API server restart, a network prober on the real node (root); SOAK_SEED replays
.PHONY: soak
soak: tools node
	SOAK_DURATION=$(or $(SOAK_DURATION),10m) $(GO) test -tags e2e -count=1 -timeout 40m -v -run '^TestSoak$$' ./test/e2e/ 2>&1 | hack/summarize-tests.sh

## fuzz: run each fuzz target for FUZZTIME (default 1m)
.PHONY: fuzz
fuzz:
	hack/fuzz.sh $(or $(FUZZTIME),1m)

##@ Verify

## verify: check formatting, vet, go.mod tidiness, the sandbox templates under config/templates, the layout (pure builders, one-way imports, package size), that CI fails on a skipped test, that no build output is tracked, and kube-score's findings on config/ (each fixed or excused in hack/scan-exceptions.txt)
.PHONY: verify
verify:
	hack/verify-hygiene.sh
	hack/verify-gofmt.sh
	hack/verify-govet.sh
	hack/verify-gomod.sh
	hack/verify-templates.sh
	hack/verify-layout.sh
	hack/verify-codegen.sh
	hack/verify-ci.sh
	hack/verify-scan.sh

## update: apply gofmt and go mod tidy, and regenerate the agent's Connect code from its protos
.PHONY: update
update:
	hack/update-gofmt.sh
	hack/update-gomod.sh
	hack/update-codegen.sh
