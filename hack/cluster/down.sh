#!/usr/bin/env bash
# hack/cluster/down.sh — stop the local cluster (make down) and leave none of its processes,
# mounts, network namespaces, bridge, iptables rules, cgroups or changed sysctls behind, nor
# anything of a second node (make up NODES=2: its namespaces, veth pair, route, cgroup root).
# Pods are not deleted from the API: their containers are killed, and the next up.sh lets
# kubelet recreate them. Kept for a fast next up: etcd data, containerd's images, certificates.
#
#   hack/cluster/down.sh           stop everything
#   hack/cluster/down.sh --purge   also delete that state (etcd, images, kubelet dir, certs)
#
# Safe to run when nothing runs, or twice. It ends with a check that lists anything of ours
# still there and fails if so.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=hack/cluster/node2.sh
source "$(dirname "${BASH_SOURCE[0]}")/node2.sh"

PURGE=0
[[ "${1:-}" == "--purge" ]] && PURGE=1
START="${SECONDS}"
[[ "$(id -u)" == 0 ]] || die "needs root"

# Node 2 first (whatever of it there is), all of it: its kubelet, pods, containerd, namespaces.
if [[ -n "$(node2_leftovers)" ]]; then
  log "stopping node 2 (${NODE2_NAME})"
  node2_down
fi

# kubelet first, so that it does not restart the containers we are about to kill.
stop_bg kubelet 20

# Every process of every pod, by the pod cgroups kubelet made: container processes and pause.
pod_procs() {
  local d
  while read -r d; do cat "${d}/cgroup.procs" 2>/dev/null || true; done < <(kubepods_cgroups)
}
procs="$(pod_procs | sort -u)"
if [[ -n "${procs}" ]]; then
  log "killing pod processes ($(wc -w <<<"${procs}"))"
  # shellcheck disable=SC2086
  kill -KILL ${procs} 2>/dev/null || true
fi

if [[ -n "$(pid_of containerd)" ]]; then
  # Delete the (now dead) tasks so that their shims unmount root filesystems and exit.
  tasks="$(ctr_ tasks ls -q 2>/dev/null || true)"
  if [[ -n "${tasks}" ]]; then
    log "deleting containerd tasks ($(wc -w <<<"${tasks}"))"
    for t in ${tasks}; do
      ctr_ tasks kill -a -s SIGKILL "${t}" >/dev/null 2>&1 || true
    done
    for t in ${tasks}; do
      ctr_ tasks delete -f "${t}" >/dev/null 2>&1 || true
    done
  fi
fi
stop_bg containerd 20
# Shims that outlived containerd (ours only: they carry our socket on their command line).
for i in 1 2 3 4 5 6 7 8 9 10; do
  pids="$(shim_pids)"
  [[ -z "${pids}" ]] && break
  ((i == 1)) && log "stopping leftover containerd shims: ${pids//$'\n'/ }"
  # shellcheck disable=SC2086
  kill -TERM ${pids} 2>/dev/null || true
  sleep 0.3
  if ((i >= 5)); then
    # shellcheck disable=SC2086
    kill -KILL ${pids} 2>/dev/null || true
  fi
done

# The scheduler, controller-manager and API server shut down in parallel (a few seconds each),
# etcd last.
for c in kube-scheduler kube-controller-manager kube-apiserver; do
  pid="$(pid_of "${c}")"
  [[ -z "${pid}" ]] || { log "SIGTERM to ${c} (pid ${pid})"; kill -TERM "${pid}" 2>/dev/null || true; }
done
for c in kube-scheduler kube-controller-manager kube-apiserver; do
  NOTERM=1 stop_bg "${c}" 30
done
stop_bg etcd 30

# Mounts: pod network namespaces (under containerd's state), container root filesystems, shm,
# kubelet's volume mounts (service account token tmpfs, ...). Deepest first; a busy one lazily.
mounts="$(our_mounts)"
if [[ -n "${mounts}" ]]; then
  log "unmounting $(wc -l <<<"${mounts}") mounts under ${RUNSTATE}, ${STATE}, ${KUBELET_ROOT}"
  while read -r m; do
    umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || log "cannot unmount ${m}"
  done <<<"${mounts}"
fi

# The shared mount up.sh made of /run/kubevisor, with whatever a handler left mounted in it.
if findmnt -n --mountpoint /run/kubevisor >/dev/null 2>&1; then
  log "unmounting /run/kubevisor"
  umount -R /run/kubevisor 2>/dev/null || umount -R -l /run/kubevisor 2>/dev/null || log "cannot unmount /run/kubevisor"
fi

# Pod cgroups kubelet made (empty once their processes are gone).
cg="$(kubepods_cgroups)"
if [[ -n "${cg}" ]]; then
  log "removing kubelet's pod cgroups"
  while read -r d; do rmdir "${d}" 2>/dev/null || true; done <<<"${cg}"
fi

# Network: the pod bridge (pod veths went with their namespaces), our iptables chains and the
# jumps to them, host-local's address records and the CNI result cache of our network.
if ip link show "${BRIDGE}" >/dev/null 2>&1; then
  log "deleting bridge ${BRIDGE}"
  ip link delete "${BRIDGE}"
fi
ipt_remove() { # table builtin-chain our-chain
  while iptables -w -t "$1" -D "$2" -j "$3" 2>/dev/null; do :; done
  iptables -w -t "$1" -F "$3" 2>/dev/null || true
  iptables -w -t "$1" -X "$3" 2>/dev/null || true
}
if command -v iptables >/dev/null; then
  if iptables-save 2>/dev/null | grep -q -- "${IPT_CHAIN}"; then log "removing iptables chains ${IPT_CHAIN}-*"; fi
  ipt_remove nat POSTROUTING "${IPT_CHAIN}-POSTROUTING"
  ipt_remove nat PREROUTING "${IPT_CHAIN}-SERVICES"
  ipt_remove nat OUTPUT "${IPT_CHAIN}-SERVICES"
  ipt_remove filter FORWARD "${IPT_CHAIN}-FORWARD"
fi
rm -rf "${CNI_IPAM_DIR}"
rm -f /var/lib/cni/results/"${CNI_NET_NAME}"-*

# sysctls back to what they were before the first up.
if [[ -s "${OUT}/sysctl.saved" ]]; then
  log "restoring sysctls ($(tr '\n' ' ' <"${OUT}/sysctl.saved"))"
  while IFS='=' read -r k v; do sysctl -qw "${k}=${v}" || log "cannot restore ${k}=${v}"; done <"${OUT}/sysctl.saved"
  rm -f "${OUT}/sysctl.saved"
fi

rm -rf "${RUNSTATE}"
if ((PURGE)); then
  if [[ -n "$(our_mounts)" ]]; then die "mounts left under our directories: not purging"; fi
  log "purging ${STATE}, ${KUBELET_ROOT}, ${OUT}"
  rm -rf --one-file-system "${STATE}" "${KUBELET_ROOT}" "${OUT}"
  # The claims' directories of the default storage class (up.sh) that no claim deletion removed.
  log "purging ${HOSTPATH_PV_DIR}"
  rm -rf --one-file-system "${HOSTPATH_PV_DIR}"
fi

# --- nothing of ours may be left --------------------------------------------------------------
left=()
for c in "${COMPONENTS[@]}"; do [[ -z "$(pid_of "${c}")" ]] || left+=("process ${c}"); done
[[ -z "$(shim_pids)" ]] || left+=("shims $(shim_pids | tr '\n' ' ')")
[[ -z "$(our_mounts)" ]] || left+=("mounts: $(our_mounts | tr '\n' ' ')")
! ip link show "${BRIDGE}" >/dev/null 2>&1 || left+=("bridge ${BRIDGE}")
if command -v iptables >/dev/null && iptables-save 2>/dev/null | grep -q -- "${IPT_CHAIN}"; then left+=("iptables ${IPT_CHAIN}"); fi
[[ -z "$(kubepods_cgroups)" ]] || left+=("cgroups $(kubepods_cgroups | tr '\n' ' ')")
while read -r l; do [[ -z "${l}" ]] || left+=("node 2: ${l}"); done < <(node2_leftovers)
if ((${#left[@]})); then
  for l in "${left[@]}"; do log "left behind: ${l}"; done
  die "down incomplete"
fi
log "down in $((SECONDS - START))s: no process, mount, network namespace, bridge, veth, route, iptables rule or cgroup of the cluster left"
