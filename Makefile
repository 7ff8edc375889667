# Kubevisor build, test and code generation. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO        ?= go
BIN       := $(CURDIR)/bin
OUT       := $(CURDIR)/_output
GUEST     := $(OUT)/guest
DEMO_VMI  ?= core/handler/testdata/demo-vmi.yaml
TOOLS_MOD := hack/tools/go.mod
GOTOOL    := $(GO) tool -modfile=$(TOOLS_MOD)
# envtest (control-plane tests) starts the kube-apiserver and etcd that make k8s-bins builds.
export KUBEBUILDER_ASSETS ?= $(OUT)/k8s/bin
EXAMPLES  := examples/hostpath-storage
FAKE_KINDS := hypervisor network storage device
# Debian packages: protoc for code generation; QEMU, qemu-img and OVMF for the drivers and their
# tests; ISO tools with which the storage tests read cloud-init images back.
DEBIAN_PACKAGES := protobuf-compiler libprotobuf-dev qemu-system-x86 qemu-utils ovmf genisoimage xorriso iproute2
# What make generate writes: verify fails when it differs from what is committed.
GENERATED := ':(glob)core/**/*.pb.go' ':(glob)core/**/zz_generated.*.go' manifests/crd manifests/webhook manifests/rbac

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

##@ Main commands

.PHONY: run
run: deps build guest cni-plugins ## Boot the demo VMI without a cluster: the node handler in standalone mode (Ctrl-C stops it).
	$(BIN)/kubevisor-handler run -f $(DEMO_VMI)

.PHONY: demo
demo: deps build guest ## Boot the test guest through the qmp and local driver plugins and run the conformance kit against every in-tree driver.
	@mkdir -p $(OUT)
	@echo "==> a real VM: test guest booted under QEMU by the qmp and local driver plugins (kubevisor-conformance vm)"
	@$(BIN)/kubevisor-conformance vm --hypervisor $(BIN)/kubevisor-driver-qmp --storage $(BIN)/kubevisor-driver-local \
	    --guest-dir $(GUEST) --junit $(OUT)/conformance-vm.xml
	@echo "==> conformance: qmp hypervisor driver (bin/kubevisor-driver-qmp)"
	@$(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-qmp --kind hypervisor \
	    --junit $(OUT)/conformance-qmp.xml
	@echo "==> conformance: local storage driver (bin/kubevisor-driver-local)"
	@$(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-local --kind storage \
	    --junit $(OUT)/conformance-local.xml
	@for kind in $(FAKE_KINDS); do \
	  config=hack/demo/fake-$$kind.json; \
	  echo "==> conformance: simulated $$kind driver (bin/kubevisor-driver-fake $$kind)"; \
	  $(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-fake --kind $$kind --arg $$kind \
	    $$( [ -f $$config ] && echo --config $$config ) --junit $(OUT)/conformance-fake-$$kind.xml; \
	done
	@echo "==> conformance: out-of-tree example driver ($(EXAMPLES))"
	@$(BIN)/kubevisor-conformance driver --plugin $(BIN)/hostpath-storage --kind storage --name hostpath \
	    --junit $(OUT)/conformance-hostpath.xml
	@echo "JUnit reports: $(OUT)/conformance-*.xml"

.PHONY: test
test: deps guest cni-plugins k8s-bins ## Run every test: unit, drivers on real QEMU and network namespaces, handler, launcher, control plane on a real API server, the example module, and make demo.
	$(GO) test -race -count=1 ./...
	cd $(EXAMPLES) && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory demo

##@ Build

.PHONY: build
build: ## Build every binary into bin/ (the example driver too).
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...
	cd $(EXAMPLES) && $(GO) build -o $(BIN)/hostpath-storage .

.PHONY: bench-boot
bench-boot: deps build guest ## Boot the test guest with raw QEMU and through the qmp driver plugin: medians, their ratio (aim <= 1.10), driver RSS per running VM.
	$(BIN)/kubevisor-bench boot --guest-dir $(GUEST) --driver $(BIN)/kubevisor-driver-qmp

.PHONY: bench-memory
bench-memory: deps build guest cni-plugins ## Boot 1, 5 and 10 VMs through the node handler, a launcher each: RSS and PSS per VM of QEMU, launcher, handler and drivers (aim <= 25 MiB beyond QEMU). Needs root.
	$(BIN)/kubevisor-bench memory --guest-dir $(GUEST) --bin-dir $(BIN) --vmi $(DEMO_VMI)

.PHONY: bench-controlplane
bench-controlplane: k8s-bins ## Create 1,000 VMIs against a real kube-apiserver and etcd with kubevisor-controller's manager in process: VMIs/s to launcher pods, create-to-pod latency, API requests per VMI.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench controlplane --vmis 1000

.PHONY: bench-e2e
bench-e2e: ## 20 VMIs at once on the local cluster (make up): P50/P95 of creation to Running and to the console marker, memory per VM on the node beyond QEMU (aim <= 25 MiB), API requests per VMI. Run on the node as root.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench e2e --kubeconfig $(E2E_KUBECONFIG) --vmis 20

.PHONY: bench
bench: cni-plugins ## Run the benchmarks and print their figures (plugin round trip and start; network setup, teardown, throughput).
	$(GO) test -run '^$$' -bench PluginRoundTrip -benchtime 5000x ./core/plugin/...
	$(GO) test -run '^$$' -bench PluginStart -benchtime 100x ./core/plugin/...
	$(GO) test -run '^$$' -bench SetupTeardown -benchtime 50x ./drivers/network/...
	$(GO) test -run '^$$' -bench Throughput -benchtime 3x ./drivers/network/...

##@ Local cluster

.PHONY: up
up: deps k8s-bins cni-plugins guest build ## Main command: a local single-node cluster, Kubevisor installed with DRIVERS from its manifests and images, the demo VM booted; prints how to reach it.
	hack/cluster/up.sh
	$(MAKE) --no-print-directory images
	hack/install.sh install --drivers $(DRIVERS)
	hack/cluster/rollout.sh
	hack/cluster/demo.sh

.PHONY: cluster-up
cluster-up: deps k8s-bins cni-plugins ## Only the local single-node cluster (etcd, control plane, containerd, kubelet); kubeconfig in _output/cluster/kubeconfig.
	hack/cluster/up.sh

.PHONY: down
down: ## Stop the local cluster; leaves no process, mount, netns, bridge or iptables rule (PURGE=1 also removes its data).
	hack/cluster/down.sh $(if $(filter 1,$(PURGE)),--purge)

.PHONY: images
images: deps build cni-plugins guest ## Build the component, launcher and pause images as tarballs in _output/images (no registry) and import them when the cluster runs.
	$(GO) run ./hack/images --bin-dir $(BIN) --out $(OUT)/images all
	@if [ -S /run/kubevisor-cluster/containerd/containerd.sock ]; then hack/cluster/load-images.sh; \
	 else echo "==> images: cluster not running; import later with hack/cluster/load-images.sh"; fi

.PHONY: cluster-smoke
cluster-smoke: deps k8s-bins cni-plugins ## Local cluster check: up, a pod from a local image Running with an IP, network checks, down.
	hack/cluster/smoke.sh

# The cluster the e2e suite runs against: the local one unless KUBECONFIG names another.
E2E_KUBECONFIG ?= $(or $(KUBECONFIG),$(OUT)/cluster/kubeconfig)
E2E_LABELS     ?= Conformance

.PHONY: e2e
e2e: ## Cluster conformance suite (conformance/e2e, Ginkgo) against E2E_KUBECONFIG (default: the local cluster, Kubevisor installed); JUnit report in _output/e2e-junit.xml.
	@mkdir -p $(BIN) $(OUT)/images
	CGO_ENABLED=0 $(GO) build -o $(BIN)/e2e-httpget ./conformance/e2e/httpget
	$(GO) run ./hack/images --out $(OUT)/images -name e2e-httpget -bins $(BIN)/e2e-httpget custom
	@if [ -S /run/kubevisor-cluster/containerd/containerd.sock ]; then hack/cluster/load-images.sh $(OUT)/images/e2e-httpget.tar; fi
	$(GO) test -tags e2e -count=1 -timeout 60m ./conformance/e2e -args -kubeconfig $(E2E_KUBECONFIG) \
	    -ginkgo.label-filter '$(E2E_LABELS)' -ginkgo.junit-report $(OUT)/e2e-junit.xml -ginkgo.v

.PHONY: test-deviceplugins-kubelet
test-deviceplugins-kubelet: deps k8s-bins ## Device plugins against a real kubelet and containerd in a private sandbox: registration, kubelet restart, an unprivileged pod with kvm/tun (root).
	@test -s $(OUT)/images/pause.tar || $(GO) run ./hack/images --out $(OUT)/images pause
	deviceplugins/testdata/kubelet-sandbox.sh

##@ Install

DRIVERS ?= qmp,cni,local

.PHONY: install
install: ## Install Kubevisor with the drivers DRIVERS (default qmp,cni,local) on the cluster of KUBECONFIG (default: the local cluster's, else kubectl's) and wait until it is ready.
	hack/install.sh install --drivers $(DRIVERS) $(if $(KUBECONFIG),--kubeconfig $(KUBECONFIG))

.PHONY: uninstall
uninstall: ## Remove Kubevisor from the cluster of KUBECONFIG: VMs and VMIs first, the components, then the CRDs and the node labels.
	hack/install.sh uninstall $(if $(KUBECONFIG),--kubeconfig $(KUBECONFIG))

.PHONY: install-smoke
install-smoke: deps k8s-bins cni-plugins ## Local cluster: install DRIVERS, components Ready, a VMI admitted and its launcher pod running; prints how far the VMI gets.
	DRIVERS=$(DRIVERS) hack/cluster/install-smoke.sh

##@ Test guest

.PHONY: guest
guest: ## Build the test guest (kernel, initramfs, bootable disk, containerDisk image) into _output/guest/.
	GO=$(GO) hack/guest/build.sh

.PHONY: guest-smoke
guest-smoke: guest ## Boot the test guest under QEMU/TCG with raw qemu-system-x86_64 and check it.
	hack/guest/smoke.sh

##@ CNI plugins

.PHONY: cni-plugins
cni-plugins: ## Build the reference CNI plugins (bridge, host-local, ptp, loopback, ...) into _output/cni/bin, once.
	hack/cni/build.sh

##@ Kubernetes binaries

.PHONY: k8s-bins
k8s-bins: ## Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and etcd (pinned in hack/k8s) into _output/k8s/bin, once.
	hack/k8s/build.sh

##@ Code generation and checks

.PHONY: deps
deps: ## Install the Debian packages that building, generating and testing need (only those missing).
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "==> installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

.PHONY: generate
generate: deps ## Regenerate protobuf code, deepcopy functions, CRDs, webhook configurations and per-component RBAC.
	hack/generate-proto.sh
	hack/generate-api.sh
	hack/generate-webhook.sh
	hack/generate-rbac.sh

.PHONY: verify
verify: generate ## Fail when generated files are stale, go.mod is not tidy, code is not gofmt'ed, or go vet / staticcheck complain.
	@git diff --exit-code --stat -- $(GENERATED) || { echo "generated files differ from what is committed: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { echo "make generate created untracked files:"; git status --porcelain -- $(GENERATED); exit 1; }
	@bad=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$bad" || { echo "not gofmt'ed: $$bad"; exit 1; }
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' (and in $(EXAMPLES))"; exit 1; }
	@cd $(EXAMPLES) && $(GO) mod tidy -diff >/dev/null || { echo "$(EXAMPLES): go.mod/go.sum are not tidy: run 'go mod tidy' there"; exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags e2e ./conformance/e2e/...
	cd $(EXAMPLES) && $(GO) vet ./...
	$(GOTOOL) staticcheck ./...
	$(GOTOOL) staticcheck -tags e2e ./conformance/e2e/...

.PHONY: clean
clean: ## Remove build output (keeps the Kubernetes binaries in _output/k8s, which take minutes to rebuild).
	rm -rf $(BIN) $(filter-out $(OUT)/k8s,$(wildcard $(OUT)/*))
