#!/usr/bin/env bash
# hack/cluster/partition.sh cut|heal|status — cut node 2 of the local cluster (make up NODES=2)
# from the API server, or heal the cut. The cut drops, in node 2's network namespace, every TCP
# packet to or from the API server's port (6443): its kubelet's, and its pods' (the handler's,
# the launchers'), which reach the API server through node 2's forwarding (the kubernetes
# Service is DNATed to the host's address there). Everything else goes on: the pods' network,
# the guests, the migration and stream ports, node 1. Connections open at the cut stall (their
# packets are dropped, not refused), as on a real partition.
#
# The rules are in a chain of their own (KV-CLUSTER-CUT) jumped to first from INPUT, OUTPUT and
# FORWARD: heal removes them all; down.sh removes node 2's namespace and with it any cut left.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/lib.sh
source "${HERE}/lib.sh"

CUT_CHAIN="${IPT_CHAIN}-CUT"
[[ "$(id -u)" == 0 ]] || die "needs root"
[[ -e "/run/netns/${NODE2_NETNS}" ]] || die "node 2 is not up (no network namespace ${NODE2_NETNS}): make up NODES=2"
ipt=(in_node2 iptables -w)

unhook() {
  local c
  for c in INPUT OUTPUT FORWARD; do
    while "${ipt[@]}" -D "${c}" -j "${CUT_CHAIN}" 2>/dev/null; do :; done
  done
  "${ipt[@]}" -F "${CUT_CHAIN}" 2>/dev/null || true
  "${ipt[@]}" -X "${CUT_CHAIN}" 2>/dev/null || true
}

case "${1:-}" in
cut)
  unhook
  "${ipt[@]}" -N "${CUT_CHAIN}"
  "${ipt[@]}" -A "${CUT_CHAIN}" -p tcp --dport "${APISERVER_PORT}" -j DROP
  "${ipt[@]}" -A "${CUT_CHAIN}" -p tcp --sport "${APISERVER_PORT}" -j DROP
  for c in INPUT OUTPUT FORWARD; do "${ipt[@]}" -I "${c}" 1 -j "${CUT_CHAIN}"; done
  log "node 2 (${NODE2_NAME}) cut from the API server (tcp ${APISERVER_PORT} dropped in ${NODE2_NETNS})"
  ;;
heal)
  unhook
  log "node 2 (${NODE2_NAME}) reaches the API server again"
  ;;
status)
  if "${ipt[@]}" -S "${CUT_CHAIN}" >/dev/null 2>&1; then echo cut; else echo healed; fi
  ;;
*) die "usage: hack/cluster/partition.sh cut|heal|status" ;;
esac
