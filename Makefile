# Kubevisor build, test and code generation. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO        ?= go
BIN       := $(CURDIR)/bin
OUT       := $(CURDIR)/_output
TOOLS_MOD := hack/tools/go.mod
GOTOOL    := $(GO) tool -modfile=$(TOOLS_MOD)
EXAMPLES  := examples/hostpath-storage
FAKE_KINDS := hypervisor network storage device

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

##@ Main commands

.PHONY: demo
demo: build ## Run the driver conformance kit against the simulated drivers and the example driver, through real plugin processes.
	@mkdir -p $(OUT)
	@for kind in $(FAKE_KINDS); do \
	  echo "==> conformance: fake $$kind driver (plugin process bin/kubevisor-driver-fake $$kind)"; \
	  $(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-fake --kind $$kind --arg $$kind \
	    --junit $(OUT)/conformance-fake-$$kind.xml; \
	done
	@echo "==> conformance: out-of-tree example driver ($(EXAMPLES))"
	@$(BIN)/kubevisor-conformance driver --plugin $(BIN)/hostpath-storage --kind storage --name hostpath \
	    --junit $(OUT)/conformance-hostpath.xml
	@echo "JUnit reports: $(OUT)/conformance-*.xml"

.PHONY: test
test: ## Run every test: unit and conformance tiers, the example module's tests, the conformance CLI.
	$(GO) test -race -count=1 ./...
	cd $(EXAMPLES) && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory demo

##@ Build

.PHONY: build
build: ## Build every binary into bin/ (the example driver too).
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...
	cd $(EXAMPLES) && $(GO) build -o $(BIN)/hostpath-storage .

.PHONY: bench
bench: ## Run the benchmarks and print their figures.
	$(GO) test -run '^$$' -bench . -benchtime 3000x ./core/plugin/...

##@ Test guest

.PHONY: guest
guest: ## Build the test guest (kernel, initramfs, bootable disk) into _output/guest/.
	hack/guest/build.sh

.PHONY: guest-smoke
guest-smoke: guest ## Boot the test guest under QEMU/TCG with raw qemu-system-x86_64 and check it.
	hack/guest/smoke.sh

##@ Code generation and checks

.PHONY: tools
tools: ## Install the non-Go tools code generation needs (protoc from Debian).
	@command -v protoc >/dev/null || { \
	  echo "==> installing protobuf-compiler (protoc) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null; }

.PHONY: generate
generate: tools ## Regenerate protobuf code, deepcopy functions and CRD manifests.
	hack/generate-proto.sh
	hack/generate-api.sh

.PHONY: verify
verify: generate ## Fail when generated files are stale, code is not gofmt'ed, or go vet / staticcheck complain.
	@git diff --exit-code --stat -- core manifests || { echo "generated files differ from what is committed: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- core manifests)" || { echo "make generate created untracked files:"; git status --porcelain -- core manifests; exit 1; }
	@bad=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$bad" || { echo "not gofmt'ed: $$bad"; exit 1; }
	$(GO) vet ./...
	cd $(EXAMPLES) && $(GO) vet ./...
	$(GOTOOL) staticcheck ./...

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN) $(OUT)
