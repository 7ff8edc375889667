#!/usr/bin/env bash
# hack/cluster/rollout.sh — restart Kubevisor's components on the local cluster when
# load-images.sh imported new builds of their images. The images keep their tag (dev), so
# the Deployments and the DaemonSet do not change and their pods would keep running the old
# binaries. Part of `make up`; does nothing when no image changed. The handler leaves running
# VMs to the next handler, which re-adopts them.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"
CHANGED="${OUT}/images.changed"

[[ -s "${CHANGED}" ]] || { log "rollout: no image changed"; exit 0; }
if ! grep -q 'kubevisor/kubevisor-' "${CHANGED}"; then
  rm -f "${CHANGED}"
  log "rollout: no Kubevisor component image changed"
  exit 0
fi
# Pods made after the import (a fresh install) already run the new images.
imported="$(stat -c %Y "${CHANGED}")"
oldest="$(kubectl_ -n kubevisor-system get pods \
  -o jsonpath='{range .items[*]}{.metadata.creationTimestamp}{"\n"}{end}' | sort | head -1)"
if [[ -n "${oldest}" ]] && (($(date -d "${oldest}" +%s) >= imported)); then
  rm -f "${CHANGED}"
  log "rollout: the components started after the images were imported"
  exit 0
fi
log "rollout: new images imported ($(grep -o 'kubevisor/kubevisor-[a-z]*' "${CHANGED}" | sort -u | tr '\n' ' ')): restarting the components"
# The operator (absent from an install made with --no-operator) first: it keeps the others.
objs=()
for o in deployment/kubevisor-operator deployment/kubevisor-controller deployment/kubevisor-api daemonset/kubevisor-handler; do
  kubectl_ -n kubevisor-system get "${o}" >/dev/null 2>&1 && objs+=("${o}")
done
kubectl_ -n kubevisor-system rollout restart "${objs[@]}" >/dev/null
for o in "${objs[@]}"; do
  kubectl_ -n kubevisor-system rollout status "${o}" --timeout=5m >/dev/null || die "rollout: ${o} did not become ready"
done
rm -f "${CHANGED}"
log "rollout: components restarted on the new images"
