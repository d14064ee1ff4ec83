# Tessera — see README.md. `make test` is what CI (.ci/run) runs.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin
LOCAL := demo/clusters/local
# The local cluster is one per machine (it uses /var/lib/kubelet and fixed ports):
# every target that uses it holds this lock for its whole session. -o: the cluster's
# daemons must not inherit the lock, or a running demo would hold it until demo-down.
CLUSTER_LOCK ?= /tmp/tessera-cluster.lock
LOCKED := flock -o -w 3600 $(CLUSTER_LOCK)

.PHONY: all build test unit e2e demo demo-down cluster-up cluster-down tools lint helm-lint helm-golden fmt vet bench bench-full clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: unit tests + the end-to-end suite on a local cluster (what CI runs)
test: unit e2e

## unit: everything that needs no cluster; -race on. Needs the pinned helm for the
## chart's golden test, hence tools (a no-op once cached).
unit: tools
	$(GO) test -race -count=1 ./...

## e2e: a fresh local cluster (a running demo cluster is stopped first: its pods would
## hold GPUs the tests count on), install Tessera, run tests/e2e, stop the cluster
e2e: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh down && \
		TESSERA_E2E_START=1 TESSERA_E2E_INSTALL=1 $(GO) test -tags e2e -count=1 -v -timeout 30m ./tests/e2e/'

## tools: build the pinned cluster binaries into the cache (no-op when cached)
tools:
	$(LOCAL)/build-tools.sh >/dev/null

## demo: a local cluster with Tessera and the demo specs; leaves it running
demo: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh up && $(LOCAL)/install.sh && $(LOCAL)/demo.sh'
	@echo
	@echo "The demo cluster is running:  eval \"\$$($(LOCAL)/cluster.sh env)\"; kubectl get pods -A"
	@echo "Stop it with:                 make demo-down"

demo-down:
	-$(LOCAL)/demo.sh clean
	-$(LOCAL)/install.sh uninstall
	$(LOCAL)/cluster.sh down

cluster-up: tools
	$(LOCAL)/cluster.sh up

cluster-down:
	$(LOCAL)/cluster.sh down

vet:
	$(GO) vet ./...
	$(GO) vet -tags e2e ./tests/e2e/

fmt:
	gofmt -l -w $$(git ls-files '*.go')

## lint: gofmt, go vet, shellcheck and bash -n on every script, helm lint
lint: vet helm-lint
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@command -v shellcheck >/dev/null || { echo "shellcheck missing: apt-get install -y shellcheck"; exit 1; }
	@scripts=$$(git ls-files '*.sh' .ci/run); for s in $$scripts; do bash -n "$$s" || exit 1; done; shellcheck $$scripts

## helm-lint: the chart with default, local-cluster and cert-manager values
helm-lint: tools
	@helm=$$($(LOCAL)/build-tools.sh | tail -n1)/helm; \
	for f in "" demo/clusters/local/overlay/values.yaml deployments/helm/testdata/values-cert-manager.yaml; do \
	  $$helm lint --strict deployments/helm/tessera --kube-version 1.37.0 $${f:+-f $$f} || exit 1; done

## helm-golden: rewrite deployments/helm/testdata/*.golden.yaml after a chart change (review the diff)
helm-golden: tools
	$(GO) test ./deployments/helm -run TestGolden -update

## bench: Go benchmarks (allocator cost, prepare latency, checkpoint writes) and the
## quick fleet simulation (results/fleet-quick.md, .png; under a minute)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./cmd/tessera-bench -quick -out results

## bench-full: the 128-GPU fleet simulation (results/fleet.md, .png; a few minutes)
bench-full:
	$(GO) run ./cmd/tessera-bench -out results

clean:
	rm -rf $(BIN)
