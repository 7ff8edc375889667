#!/usr/bin/env bash
# hack/cluster/install-smoke.sh — Kubevisor installed from manifests/install on the local cluster:
#   up.sh → load-images.sh (the images of make images) → hack/install.sh with $DRIVERS
#   (default qmp,libvirt,cni,local,hostdev) → every kubevisor-system pod Running and Ready → the node has the
#   handler's capability labels, the hypervisor driver healthy or degraded → a VMI (the test
#   guest's containerDisk kubevisor/test-guest:latest) is admitted and defaulted by the webhook
#   → its launcher pod is scheduled on the node and its launcher container runs → how far the
#   VMI gets within $VMI_WAIT seconds (default 90): phase, and the condition that says why it
#   stops, printed.
# It fails when a step up to the running launcher fails; the VMI's phase after that is reported,
# and required only with REQUIRE_RUNNING=1 (Running, and the guest's web server answering at its
# IP). KEEP=1 leaves the VMI and the installation; by default both are removed (the cluster
# stays up: make down).
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"

DRIVERS="${DRIVERS:-qmp,libvirt,cni,local,hostdev}"
VMI_WAIT="${VMI_WAIT:-90}"
NS=kubevisor-smoke
VMI=demo
SYSNS=kubevisor-system
export KUBECONFIG="${KUBECONFIG_ADMIN}"

declare -A T
order=()
phase() { # name command...
  local name="$1" t0="${SECONDS}"
  shift
  "$@"
  T[${name}]=$((SECONDS - t0))
  order+=("${name}")
}
fail() {
  log "install-smoke: FAILED: $*"
  kubectl_ -n "${SYSNS}" get pods -o wide >&2 || true
  kubectl_ -n "${NS}" get vmi,pods -o wide >&2 || true
  kubectl_ -n "${NS}" describe pods 2>/dev/null | sed -n '/^Events:/,$p' | tail -15 >&2 || true
  exit 1
}
jp() { kubectl_ "$@" 2>/dev/null || true; }

phase up "${HERE}/up.sh"

# The handler's host state directory (/run/kubevisor) is mounted with Bidirectional
# propagation (it bind-mounts containerDisk disks there for the launcher pods), which the
# runtime allows only on a shared mount. On a systemd node every mount is shared; this machine's
# / is private, so the directory gets a shared bind mount of its own, as up.sh should make it.
HOST_STATE=/run/kubevisor
SHARED_BY_US=0
share_host_state() {
  if [[ "$(findmnt -n -o PROPAGATION --target "${HOST_STATE}" 2>/dev/null || true)" != *shared* ]]; then
    mkdir -p "${HOST_STATE}"
    mount --bind "${HOST_STATE}" "${HOST_STATE}"
    mount --make-rshared "${HOST_STATE}"
    SHARED_BY_US=1
    log "install-smoke: ${HOST_STATE} made a shared mount (the node's / is private)"
  fi
}
phase shared-mount share_host_state
phase images "${HERE}/load-images.sh"
phase install "${ROOT}/hack/install.sh" install --drivers "${DRIVERS}" --kubeconfig "${KUBECONFIG_ADMIN}"

check_components() {
  local bad
  bad="$(kubectl_ -n "${SYSNS}" get pods -o go-template='{{range .items}}{{$p := .metadata.name}}{{if ne .status.phase "Running"}}{{$p}} {{.status.phase}}{{"\n"}}{{end}}{{range .status.containerStatuses}}{{if not .ready}}{{$p}}/{{.name}} not ready{{"\n"}}{{end}}{{end}}{{end}}')"
  [[ -z "${bad}" ]] || fail "components not Running and Ready: ${bad}"
  log "install-smoke: components Running and Ready:"
  kubectl_ -n "${SYSNS}" get pods -o wide
}
phase components check_components

# The handler publishes its drivers' labels once they are fingerprinted (the qmp driver boots a
# probe guest first: seconds).
check_labels() {
  local node hv="" labels i
  node="$(kubectl_ get nodes -o jsonpath='{.items[0].metadata.name}')"
  for i in $(seq 1 60); do
    labels="$(kubectl_ get node "${node}" -o go-template='{{range $k, $v := .metadata.labels}}{{$k}}={{$v}}{{"\n"}}{{end}}' | grep -E '^(capability\.)?kubevisor\.io/' || true)"
    hv="$(grep -E '^capability\.kubevisor\.io/hypervisor\.' <<<"${labels}" || true)"
    # A label of an earlier handler may still be there until this one's probe ends: wait for
    # a usable driver, not for any label.
    grep -qE '=(healthy|degraded)$' <<<"${hv}" && break
    sleep 1
  done
  log "install-smoke: node ${node} labels:"
  sed 's/^/    /' <<<"${labels}"
  [[ -n "${hv}" ]] || fail "no capability.kubevisor.io/hypervisor.* label on ${node} after 60s"
  grep -qE '=(healthy|degraded)$' <<<"${hv}" \
    || fail "hypervisor driver not usable on ${node} (${hv}); launcher pods require healthy or degraded: kubectl -n ${SYSNS} logs ds/kubevisor-handler -c handler | grep probed"
}
phase labels check_labels

create_vmi() {
  kubectl_ delete namespace "${NS}" --ignore-not-found --wait=true >/dev/null
  kubectl_ create namespace "${NS}" >/dev/null
  # core/handler/testdata/demo-vmi.yaml with the test guest's containerDisk image (make images
  # imports kubevisor/test-guest:latest into containerd).
  kubectl_ -n "${NS}" apply -f - <<'EOF' || fail "VMI not admitted"
apiVersion: kubevisor.io/v1alpha1
kind: VirtualMachineInstance
metadata:
  name: demo
  labels:
    app: demo
spec:
  terminationGracePeriodSeconds: 30
  domain:
    memory:
      guest: 256Mi
    devices:
      disks:
      - name: containerdisk
        disk:
          bus: virtio
      - name: cloudinitdisk
        cdrom:
          bus: scsi # the guest's kernel has no AHCI driver: no SATA cdrom on q35
      interfaces:
      - name: default
        masquerade: {}
        ports:
        - name: http
          port: 80
  networks:
  - name: default
    pod: {}
  volumes:
  - name: containerdisk
    containerDisk:
      image: kubevisor/test-guest:latest
  - name: cloudinitdisk
    cloudInitNoCloud:
      userData: |
        #cloud-config
        # hello from hack/cluster/install-smoke.sh
EOF
  local class machine
  class="$(jp -n "${NS}" get vmi "${VMI}" -o jsonpath='{.spec.hypervisorClassName}')"
  machine="$(jp -n "${NS}" get vmi "${VMI}" -o jsonpath='{.spec.domain.machine.type}')"
  [[ -n "${class}" && -n "${machine}" ]] \
    || fail "VMI not defaulted by the webhook (hypervisorClassName '${class}', machine.type '${machine}')"
  log "install-smoke: VMI ${NS}/${VMI} admitted and defaulted: hypervisorClassName ${class}, machine ${machine}"
}
phase vmi create_vmi

wait_launcher() {
  local pod="" node="" state="" i
  for i in $(seq 1 90); do
    pod="$(jp -n "${NS}" get vmi "${VMI}" -o jsonpath='{.status.launcherPodName}')"
    if [[ -n "${pod}" ]]; then
      node="$(jp -n "${NS}" get pod "${pod}" -o jsonpath='{.spec.nodeName}')"
      state="$(jp -n "${NS}" get pod "${pod}" -o jsonpath='{.status.containerStatuses[?(@.name=="compute")].state}')"
      [[ "${state}" == *'"running"'* ]] && break
    fi
    sleep 1
  done
  [[ -n "${pod}" ]] || fail "the VMI got no launcher pod in 90s"
  [[ -n "${node}" ]] || fail "launcher pod ${pod} not scheduled in 90s"
  [[ "${state}" == *'"running"'* ]] || fail "launcher container of ${pod} not running in 90s (state ${state:-none})"
  local privileged
  privileged="$(jp -n "${NS}" get pod "${pod}" -o jsonpath='{.spec.containers[*].securityContext.privileged}')"
  [[ "${privileged}" != *true* ]] || fail "launcher pod ${pod} is privileged"
  log "install-smoke: launcher pod ${pod} on node ${node}, container compute running, not privileged"
  jp -n "${NS}" logs "${pod}" --tail=3 | sed 's/^/    /'
}
phase launcher wait_launcher

RESULT=""
HTTP=""
follow_vmi() {
  local phase="" i
  for i in $(seq 1 "${VMI_WAIT}"); do
    phase="$(jp -n "${NS}" get vmi "${VMI}" -o jsonpath='{.status.phase}')"
    [[ "${phase}" == Running || "${phase}" == Failed || "${phase}" == Succeeded ]] && break
    # A spec the node cannot run does not get better by waiting.
    [[ "$(jp -n "${NS}" get vmi "${VMI}" -o jsonpath='{.status.conditions[?(@.reason=="InvalidSpec")].type}')" ]] && break
    sleep 1
  done
  RESULT="${phase}"
  log "install-smoke: VMI ${NS}/${VMI} phase after ${i}s (at most ${VMI_WAIT}s): ${phase:-none}"
  kubectl_ -n "${NS}" get vmi "${VMI}" \
    -o go-template='{{range .status.conditions}}    {{.type}}={{.status}} {{or .reason ""}}: {{or .message ""}}{{"\n"}}{{end}}' || true
  local ip
  ip="$(jp -n "${NS}" get vmi "${VMI}" -o jsonpath='{.status.interfaces[0].ipAddress}')"
  if [[ "${phase}" == Running && -n "${ip}" ]]; then
    # The test guest's web server, from the node (as make run prints it), once it has booted.
    local answer="" j
    for j in $(seq 1 60); do
      answer="$(curl -s -m 2 "http://${ip}/" | head -1 || true)"
      [[ -n "${answer}" ]] && break
      sleep 1
    done
    HTTP="${answer}"
    log "install-smoke: http://${ip}/ after ${j}s: ${answer:-no answer}"
  fi
  kubectl_ -n "${NS}" get events --field-selector involvedObject.kind=VirtualMachineInstance \
    -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message 2>/dev/null | tail -5 | sed 's/^/    /' || true
}
phase follow follow_vmi

cleanup() {
  kubectl_ delete namespace "${NS}" --ignore-not-found --wait=true --timeout=120s >/dev/null || true
  "${ROOT}/hack/install.sh" uninstall --kubeconfig "${KUBECONFIG_ADMIN}"
  if [[ "${SHARED_BY_US}" == 1 ]]; then umount -R "${HOST_STATE}" || true; fi
}
if [[ "${KEEP:-0}" != 1 ]]; then phase cleanup cleanup; fi

log "install-smoke: timings (s):$(for p in "${order[@]}"; do printf ' %s=%s' "${p}" "${T[${p}]}"; done)"
if [[ "${REQUIRE_RUNNING:-0}" == 1 ]]; then
  [[ "${RESULT}" == Running ]] || fail "VMI ended ${RESULT:-without a phase}, not Running"
  [[ -n "${HTTP}" ]] || fail "VMI Running but its web server did not answer"
fi
log "install-smoke: OK (components ready, VMI admitted, launcher running; VMI phase ${RESULT:-none})"
