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

.PHONY: all build kubectl-plugin test unit e2e demo demo-down cluster-up cluster-down tools lint helm-lint helm-golden fmt vet bench bench-full bench-fill bench-lending bench-reclaim bench-podstart bench-scale bench-sim-check gpu-check gpu-check-bundle gpu-check-dryrun clean

all: build

# Version and commit of the binaries (tessera --version): git describe and the
# checked-out commit, "dev" and "unknown" outside a git checkout.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

build:
	$(GO) build -ldflags "$(BUILD_LDFLAGS)" -o $(BIN)/ ./cmd/...

## kubectl-plugin: bin/kubectl-tessera (the tessera CLI, which kubectl runs as
## "kubectl tessera") and bin/kubectl_complete-tessera (kubectl >= 1.26 runs it to
## complete "kubectl tessera ..."); put bin/ in PATH or copy both into a PATH directory
kubectl-plugin:
	$(GO) build -ldflags "$(BUILD_LDFLAGS)" -o $(BIN)/kubectl-tessera ./cmd/tessera
	printf '#!/bin/sh\n# kubectl runs this to complete "kubectl tessera ..."\nexec kubectl-tessera __complete "$$@"\n' >$(BIN)/kubectl_complete-tessera
	chmod +x $(BIN)/kubectl_complete-tessera

## test: unit tests + the end-to-end suite on a local cluster (what CI runs)
test: unit e2e

## unit: everything that needs no cluster; -race on. Needs the pinned helm for the
## chart's golden test, hence tools (a no-op once cached).
unit: tools
	$(GO) test -race -count=1 ./...
	$(MAKE) gpu-check-dryrun

## e2e: a fresh local cluster (a running demo cluster is stopped first: its pods would
## hold GPUs the tests count on), install Tessera, run tests/e2e, stop the cluster
e2e: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh down && \
		TESSERA_CLUSTER_LOCK_HELD=1 TESSERA_E2E_START=1 TESSERA_E2E_INSTALL=1 $(GO) test -tags e2e -count=1 -v -timeout 30m ./tests/e2e/'

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
	$(GO) vet -tags e2e ./tests/e2e/...

fmt:
	gofmt -l -w $$(git ls-files '*.go')

## lint: gofmt, go vet, shellcheck and bash -n on every script, helm lint, then
## golangci-lint (.golangci.yml; the pinned build is cached, a no-op once built)
lint: vet helm-lint
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@command -v shellcheck >/dev/null || { echo "shellcheck missing: apt-get install -y shellcheck"; exit 1; }
	@scripts=$$(git ls-files '*.sh' .ci/run); for s in $$scripts; do bash -n "$$s" || exit 1; done; shellcheck -x $$scripts
	@bin=$$(hack/tools/golangci-lint/build.sh | tail -n1) && $$bin/golangci-lint run ./...

## helm-lint: the chart with default, local-cluster, cert-manager, legacy-translation and budgets values
helm-lint: tools
	@helm=$$($(LOCAL)/build-tools.sh | tail -n1)/helm; \
	for f in "" demo/clusters/local/overlay/values.yaml deployments/helm/testdata/values-cert-manager.yaml deployments/helm/testdata/values-legacy-translation.yaml deployments/helm/testdata/values-budgets.yaml; do \
	  $$helm lint --strict deployments/helm/tessera --kube-version 1.37.0 $${f:+-f $$f} || exit 1; done

## helm-golden: rewrite deployments/helm/testdata/*.golden.yaml after a chart change (review the diff)
helm-golden: tools
	$(GO) test ./deployments/helm -run TestGolden -update

## bench: Go benchmarks (allocator cost, prepare latency, checkpoint writes), the
## quick fleet simulation with its scheduler cost grid and node side
## (results/fleet-quick.md, .png) and the lending simulation (bench-lending). Measured
## on the project's two cores under load 6: the quick fleet run 4 min (2 min of it the
## simulation), internal/bench/fleet's Go benchmarks 3.5 min, the lending run 16 s; the other
## packages' benchmarks add their own (not timed there)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./cmd/tessera-bench -quick -out results
	$(GO) run ./cmd/tessera-bench -lending -eviction-latency $(EVICTION_LATENCY) -out results

## bench-lending: the lending simulation (64 owned GPUs, 72 h; idle period × grace;
## results/fleet-lending.md, .json; seconds). EVICTION_LATENCY is from the end of a
## borrower's grace to its pod gone (take it from make bench-reclaim)
EVICTION_LATENCY ?= 3s
bench-lending:
	$(GO) run ./cmd/tessera-bench -lending -eviction-latency $(EVICTION_LATENCY) -out results

## gpu-check: on a machine with an NVIDIA GPU and its driver (no Kubernetes): real
## discovery and slices, prepare of two shares per backend through the plugin, then
## probes of memory and compute limits (docs/gpu-check.md). Fails fast without a GPU.
## Flags go in GPU_CHECK_FLAGS, e.g. GPU_CHECK_FLAGS="--hami-core-library=/opt/libvgpu.so"
gpu-check:
	GO=$(GO) BIN=$(abspath $(BIN)) hack/gpu-check.sh $(GPU_CHECK_FLAGS)

## gpu-check-bundle: the real-GPU check as one folder (_output/gpu-check-bundle, at
## most 30 MiB) to copy to a GPU machine with the driver and no Go; there run
## ./run.sh [--hami-core-src PATH] [--timeout 540] (docs/gpu-check.md)
gpu-check-bundle:
	GO=$(GO) hack/gpu-check-bundle.sh $(abspath _output/gpu-check-bundle)

## gpu-check-dryrun: the bundle's run.sh end to end on a mock GPU, as nobody, in a
## clean root without Go, CUDA or network, under timeout 600 (part of unit; root)
gpu-check-dryrun:
	GO=$(GO) hack/gpu-check-dryrun.sh

## bench-reclaim: reclaim latency of lent GPUs on a fresh local cluster: RECLAIMS
## cycles (default 20) of an idle owner lending to a borrower and taking the GPU back
## (results/reclaim-latency.md; about 25 s a cycle)
RECLAIMS ?= 20
bench-reclaim: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh down && TESSERA_CLUSTER_LOCK_HELD=1 TESSERA_E2E_START=1 TESSERA_E2E_INSTALL=1 \
		TESSERA_E2E_RECLAIMS=$(RECLAIMS) TESSERA_E2E_RESULTS=$(CURDIR)/results/reclaim-latency.md \
		$(GO) test -tags e2e -count=1 -v -timeout 40m -run TestLendingReclaimLatency ./tests/e2e/'

## bench-full: the 128-GPU fleet simulation with its cost grid and node side
## (results/fleet.md, .png): its simulation took 15 min on the project's two cores under
## load 5 (-node=false -no-cost); add the cost grid (22 s in the run before) and the node
## side (about 2 min for the quick run's three child processes)
bench-full:
	$(GO) run ./cmd/tessera-bench -out results

## bench-fill: the fill experiment of "Beware of Fragmentation" (pods arrive shuffled and
## never leave; unallocated GPU capacity as the workload arrives; results/fleet-fill.md,
## .png, .json). TRACE_DIR: the csv directory of Alibaba's cluster-trace-gpu-v2023
## (github.com/alibaba/clusterdata; not redistributable, so not in this repository); its
## 6,212 GPUs take about 2 min. Without TRACE_DIR a synthetic openb-shaped trace (seconds).
TRACE_DIR ?=
bench-fill:
	$(GO) run ./cmd/tessera-bench -fill $(if $(TRACE_DIR),-fill-trace $(TRACE_DIR)) -out results

## bench-podstart: pod start (create→Running, create→ContainersReady) of plain pods and
## pods with a share or whole-GPU claim on a fresh local cluster, PODSTARTS rounds
## (default 20), one pod at a time (results/pod-start.md; about 10 s a round)
PODSTARTS ?= 20
bench-podstart: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh down && TESSERA_CLUSTER_LOCK_HELD=1 TESSERA_E2E_START=1 TESSERA_E2E_INSTALL=1 \
		TESSERA_E2E_PODSTARTS=$(PODSTARTS) TESSERA_E2E_RESULTS=$(CURDIR)/results/pod-start.md \
		$(GO) test -tags e2e -count=1 -v -timeout 40m -run TestPodStartLatency ./tests/e2e/'

## bench-scale: kube-scheduler's pods/s and create→bound latency on SCALE_NODES kwok
## nodes × 8 GPUs publishing Tessera's slices, per workload, then the NVIDIA-driver peer
## and dynamic-MIG experiments on 500 nodes (hack/scale, docs/scale.md; results/scale.md,
## .png, .json; about 40 min). Stops a running local cluster first.
SCALE_NODES ?= 100,500,1000
bench-scale: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh down && trap "hack/scale/cluster.sh down" EXIT && \
		TESSERA_CLUSTER_LOCK_HELD=1 hack/scale/cluster.sh up 0 && \
		hack/scale/cluster.sh bench -nodes $(SCALE_NODES) -out results'

## bench-sim-check: the fleet simulator against the real kube-scheduler: the KubeShare
## stream replayed on 4 kwok nodes × 8 GPUs for whole GPUs, Tessera and fixed partitions
## (about 30 min; results/sim-vs-scheduler.md)
bench-sim-check: tools
	$(LOCKED) bash -c '$(LOCAL)/cluster.sh down && trap "hack/scale/cluster.sh down" EXIT && \
		TESSERA_CLUSTER_LOCK_HELD=1 hack/scale/cluster.sh up 4 && \
		$(GO) run ./cmd/tessera-bench -replay -kubeconfig /tmp/tessera-scale/admin.kubeconfig \
			-replay-nodes 4 -replay-jobs 600 -replay-speed 15 -out results'

clean:
	rm -rf $(BIN)
