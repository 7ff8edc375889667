#!/usr/bin/env bash
# hack/cluster/demo.sh — boot the demo VM (hack/cluster/demo-vm.yaml) on the local cluster with
# Kubevisor installed, wait until it runs and its console shows the guest's ready marker, check
# its web server from the node, and print how to reach it. Idempotent: an existing demo VM is
# kept. The last step of `make up`.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"
export KUBECONFIG="${KUBECONFIG_ADMIN}"
NS="${DEMO_NAMESPACE:-default}"
WAIT="${DEMO_WAIT:-300}"
k() { kubectl_ -n "${NS}" "$@"; }

# The demo VM names no HypervisorClass, so it runs with the default one. Without a default class
# (DRIVERS without qmp, e.g. libvirt,cni,local,hostdev) it runs with DEMO_CLASS, else the
# cluster's only class.
class="${DEMO_CLASS:-}"
if [[ -z "${class}" ]]; then
  classes="$(kubectl_ get hypervisorclasses -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.annotations.hypervisorclass\.kubevisor\.io/is-default-class}{"\n"}{end}')"
  if ! grep -q ' true$' <<<"${classes}"; then
    mapfile -t names < <(awk 'NF {print $1}' <<<"${classes}")
    ((${#names[@]} == 1)) || die "no default HypervisorClass and ${#names[@]} classes (${names[*]:-none}): set DEMO_CLASS"
    class="${names[0]}"
  fi
fi
if [[ -n "${class}" ]]; then
  log "demo VM: kubectl apply -f hack/cluster/demo-vm.yaml, with hypervisorClassName ${class}"
  sed "/^    spec:\$/a\\      hypervisorClassName: ${class}" "${HERE}/demo-vm.yaml" | k apply -f - >/dev/null
else
  log "demo VM: kubectl apply -f hack/cluster/demo-vm.yaml"
  k apply -f "${HERE}/demo-vm.yaml" >/dev/null
fi

t0="${SECONDS}"
phase=""
while ((SECONDS - t0 < WAIT)); do
  phase="$(k get vmi demo -o jsonpath='{.status.phase}' 2>/dev/null || true)"
  [[ "${phase}" == Running ]] && break
  if [[ "${phase}" == Failed ]]; then
    k get vmi demo -o yaml >&2
    die "the demo VMI failed"
  fi
  sleep 2
done
[[ "${phase}" == Running ]] || { k get vmi demo -o yaml >&2 || true; die "the demo VMI is not Running after ${WAIT}s (phase ${phase:-none})"; }
ip="$(k get vmi demo -o jsonpath='{.status.interfaces[0].ipAddress}')"
pod="$(k get pods -l kubevisor.io/vmi-name=demo -o jsonpath='{.items[0].metadata.name}')"
log "demo VMI Running after $((SECONDS - t0))s on node $(k get vmi demo -o jsonpath='{.status.nodeName}'), IP ${ip}, launcher pod ${pod}"

log "waiting for the guest's ready marker on its serial console"
until k logs "${pod}" -c guest-console-log 2>/dev/null | grep -q KUBEVISOR-GUEST-READY; do
  ((SECONDS - t0 < WAIT)) || die "no KUBEVISOR-GUEST-READY on the console after ${WAIT}s"
  sleep 2
done
k logs "${pod}" -c guest-console-log | sed -n '/KUBEVISOR-USERDATA-BEGIN/,/KUBEVISOR-USERDATA-END/p' >&2

answer=""
until answer="$(curl -fsS --max-time 5 "http://${ip}/" 2>/dev/null)"; do
  ((SECONDS - t0 < WAIT)) || die "the guest's web server does not answer at http://${ip}/"
  sleep 2
done
log "curl http://${ip}/ -> ${answer}"
cat >&2 <<TXT

The demo VM runs on the local cluster. To reach it:
  export KUBECONFIG=${KUBECONFIG_ADMIN}
  kubectl get vm,vmi -n ${NS}                           # the VM and its running instance
  kubectl logs -n ${NS} ${pod} -c guest-console-log     # its serial console
  curl http://${ip}/                                    # its web server (pod IP, masquerade)
  kubectl patch vm demo -n ${NS} --type=merge -p '{"spec":{"runStrategy":"Halted"}}'   # stop it
Stop everything with: make down
TXT
