#!/usr/bin/env bash
# hack/cluster/restart.sh COMPONENT… — restart components of a running local cluster (e.g.
# kubelet, to test that device plugins re-register, or after a configuration change), leaving
# the others and the pods alone: stop each (SIGTERM, then SIGKILL after 20 s), then up.sh
# starts what is missing and waits for health and node readiness as usual.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"

(($#)) || die "usage: hack/cluster/restart.sh COMPONENT… (${COMPONENTS[*]})"
[[ "$(id -u)" == 0 ]] || die "needs root"
for c in "$@"; do
  [[ " ${COMPONENTS[*]} " == *" ${c} "* ]] || die "unknown component ${c} (${COMPONENTS[*]})"
  [[ -n "$(pid_of "${c}")" ]] || log "${c} is not running"
  stop_bg "${c}" 20
done
exec "${HERE}/up.sh"
