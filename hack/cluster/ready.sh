#!/usr/bin/env bash
# hack/cluster/ready.sh — exit 0 when the local cluster (make up) answers and Kubevisor runs in
# it (kubevisor-operator, kubevisor-controller and kubevisor-api Available, the handler DaemonSet rolled out), else
# exit 1 saying what is missing. `make e2e` and `make bench-e2e` run `make up` when this fails,
# so that they work first on a fresh machine; on a running cluster they use it as it is.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ -s "${KUBECONFIG_ADMIN}" ]] || { log "ready: no local cluster (${KUBECONFIG_ADMIN} missing)"; exit 1; }
kubectl_ get --raw /readyz >/dev/null 2>&1 || { log "ready: the local cluster's API server does not answer"; exit 1; }
# NODES (make e2e NODES=2), else as many as the last up made: that many nodes must be Ready.
want="${NODES:-$(cat "${NODES_FILE}" 2>/dev/null || true)}"
want="${want:-1}"
ready="$(kubectl_ get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c '^True$' || true)"
((ready >= want)) || { log "ready: ${ready} node(s) Ready, ${want} wanted (NODES)"; exit 1; }
for d in kubevisor-operator kubevisor-controller kubevisor-api; do
  [[ "$(kubectl_ -n kubevisor-system get deployment "${d}" -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null)" == True ]] ||
    { log "ready: ${d} is not installed or not Available"; exit 1; }
done
kubectl_ -n kubevisor-system rollout status daemonset/kubevisor-handler --timeout=5s >/dev/null 2>&1 ||
  { log "ready: the kubevisor-handler DaemonSet is not rolled out"; exit 1; }
log "ready: using the running local cluster with Kubevisor installed (make up rebuilds and reinstalls it)"
