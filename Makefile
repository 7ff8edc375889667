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
# The out-of-tree example drivers, each its own module: directory, binary (its module's last
# element), driver name and kind. make images builds a driver image of each
# (kubevisor-examples/<binary>:dev), which its deploy/ component installs (DRIVERS=.../deploy).
EXAMPLES  := examples/hostpath-storage examples/sim-device
EXAMPLE_DRIVERS := hostpath-storage:hostpath:storage sim-device:sim:device
FAKE_KINDS := hypervisor network storage device
# Debian packages come in sets (hack/deps/packages.txt): a target depends on deps-<set> for
# every set whose commands its recipe, scripts or Go programs call, so that it works first on a
# fresh machine; make verify checks that each does (hack/deps/check).
DEPS_SETS := $(shell awk '!/^\#/ && NF {print $$1}' hack/deps/packages.txt | sort -u)
# What the local cluster's scripts call: containerd and runc, iptables and what kubelet expects
# on a node, ip/ss, sysctl, openssl, jq and curl.
CLUSTER_DEPS := deps-runtime deps-node deps-tools deps-net deps-proc
# Nodes of the local cluster (make up, cluster-up, e2e): 1, or 2 for a second node on this
# machine in namespaces of its own (hack/cluster/README.md). Unset: as many as the last make up
# made (1 on a fresh machine); NODES=1 removes a second node.
NODES ?=
export NODES
# The cluster the e2e suite runs against: the local one unless KUBECONFIG names another. The
# local one is brought up (make up) when it is not running with Kubevisor installed and NODES
# nodes Ready.
E2E_KUBECONFIG ?= $(or $(KUBECONFIG),$(OUT)/cluster/kubeconfig)
E2E_CLUSTER    := $(if $(KUBECONFIG),,local-cluster)
# The specs' labels (Ginkgo label filter). Default: Conformance, and the RequiresTwoNodes lane
# too when the local cluster has two nodes (NODES=2, or the last make up made two). Only the
# two-node lane: make e2e NODES=2 E2E_LABELS='RequiresTwoNodes && !Upgrade'. A
# RequiresTwoNodes spec run against fewer than two schedulable nodes is skipped, and fails under
# CI=true. The Upgrade specs need the images make e2e-upgrade builds: they run there
# (E2E_UPGRADE_LABELS), never in make e2e's default.
E2E_NODES      := $(or $(NODES),$(if $(KUBECONFIG),1,$(shell cat $(OUT)/cluster/nodes 2>/dev/null)),1)
E2E_LABELS     ?= Conformance$(if $(filter 2,$(E2E_NODES)), || (RequiresTwoNodes && !Upgrade && !Disruptive))
# make e2e-upgrade's specs: the one-node ones and the feature gates' (both edit the Kubevisor),
# or on two nodes the two-node one (LiveMigrate).
E2E_UPGRADE_LABELS ?= (Upgrade || FeatureGates) && $(if $(filter 2,$(E2E_NODES)),,!)RequiresTwoNodes
# The HypervisorClass of the e2e specs' VMIs ("": the default class), and the two classes of its
# TwoClasses spec (a,b: the spec fails when one is missing; "": the cluster's first two, skipped
# when there are fewer).
E2E_HYPERVISOR_CLASS ?=
E2E_TWO_CLASSES      ?=
# Where make e2e writes its JUnit report.
E2E_JUNIT            ?= $(OUT)/e2e-junit.xml
# The image tag make e2e-upgrade builds this tree's component images under, for the upgrade spec.
E2E_UPGRADE_TAG      ?=
# What make generate writes: verify fails when it differs from what is committed.
GENERATED := ':(glob)core/**/*.pb.go' ':(glob)core/**/zz_generated.*.go' manifests/crd manifests/webhook manifests/rbac manifests/operator/crd manifests/operator/rbac \
             docs/kubevirt-compatibility.md core/seccomp/launcher.json

.PHONY: help
help: ## List the targets by section. The main command is make up; the tests are make test.
	@awk '/^##@ / {printf "\n%s\n", substr($$0, 5); next} /^[a-z0-9-]+:.*## / {split($$0, a, ":.*## "); name = a[1]; sub(/:.*/, "", name); printf "  %-27s %s\n", name, a[2]}' $(MAKEFILE_LIST)

##@ Main commands

.PHONY: up
up: $(CLUSTER_DEPS) deps-qemu k8s-bins cni-plugins guest build ## Main command: a local cluster (NODES=2: a second node on this machine), Kubevisor installed with DRIVERS from its manifests and images, the demo VM booted; prints how to reach it.
	hack/cluster/up.sh
	$(MAKE) --no-print-directory images
	hack/install.sh install --drivers $(DRIVERS)
	hack/cluster/rollout.sh
	hack/cluster/demo.sh

.PHONY: down
down: $(CLUSTER_DEPS) ## Stop the local cluster (both nodes); leaves no process, mount, namespace, bridge, veth, route or iptables rule (PURGE=1 also removes its data).
	hack/cluster/down.sh $(if $(filter 1,$(PURGE)),--purge)

.PHONY: test
test: deps-qemu deps-libvirt deps-iso deps-net deps-proc deps-tools guest cni-plugins k8s-bins ## Run every test: unit, drivers on real QEMU and network namespaces, handler, launcher, control plane on a real API server, the example module, and make demo.
	@# The conformance kit boots the guest most (each check a VM or two, under the race
	@# detector): run on its own, after the rest, it does not starve the other packages' QEMU
	@# tests of CPU on a 2-core machine (their console waits timed out beside it).
	@# The packages that take longest start first (SLOW_TEST_PKGS), so that the run does not end
	@# on one of them alone while the other core idles.
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list $(SLOW_TEST_PKGS)) \
	    $$($(GO) list ./... | grep -v '/conformance/driver$$' | grep -vxF "$$($(GO) list $(SLOW_TEST_PKGS))")
	$(GO) test -race -count=1 -timeout 30m ./conformance/driver
	for ex in $(EXAMPLES); do (cd $$ex && $(GO) test -count=1 ./...); done
	$(MAKE) --no-print-directory demo DEMO_VM_CLASSES=libvirt DEMO_HV_CLASSES=

# make test's longest packages, longest first (each a few minutes: QEMU guests, envtest).
SLOW_TEST_PKGS := ./drivers/libvirt ./drivers/qmp ./core/handler ./core/handler/cluster ./controlplane/operator \
                  ./core/handler/migrationproxy ./core/handler/standalone ./conformance/driver/cli ./drivers/network

.PHONY: unit
unit: deps-libvirt ## The fast inner loop: go test -short ./..., which needs no root, QEMU, network namespace, test guest or API server (those tests skip).
	$(GO) test -short -count=1 ./...

##@ Without a cluster

.PHONY: run
run: deps-qemu deps-net build guest cni-plugins ## Boot the demo VMI without a cluster: the node handler in standalone mode (Ctrl-C stops it).
	$(BIN)/kubevisor-handler run -f $(DEMO_VMI)

# make demo runs the conformance kit with the HypervisorClasses the install creates for the
# hypervisor drivers (manifests/install/drivers/<class>/hypervisorclass.yaml, passed as
# kubevisor-conformance --class), finding the drivers in bin/.
# make demo leaves out the kit's Migrate checks (DEMO_SKIP= runs them): make test runs them
# against both drivers' plugin binaries already, through the node agent's migration proxies
# (core/handler/migrationproxy, qmp) and a relay (drivers/libvirt), and the cluster e2e suite
# moves VMs of both classes between two nodes.
DEMO_SKIP     ?= Migrate
# The classes make demo boots the VM suite and runs the hypervisor kit with, through the
# drivers' plugin binaries. make test runs the libvirt class's VM suite only: the qmp VM suite
# runs in conformance/driver (TestVMRealDrivers in-process, the cli's TestVMAgainstRealPlugins
# through its plugins), and both hypervisor kits in drivers/qmp and drivers/libvirt
# (TestConformance), with go-plugin's serving covered by the cli tests.
DEMO_VM_CLASSES ?= qmp libvirt
DEMO_HV_CLASSES ?= qmp libvirt

.PHONY: demo
demo: deps-qemu deps-libvirt build guest ## Boot the test guest through the qmp and local driver plugins, then the libvirt and local ones, each hypervisor by its install's HypervisorClass (launchers with the class's capabilities only), and run the conformance kit against every in-tree driver.
	@mkdir -p $(OUT)
	@for c in $(DEMO_VM_CLASSES); do \
	  echo "==> a real VM: test guest booted by the $$c and local driver plugins, launchers as in the $$c class's pods (kubevisor-conformance vm --class)"; \
	  $(BIN)/kubevisor-conformance vm --class manifests/install/drivers/$$c/hypervisorclass.yaml --storage $(BIN)/kubevisor-driver-local \
	    --guest-dir $(GUEST) --skip '$(DEMO_SKIP)' --junit $(OUT)/conformance-vm-$$c.xml; \
	done
	@for c in $(DEMO_HV_CLASSES); do \
	  echo "==> conformance: $$c hypervisor driver of the $$c class (bin/kubevisor-driver-$$c)"; \
	  $(BIN)/kubevisor-conformance driver --class manifests/install/drivers/$$c/hypervisorclass.yaml --junit $(OUT)/conformance-$$c.xml; \
	done
	@echo "==> conformance: local storage driver (bin/kubevisor-driver-local)"
	@$(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-local --kind storage \
	    --junit $(OUT)/conformance-local.xml
	@echo "==> conformance: hostdev device driver on this host's /dev and /sys (bin/kubevisor-driver-hostdev)"
	@$(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-hostdev --kind device \
	    --junit $(OUT)/conformance-hostdev.xml
	@for kind in $(FAKE_KINDS); do \
	  config=hack/demo/fake-$$kind.json; \
	  echo "==> conformance: simulated $$kind driver (bin/kubevisor-driver-fake $$kind)"; \
	  $(BIN)/kubevisor-conformance driver --plugin $(BIN)/kubevisor-driver-fake --kind $$kind --arg $$kind \
	    $$( [ -f $$config ] && echo --config $$config ) --junit $(OUT)/conformance-fake-$$kind.xml; \
	done
	@for ex in $(EXAMPLE_DRIVERS); do IFS=: read -r bin name kind <<<"$$ex"; \
	  echo "==> conformance: out-of-tree example $$kind driver (examples/$$bin, bin/$$bin)"; \
	  config=examples/$$bin/testdata/conformance.json; \
	  $(BIN)/kubevisor-conformance driver --plugin $(BIN)/$$bin --kind $$kind --name $$name \
	    $$( [ -f $$config ] && echo --config $$config ) --junit $(OUT)/conformance-$$name.xml; \
	done
	@echo "JUnit reports: $(OUT)/conformance-*.xml"

##@ Build and benchmarks

.PHONY: build
build: deps-libvirt ## Build every binary into bin/ (the example drivers too).
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...
	for ex in $(EXAMPLES); do (cd $$ex && $(GO) build -o $(BIN)/$$(basename $$ex) .); done

.PHONY: bench-boot
bench-boot: deps-qemu deps-libvirt deps-iso deps-net build guest ## Boot the test guest with raw QEMU, through the qmp driver plugin and through the libvirt one (a libvirtd per VM under its launcher), rotating: medians, ratios qmp/raw (aim <= 1.10), libvirt/raw, libvirt/qmp; memory per running VM beyond QEMU of both drivers (libvirt's daemons counted), RSS and PSS. Needs root.
	$(BIN)/kubevisor-bench boot --guest-dir $(GUEST) --driver qmp=$(BIN)/kubevisor-driver-qmp \
	    --driver libvirt=$(BIN)/kubevisor-driver-libvirt --launcher $(BIN)/kubevisor-launcher

.PHONY: bench-memory
bench-memory: deps-qemu deps-iso deps-net build guest cni-plugins ## Boot 1, 5 and 10 VMs through the node handler, a launcher each: RSS and PSS per VM of QEMU, launcher, handler and drivers (aim <= 25 MiB beyond QEMU). Needs root.
	$(BIN)/kubevisor-bench memory --guest-dir $(GUEST) --bin-dir $(BIN) --vmi $(DEMO_VMI)

.PHONY: bench-controlplane
bench-controlplane: deps-iso deps-net k8s-bins ## Create 1,000 VMIs against a real kube-apiserver and etcd with kubevisor-controller's manager in process: VMIs/s to launcher pods, create-to-pod latency, API requests per VMI.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench controlplane --vmis 1000

.PHONY: bench-start
bench-start: deps-qemu deps-iso deps-net guest $(E2E_CLUSTER) ## One VMI at a time on the local cluster (brought up when not running) against raw QEMU booting the same guest, alternating: create → Running and → console marker, the per-phase timeline (pod, containers, handler steps), medians and the ratio (aim <= 1.25). Run on the node as root.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench start --kubeconfig $(E2E_KUBECONFIG) --guest $(OUT)/guest

# MIGRATE_ROUNDS is make bench-migrate's rounds per mode (each a raw and a Kubevisor migration).
MIGRATE_ROUNDS ?= 3

.PHONY: bench-migrate
bench-migrate: NODES = 2
bench-migrate: deps-qemu deps-iso deps-net guest $(E2E_CLUSTER) ## Live-migrate the test guest, idle and dirtying memory, with raw QEMU to QEMU over a unix socket and through Kubevisor on the local two-node cluster (brought up with NODES=2 when not running), alternating (MIGRATE_ROUNDS, default 3): QEMU's total and downtime, the guest's heartbeat gap seen from the host, create → Running on the target; medians and ratios Kubevisor/raw (pre-copy, no bandwidth limit on both sides). Run on the node as root.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench migrate --kubeconfig $(E2E_KUBECONFIG) --guest $(OUT)/guest --rounds $(MIGRATE_ROUNDS)

.PHONY: bench-e2e
bench-e2e: deps-iso deps-net $(E2E_CLUSTER) ## 20 VMIs at once on the local cluster (brought up when not running): P50/P95 of creation to Running and to the console marker, memory per VM on the node beyond QEMU (aim <= 25 MiB), API requests per VMI, against the node's own start of as many idle and busy (burning a guest boot's CPU) pods. Run on the node as root.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench e2e --kubeconfig $(E2E_KUBECONFIG) --vmis 20

.PHONY: bench-console
bench-console: deps-iso deps-net $(E2E_CLUSTER) ## One VMI on the local cluster (brought up when not running): keystroke-to-echo p50/p99 on its serial console through the API server (vmctl's path) and straight to the node handler, their ratio, and vnc open to first frame. Run on the node as root.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/kubevisor-bench ./cmd/kubevisor-bench
	$(BIN)/kubevisor-bench console-latency --kubeconfig $(E2E_KUBECONFIG)

.PHONY: bench
bench: deps-qemu deps-libvirt deps-net cni-plugins ## Run the benchmarks and print their figures (plugin round trip and start; network setup, teardown, throughput).
	$(GO) test -run '^$$' -bench PluginRoundTrip -benchtime 5000x ./core/plugin/...
	$(GO) test -run '^$$' -bench PluginStart -benchtime 100x ./core/plugin/...
	$(GO) test -run '^$$' -bench SetupTeardown -benchtime 50x ./drivers/network/...
	$(GO) test -run '^$$' -bench Throughput -benchtime 3x ./drivers/network/...

##@ Local cluster

.PHONY: cluster-up
cluster-up: $(CLUSTER_DEPS) k8s-bins cni-plugins ## Only the local cluster (etcd, control plane, containerd, kubelet; NODES=2 a second node's); kubeconfig in _output/cluster/kubeconfig.
	hack/cluster/up.sh

.PHONY: images
images: deps-qemu deps-libvirt deps-runtime deps-net deps-tools build cni-plugins guest ## Build the component, launcher (QEMU and libvirtd) and pause images as tarballs in _output/images (no registry) and import them when the cluster runs.
	$(GO) run ./hack/images --bin-dir $(BIN) --out $(OUT)/images all
	@# The example drivers' driver images: static binaries, as a third party ships them.
	@mkdir -p $(OUT)/examples
	@for ex in $(EXAMPLE_DRIVERS); do IFS=: read -r bin name kind <<<"$$ex"; \
	  (cd examples/$$bin && CGO_ENABLED=0 $(GO) build -trimpath -o $(OUT)/examples/$$bin .) && \
	  $(GO) run ./hack/images --out $(OUT)/images --repo kubevisor-examples -name $$bin \
	    -driver-bin $(OUT)/examples/$$bin -driver-kind $$kind -driver-name $$name driver; \
	done
	@if [ -S /run/kubevisor-cluster/containerd/containerd.sock ]; then hack/cluster/load-images.sh; \
	 else echo "==> images: cluster not running; import later with hack/cluster/load-images.sh"; fi

.PHONY: cluster-smoke
cluster-smoke: $(CLUSTER_DEPS) k8s-bins cni-plugins ## Local cluster check: up, a pod from a local image Running with an IP, network checks, down.
	hack/cluster/smoke.sh


.PHONY: local-cluster
local-cluster: $(CLUSTER_DEPS)
	@hack/cluster/ready.sh || $(MAKE) --no-print-directory up

.PHONY: e2e
e2e: deps-runtime deps-tools deps-qemu deps-libvirt $(E2E_CLUSTER) ## Cluster conformance suite (conformance/e2e, Ginkgo) against E2E_KUBECONFIG (default: the local cluster, brought up when not running); JUnit report in _output/e2e-junit.xml.
	@mkdir -p $(BIN) $(OUT)/images
	CGO_ENABLED=0 $(GO) build -o $(BIN)/e2e-httpget ./conformance/e2e/httpget
	CGO_ENABLED=0 $(GO) build -o $(BIN)/e2e-signal ./conformance/e2e/signal
	$(GO) build -o $(BIN)/vmctl ./cmd/vmctl
	$(GO) run ./hack/images --out $(OUT)/images -name e2e-httpget -bins $(BIN)/e2e-httpget custom
	$(GO) run ./hack/images --out $(OUT)/images -name e2e-signal -bins $(BIN)/e2e-signal custom
	@if [ -S /run/kubevisor-cluster/containerd/containerd.sock ]; then hack/cluster/load-images.sh $(OUT)/images/e2e-httpget.tar $(OUT)/images/e2e-signal.tar; fi
	$(GO) test -tags e2e -count=1 -timeout 60m ./conformance/e2e -args -kubeconfig $(E2E_KUBECONFIG) -vmctl $(BIN)/vmctl \
	    -hypervisor-class '$(E2E_HYPERVISOR_CLASS)' -two-classes '$(E2E_TWO_CLASSES)' -upgrade-tag '$(E2E_UPGRADE_TAG)' -upgrade-pairs $(or $(UPGRADE_PAIRS),1) -soak-duration $(or $(SOAK_DURATION),10m) \
	    -local-cluster '$(if $(KUBECONFIG),,$(CURDIR)/hack/cluster)' -ginkgo.label-filter '$(E2E_LABELS)' -ginkgo.junit-report $(abspath $(E2E_JUNIT)) -ginkgo.v

.PHONY: e2e-faults
e2e-faults: $(CLUSTER_DEPS) deps-qemu local-cluster ## Local cluster: the fault matrix (label Disruptive): with a VM of each of two classes running and two VMI creations in flight, the handler pod deleted, the controller leader killed with a second replica (infra.replicas 2), each driver plugin SIGKILLed, the API server and etcd, the kubelet and containerd restarted (hack/cluster/restart.sh), then the file system under the per-VMI directories full (new VMIs say ENOSPC, running ones go on); with two nodes (NODES=2) instead node 2 cut from the API server for 60 s (hack/cluster/partition.sh); VMs lost, restarted, duplicate launcher pods and time to converge per case, as a table in the log.
	$(MAKE) --no-print-directory e2e E2E_LABELS='Disruptive && $(if $(filter 2,$(E2E_NODES)),,!)RequiresTwoNodes' E2E_JUNIT=$(OUT)/e2e-junit-faults$(if $(filter 2,$(E2E_NODES)),-two-nodes).xml

.PHONY: e2e-soak
e2e-soak: $(CLUSTER_DEPS) deps-qemu local-cluster ## Local cluster: the soak (label Soak): for SOAK_DURATION (default 10m) VMIs created and deleted in a loop on this machine's node, one real guest at a time beside batches of 5 simulated ones (the class fake, added to the driver set for the spec), then the node's census against before (pods, network namespaces, links, packet filter rules, mounts, per-VMI and run directories, driver state files, QEMU/launcher/shim/plugin processes, the handler's goroutines, threads and fds); a leak fails it.
	$(MAKE) --no-print-directory e2e E2E_LABELS=Soak E2E_JUNIT=$(OUT)/e2e-junit-soak.xml

.PHONY: e2e-upgrade
e2e-upgrade: UPGRADE_TAG = $(or $(E2E_UPGRADE_TAG),upgrade)
e2e-upgrade: deps-runtime deps-tools deps-qemu local-cluster ## Local cluster: this tree's component images built again under the tag UPGRADE_TAG (default upgrade) and imported into every node, then the Upgrade specs (E2E_UPGRADE_LABELS): UPGRADE_PAIRS (default 1) VMs of each of two classes running, the Kubevisor's imageTag set to it, the operator rolls every component (VMs undisturbed, web servers polled, status followed; figures in the log), and back; workloadUpdateStrategy Evict; an imageTag no node has; a driver-only upgrade; feature gates taken live (HostDisk removed from the Kubevisor refuses a hostDisk VMI, restored admits it). With two nodes (NODES=2) instead: workloadUpdateStrategy LiveMigrate, the VMIs moved to the other node's new launcher.
	$(MAKE) --no-print-directory images
	$(GO) build -o $(BIN)/vmctl ./cmd/vmctl
	$(GO) run ./hack/images --bin-dir $(BIN) --out $(OUT)/images-upgrade --tag $(UPGRADE_TAG) components
	@# The qmp driver alone, as a driver image (static, as driver images hold no C library), for
	@# the driver-only upgrade spec.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(OUT)/images-upgrade/bin/kubevisor-driver-qmp ./cmd/kubevisor-driver-qmp
	$(GO) run ./hack/images --out $(OUT)/images-upgrade --tag $(UPGRADE_TAG) -name kubevisor-driver-qmp \
	    -driver-bin $(OUT)/images-upgrade/bin/kubevisor-driver-qmp -driver-kind hypervisor -driver-name qmp driver
	hack/cluster/load-images.sh $(OUT)/images-upgrade/*.tar
	$(MAKE) --no-print-directory e2e E2E_LABELS='$(E2E_UPGRADE_LABELS)' E2E_UPGRADE_TAG=$(UPGRADE_TAG) E2E_JUNIT=$(OUT)/e2e-junit-upgrade$(if $(filter 2,$(E2E_NODES)),-two-nodes).xml

.PHONY: e2e-driver-images
e2e-driver-images: deps-runtime deps-tools deps-qemu local-cluster ## Local cluster: the example drivers installed from their driver images (hack/e2e-driver-images.sh): the sim device driver beside hostdev (its resource on the Node, a VMI of the simulated class fake given one and named in its domain spec), a VMI booted from the storage driver's disks, a wrong sha256 refused by name while the other drivers serve; then DRIVERS again.
	$(MAKE) --no-print-directory images
	$(GO) build -o $(BIN)/vmctl ./cmd/vmctl
	DRIVERS=$(DRIVERS) GO=$(GO) hack/e2e-driver-images.sh

# deps-qemu, deps-libvirt: the pause image comes from hack/images, which also copies the host's
# QEMU and libvirtd into the launcher image (make verify counts what a program may call, not
# what one run of it calls).
.PHONY: test-deviceplugins-kubelet
test-deviceplugins-kubelet: deps-runtime deps-net deps-qemu deps-libvirt k8s-bins ## Device plugins against a real kubelet and containerd in a private sandbox: registration, kubelet restart, an unprivileged pod with kvm/tun (root).
	@test -s $(OUT)/images/pause.tar || $(GO) run ./hack/images --out $(OUT)/images pause
	deviceplugins/testdata/kubelet-sandbox.sh

##@ Install

DRIVERS ?= qmp,libvirt,cni,local,hostdev

.PHONY: install
install: deps-tools $(if $(KUBECONFIG),,cluster-up images) ## Install Kubevisor through kubevisor-operator with the drivers DRIVERS (default qmp,libvirt,cni,local,hostdev; NAME:KIND=IMAGE a driver image) on the cluster of KUBECONFIG (default: the local cluster, brought up with its images) and wait until the Kubevisor object is Available.
	hack/install.sh install --drivers $(DRIVERS) $(if $(KUBECONFIG),--kubeconfig $(KUBECONFIG))

.PHONY: uninstall
uninstall: deps-tools ## Remove Kubevisor from the cluster of KUBECONFIG: the Kubevisor object deleted with uninstallStrategy RemoveWorkloads (the operator deletes VMs and VMIs first, the components, then the CRDs and the node labels), then the operator.
	hack/install.sh uninstall $(if $(KUBECONFIG),--kubeconfig $(KUBECONFIG))

.PHONY: install-smoke
install-smoke: $(CLUSTER_DEPS) k8s-bins cni-plugins ## Local cluster: install DRIVERS, components Ready, a VMI admitted and its launcher pod running; prints how far the VMI gets.
	DRIVERS=$(DRIVERS) hack/cluster/install-smoke.sh

##@ Test guest

.PHONY: guest
guest: deps-guest deps-qemu ## Build the test guest (kernel, initramfs, bootable disk, containerDisk image) into _output/guest/.
	GO=$(GO) hack/guest/build.sh

.PHONY: guest-smoke
guest-smoke: deps-qemu deps-iso deps-node deps-tools deps-net guest ## Boot the test guest under QEMU/TCG with raw qemu-system-x86_64 and check it.
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

.PHONY: deps $(addprefix deps-,$(DEPS_SETS))
deps: $(addprefix deps-,$(DEPS_SETS)) ## Install the Debian packages of every set in hack/deps/packages.txt (only those missing).

$(addprefix deps-,$(DEPS_SETS)): deps-%:
	@hack/deps/install.sh $*

.PHONY: generate
generate: deps-build ## Regenerate protobuf code, deepcopy functions, CRDs, webhook configurations, per-component RBAC, the KubeVirt field list with docs/kubevirt-compatibility.md, and the launcher's seccomp profile (core/seccomp/launcher.json, from containerd's default: hack/seccomp).
	hack/generate-proto.sh
	hack/generate-api.sh
	$(GO) run ./hack/kubevirt-compat
	hack/generate-webhook.sh
	hack/generate-rbac.sh
	cd hack/seccomp && $(GO) run . -o ../../core/seccomp/launcher.json

.PHONY: verify
verify: generate deps-libvirt ## Fail when generated files are stale, go.mod is not tidy, code is not gofmt'ed, go vet / staticcheck complain, or a target calls a command it does not install.
	@git diff --exit-code --stat -- $(GENERATED) || { echo "generated files differ from what is committed: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { echo "make generate created untracked files:"; git status --porcelain -- $(GENERATED); exit 1; }
	@bad=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$bad" || { echo "not gofmt'ed: $$bad"; exit 1; }
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' (and in $(EXAMPLES))"; exit 1; }
	@for ex in $(EXAMPLES); do (cd $$ex && $(GO) mod tidy -diff >/dev/null) || { echo "$$ex: go.mod/go.sum are not tidy: run 'go mod tidy' there"; exit 1; }; done
	$(GO) vet ./...
	$(GO) vet -tags e2e ./conformance/e2e/...
	for ex in $(EXAMPLES); do (cd $$ex && $(GO) vet ./...); done
	$(GOTOOL) staticcheck ./...
	$(GOTOOL) staticcheck -tags e2e ./conformance/e2e/...
	$(GO) run ./hack/deps/check

.PHONY: kubevirt-coverage
kubevirt-coverage: ## Print how many of KubeVirt's VirtualMachineInstanceSpec fields reach admission through the CRDs, are implemented, refused with a reason, or planned (docs/kubevirt-compatibility.md lists them).
	$(GO) test -count=1 -run '^TestKubeVirtFieldCoverage$$' -v ./core/kubevirtcompat

.PHONY: clean
clean: ## Remove build output (keeps the Kubernetes binaries in _output/k8s, which take minutes to rebuild).
	rm -rf $(BIN) $(filter-out $(OUT)/k8s,$(wildcard $(OUT)/*))

##@ vmctl

.PHONY: vmctl
build: $(BIN)/kubectl-vm
vmctl: $(BIN)/kubectl-vm ## Build bin/vmctl, and bin/kubectl-vm: the same binary as the kubectl plugin "kubectl vm".
	$(GO) build -o $(BIN)/vmctl ./cmd/vmctl

# kubectl-vm is a link to vmctl, which then names itself "kubectl vm"; make build builds vmctl with ./cmd/...
$(BIN)/kubectl-vm:
	@mkdir -p $(BIN)
	ln -sf vmctl $@
