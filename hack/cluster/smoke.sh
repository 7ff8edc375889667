#!/usr/bin/env bash
# hack/cluster/smoke.sh — end-to-end check of the local cluster tooling:
#   up.sh → node Ready → a pod from a locally built image (kubevisor/pause, imagePullPolicy
#   Never) Running with a pod IP from the bridge → the host reaches the pod's address, the pod
#   reaches the API server at the kubernetes Service address → up.sh again (fast, changes
#   nothing) → down.sh → nothing of the cluster left (down.sh checks that itself).
# Timings of each phase are printed at the end. KEEP=1 leaves the cluster up after the checks.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"

POD=kubevisor-smoke
declare -A T
phase() { # name command...
  local name="$1" t0="${SECONDS}"
  shift
  "$@"
  T[${name}]=$((SECONDS - t0))
}
fail() {
  log "smoke: FAILED: $*"
  kubectl_ describe pod "${POD}" 2>/dev/null | tail -20 >&2 || true
  exit 1
}

phase up "${HERE}/up.sh"

run_pod() {
  kubectl_ delete pod "${POD}" --ignore-not-found --wait=true >/dev/null
  log "smoke: pod ${POD} from ${PAUSE_IMAGE} (imagePullPolicy Never)"
  # On the first node (a second one, make up NODES=2, has other addresses and its own containerd).
  kubectl_ run "${POD}" --image "${PAUSE_IMAGE}" --image-pull-policy Never --restart Never \
    --overrides "{\"spec\":{\"nodeName\":\"${NODE_NAME}\"}}" >/dev/null
  kubectl_ wait --for=condition=Ready "pod/${POD}" --timeout 90s >/dev/null || fail "pod not Ready in 90s"
}
phase pod run_pod

check_network() {
  local ip cid pid
  ip="$(kubectl_ get pod "${POD}" -o jsonpath='{.status.podIP}')"
  [[ "${ip}" == "${POD_CIDR%.*}".* ]] || fail "pod IP '${ip}' not in ${POD_CIDR}"
  log "smoke: pod Running, IP ${ip}"
  # Nothing listens in the pause container: a refused connection (not a timeout) proves the
  # host routes to the pod over ${BRIDGE}.
  if timeout 3 bash -c "exec 3<>/dev/tcp/${ip}/80" 2>/dev/null; then :; else
    (($? == 124)) && fail "host → pod ${ip}: timed out"
  fi
  log "smoke: host reaches the pod at ${ip}"
  # From inside the pod's network namespace, the kubernetes Service (DNAT of ours, no
  # kube-proxy) answers with the API server's version, its certificate valid for that address.
  cid="$(kubectl_ get pod "${POD}" -o jsonpath='{.status.containerStatuses[0].containerID}')"
  pid="$(ctr_ tasks ls | awk -v c="${cid#containerd://}" '$1 == c {print $2}')"
  [[ -n "${pid}" ]] || fail "no task for container ${cid}"
  nsenter --net="/proc/${pid}/ns/net" curl -fsS --max-time 5 --cacert "${PKI}/ca.crt" \
    "https://${KUBERNETES_SVC_IP}/version" | grep -q '"gitVersion"' || fail "pod → https://${KUBERNETES_SVC_IP}: no answer"
  log "smoke: pod reaches the API server at https://${KUBERNETES_SVC_IP}"
}
phase network check_network

phase up-again "${HERE}/up.sh"
kubectl_ get pod "${POD}" -o jsonpath='{.status.phase}' | grep -qx Running || fail "pod not Running after the second up"

if [[ "${KEEP:-0}" == 1 ]]; then
  log "smoke: passed (cluster left up: KEEP=1)"
  exit 0
fi
kubectl_ delete pod "${POD}" --wait=true >/dev/null
phase down "${HERE}/down.sh"
log "smoke: passed; seconds: up ${T[up]}, pod Running ${T[pod]}, network checks ${T[network]}, second up ${T[up-again]}, down ${T[down]}"
