#!/usr/bin/env bash
# hack/cluster/restart.sh COMPONENT… — restart components of a running local cluster (e.g.
# kubelet, to test that device plugins re-register, or after a configuration change), leaving
# the others and the pods alone: stop each (SIGTERM, then SIGKILL after 20 s), then up.sh
# starts what is missing and waits for health and node readiness as usual. Node 2's are
# node2-containerd and node2-kubelet (make up NODES=2).
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"

ALL=("${COMPONENTS[@]}" "${NODE2_COMPONENTS[@]}")
(($#)) || die "usage: hack/cluster/restart.sh COMPONENT… (${ALL[*]})"
[[ "$(id -u)" == 0 ]] || die "needs root"
for c in "$@"; do
  [[ " ${ALL[*]} " == *" ${c} "* ]] || die "unknown component ${c} (${ALL[*]})"
  [[ -n "$(pid_of "${c}")" ]] || log "${c} is not running"
  stop_bg "${c}" 20
done
exec "${HERE}/up.sh"
