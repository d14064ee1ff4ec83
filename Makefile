# Tessera — see README.md. `make test` is what CI (.ci/run) runs.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin

.PHONY: all build test unit lint fmt vet bench clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

unit:
	$(GO) test -race -count=1 ./...

test: unit

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w .

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf $(BIN)
