#!/usr/bin/env bash
# hack/e2e-driver-images.sh — the cluster proof of third-party drivers installed from driver
# images (docs/driver-authoring.md, section 12), on the local cluster (make up), with the
# examples' images built and imported (make images): make e2e-driver-images runs it.
#
# For each case it installs a driver set with hack/install.sh, through kubevisor-operator, the
# example's driver image named in the Kubevisor's spec.drivers (NAME:KIND=IMAGE; the handler
# DaemonSet rolls) and runs the e2e specs labelled "DriverImages && <case>"
# (conformance/e2e/driverimages.go):
#   Device       qmp,cni,local,hostdev,fake + sim:device=kubevisor-examples/sim-device:dev (beside hostdev: a node
#                runs several device drivers): installed, loaded, its resource
#                devices.kubevisor.io/example-sim on the Node with hostdev's kvm and tun, a VMI of
#                the simulated class fake asking for one (hostDevices) gets one allocated and its
#                hypervisor driver's domain spec names it (the fake guest's boot log on the
#                console, vmctl console), and a qmp VMI asking for one is refused naming
#                hostDevices[0] (no PCI address)
#   Storage      qmp,cni,hostdev + hostpath:storage=kubevisor-examples/hostpath-storage:dev (in place of local): a VMI
#                boots from a hostDisk the hostpath driver serves (a copy of the test guest's raw
#                disk under /var/lib/kubevisor/e2e-hostpath on the node) and sees its emptyDisk
#   BadChecksum  the same storage driver from an image whose manifest's sha256 is wrong:
#                refused by name, the node's other drivers loaded and serving
# then installs $DRIVERS (default qmp,libvirt,cni,local,hostdev) again, also when a case failed. JUnit reports:
# _output/e2e-driver-images-<case>.xml.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
GO="${GO:-go}"
OUT="${ROOT}/_output"
KUBECONFIG="${OUT}/cluster/kubeconfig"
DRIVERS="${DRIVERS:-qmp,libvirt,cni,local,hostdev}"
DISK_DIR=/var/lib/kubevisor/e2e-hostpath
# A second node of the local cluster (make up NODES=2) sees its own directory at /var/lib/kubevisor
# (hack/cluster/README.md): the disk goes there too, wherever the VMI is scheduled.
NODE2_DISK_DIR=/var/lib/kubevisor-cluster/node2/kubevisor/e2e-hostpath
export KUBECONFIG

die() { echo "e2e-driver-images: $*" >&2; exit 1; }
log() { echo "==> e2e-driver-images: $*"; }

[[ -f "${KUBECONFIG}" ]] && kubectl get nodes >/dev/null 2>&1 || die "the local cluster does not answer (${KUBECONFIG}): make up"
for img in sim-device hostpath-storage; do
  [[ -s "${OUT}/images/${img}.tar" ]] || die "no driver image ${OUT}/images/${img}.tar: make images"
done
[[ -s "${OUT}/examples/hostpath-storage" ]] || die "no ${OUT}/examples/hostpath-storage: make images"
[[ -s "${OUT}/guest/disk.raw" ]] || die "no test guest disk ${OUT}/guest/disk.raw: make guest"

work="$(mktemp -d "${TMPDIR:-/tmp}/kubevisor-e2e-driver-images.XXXXXX")"
restore() {
  local rc=$?
  log "installing DRIVERS=${DRIVERS} again"
  kubectl delete vm,vmi --all --all-namespaces --wait --timeout=2m >/dev/null 2>&1 || true
  hack/install.sh install --drivers "${DRIVERS}" >/dev/null || rc=1
  rm -rf "${work}" "${DISK_DIR}" "${NODE2_DISK_DIR}"
  exit "${rc}"
}
trap restore EXIT

# install DRIVERS: with no VM or VMI left of the previous case (its storage driver releases its
# disks). VMs go too: a VM that runs Always (make up's demo) would make a new VMI at once, whose
# disks a storage driver the next install drops could then never release.
install() {
  log "install --drivers $1 (every VM and VMI deleted first)"
  kubectl delete vm,vmi --all --all-namespaces --wait --timeout=2m >/dev/null
  hack/install.sh install --drivers "$1" >/dev/null
}

# spec CASE [VAR=value...]: the e2e specs of that label.
spec() {
  local label="$1"; shift
  log "specs DriverImages && ${label}"
  env "$@" "${GO}" test -tags e2e -count=1 -timeout 20m ./conformance/e2e -args -kubeconfig "${KUBECONFIG}" \
    -vmctl "${ROOT}/bin/vmctl" -ginkgo.label-filter "DriverImages && ${label}" \
    -ginkgo.junit-report "${OUT}/e2e-driver-images-${label}.xml" -ginkgo.v
}

install "qmp,cni,local,hostdev,fake,sim:device=kubevisor-examples/sim-device:dev"
spec Device

for d in "${DISK_DIR}" $([[ -d "${NODE2_DISK_DIR%/*}" ]] && echo "${NODE2_DISK_DIR}"); do
  mkdir -p "${d}"
  chmod 0700 "${d}"
  # The qmp class's launcher pods run as 107 (KubeVirt's qemu): a hostDisk's directory must be
  # reachable by that user, as with KubeVirt (the handler gives it the writable image itself).
  chown 107:107 "${d}"
  cp --sparse=always "${OUT}/guest/disk.raw" "${d}/disk.raw"
done
install "qmp,cni,hostdev,hostpath:storage=kubevisor-examples/hostpath-storage:dev"
spec Storage "E2E_HOSTPATH_DISK=${DISK_DIR}/disk.raw"

# The same driver with a manifest whose digest is not its binary's.
# (in the temporary directory, not _output/images: make images imports every tarball there)
"${GO}" run ./hack/images -out "${work}" -repo kubevisor-examples -name hostpath-storage-badsum \
  -driver-bin "${OUT}/examples/hostpath-storage" -driver-kind storage -driver-name hostpath \
  -driver-sha256 "$(printf '0%.0s' {1..64})" driver
hack/cluster/load-images.sh "${work}/hostpath-storage-badsum.tar"
install "qmp,cni,hostdev,hostpath:storage=kubevisor-examples/hostpath-storage-badsum:dev"
spec BadChecksum
log "passed"
