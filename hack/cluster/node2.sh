#!/usr/bin/env bash
# hack/cluster/node2.sh — the namespaces, network and cgroup root of the local cluster's second
# node, and its teardown (sourced by up.sh and down.sh after lib.sh, not run). up.sh starts
# node 2's containerd and kubelet in them; see lib.sh (NODE2_*) for its names and addresses and
# hack/cluster/README.md for the layout.
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # settings and helpers only: sourcing it again is harmless

# node2_mntns_id: the id of node 2's mount namespace ("mnt:[inode]"), empty when there is none.
node2_mntns_id() {
  [[ "$(findmnt -n -o FSTYPE --mountpoint "${NODE2_MNTNS}" 2>/dev/null || true)" == nsfs ]] || return 0
  echo "mnt:[$(stat -L -c %i "${NODE2_MNTNS}")]"
}

# node2_netns_id: the id of node 2's network namespace ("net:[inode]"), empty when there is none.
node2_netns_id() {
  [[ -e "/run/netns/${NODE2_NETNS}" ]] || return 0
  local i
  i="$(stat -L -c %i "/run/netns/${NODE2_NETNS}" 2>/dev/null || true)"
  [[ -z "${i}" ]] || echo "net:[${i}]"
}

# node2_procs: processes in node 2's mount or network namespace (its kubelet, containerd and
# shims; pods have namespaces of their own and are found by their cgroups).
node2_procs() {
  local mnt net p
  mnt="$(node2_mntns_id)"
  net="$(node2_netns_id)"
  [[ -n "${mnt}${net}" ]] || return 0
  for p in /proc/[0-9]*; do
    if [[ -n "${mnt}" && "$(readlink "${p}/ns/mnt" 2>/dev/null)" == "${mnt}" ]] ||
      [[ -n "${net}" && "$(readlink "${p}/ns/net" 2>/dev/null)" == "${net}" ]]; then
      echo "${p#/proc/}"
    fi
  done
  return 0
}

# node2_network: node 2's network namespace, the veth pair to it, its address and default route
# via the host, forwarding, the host's route to its pods, and its own iptables chains (in its
# namespace): masquerade of its pods' traffic leaving the pod networks, the kubernetes Service
# DNAT to the API server at the host's address. Idempotent. The host's rules for node 2 are in
# up.sh's iptables section.
node2_network() { # node1-ip
  local node1_ip="$1"
  [[ -e "/run/netns/${NODE2_NETNS}" ]] || ip netns add "${NODE2_NETNS}"
  if ! ip link show "${NODE2_VETH_HOST}" >/dev/null 2>&1; then
    ip link add "${NODE2_VETH_HOST}" type veth peer name "${NODE2_VETH_NODE}" netns "${NODE2_NETNS}"
  fi
  ip addr replace "${NODE2_HOST_IP}/${NODE2_LINK_CIDR#*/}" dev "${NODE2_VETH_HOST}"
  ip link set "${NODE2_VETH_HOST}" up
  in_node2 ip link set lo up
  in_node2 ip addr replace "${NODE2_IP}/${NODE2_LINK_CIDR#*/}" dev "${NODE2_VETH_NODE}"
  in_node2 ip link set "${NODE2_VETH_NODE}" up
  in_node2 ip route replace default via "${NODE2_HOST_IP}"
  in_node2 sysctl -qw net.ipv4.ip_forward=1
  ip route replace "${NODE2_POD_CIDR}" via "${NODE2_IP}" dev "${NODE2_VETH_HOST}"

  local ipt=(in_node2 iptables -w)
  "${ipt[@]}" -t nat -N "${IPT_CHAIN}-POSTROUTING" 2>/dev/null || "${ipt[@]}" -t nat -F "${IPT_CHAIN}-POSTROUTING"
  "${ipt[@]}" -t nat -A "${IPT_CHAIN}-POSTROUTING" -s "${NODE2_POD_CIDR}" ! -d "${CLUSTER_POD_CIDR}" -j MASQUERADE \
    -m comment --comment "kubevisor cluster node 2: pod egress"
  "${ipt[@]}" -t nat -C POSTROUTING -j "${IPT_CHAIN}-POSTROUTING" 2>/dev/null || "${ipt[@]}" -t nat -I POSTROUTING 1 -j "${IPT_CHAIN}-POSTROUTING"
  "${ipt[@]}" -t nat -N "${IPT_CHAIN}-SERVICES" 2>/dev/null || "${ipt[@]}" -t nat -F "${IPT_CHAIN}-SERVICES"
  "${ipt[@]}" -t nat -A "${IPT_CHAIN}-SERVICES" -d "${KUBERNETES_SVC_IP}/32" -p tcp --dport 443 \
    -j DNAT --to-destination "${node1_ip}:${APISERVER_PORT}" -m comment --comment "kubevisor cluster: default/kubernetes"
  local c
  for c in PREROUTING OUTPUT; do
    "${ipt[@]}" -t nat -C "${c}" -j "${IPT_CHAIN}-SERVICES" 2>/dev/null || "${ipt[@]}" -t nat -I "${c}" 1 -j "${IPT_CHAIN}-SERVICES"
  done
  "${ipt[@]}" -N "${IPT_CHAIN}-FORWARD" 2>/dev/null || "${ipt[@]}" -F "${IPT_CHAIN}-FORWARD"
  "${ipt[@]}" -A "${IPT_CHAIN}-FORWARD" -i "${NODE2_BRIDGE}" -j ACCEPT
  "${ipt[@]}" -A "${IPT_CHAIN}-FORWARD" -o "${NODE2_BRIDGE}" -j ACCEPT
  "${ipt[@]}" -C FORWARD -j "${IPT_CHAIN}-FORWARD" 2>/dev/null || "${ipt[@]}" -I FORWARD 1 -j "${IPT_CHAIN}-FORWARD"
}

# node2_mount_setup: run inside node 2's new mount namespace (by node2_mounts). The namespace
# started as a copy of the host's (slaves of its shared mounts, so that the host's unmounts of
# those reach the copies): drop the copies of the first node's mounts (pod network namespaces,
# container root filesystems, volumes, containerDisks), which would otherwise keep them alive,
# mount node 2's directories over the node-local paths, and make every mount shared within the
# namespace (Bidirectional volumes, such as the handler's /run/kubevisor, need that).
node2_mount_setup() {
  [[ "$(readlink /proc/self/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ]] || die "node2_mount_setup: not in a mount namespace of its own"
  local m b
  while read -r m; do
    [[ -n "${m}" ]] && { umount -l "${m}" 2>/dev/null || true; }
  done < <(our_mounts)
  if findmnt -n --mountpoint /run/kubevisor >/dev/null 2>&1; then umount -R -l /run/kubevisor; fi
  for b in "${NODE2_BINDS[@]}"; do
    mount --bind "${b#*:}" "${b%%:*}"
  done
  mount --make-rshared /
}

# node2_mounts: node 2's persistent mount namespace (NODE2_MNTNS), made once. Idempotent.
node2_mounts() {
  local b
  [[ -z "$(node2_mntns_id)" ]] || return 0
  for b in "${NODE2_BINDS[@]}"; do mkdir -p "${b%%:*}" "${b#*:}"; done
  mkdir -p "${NODE2_NSDIR}"
  if ! findmnt -n --mountpoint "${NODE2_NSDIR}" >/dev/null 2>&1; then
    mount --bind "${NODE2_NSDIR}" "${NODE2_NSDIR}"
    mount --make-private "${NODE2_NSDIR}"
  fi
  touch "${NODE2_MNTNS}"
  unshare --mount="${NODE2_MNTNS}" --propagation slave \
    bash -c 'set -euo pipefail; source "$1/node2.sh"; node2_mount_setup' _ "${CLUSTER_SCRIPTS}"
  [[ -n "$(node2_mntns_id)" ]] || die "node 2's mount namespace was not made at ${NODE2_MNTNS}"
  log "node 2: mount namespace ${NODE2_MNTNS}: $(printf '%s ' "${NODE2_BINDS[@]%%:*}")are its own"
}

# node2_cgroups: node 2's cgroup root in every hierarchy (kubelet needs it to exist), with the
# machine's CPUs and memory nodes in the cpuset hierarchy.
node2_cgroups() {
  local d root="${NODE2_CGROUP_ROOT#/}"
  for d in /sys/fs/cgroup/*/; do
    [[ -d "${d}${root}" ]] || mkdir "${d}${root}"
  done
  d=/sys/fs/cgroup/cpuset
  if [[ -f "${d}/cpuset.cpus" && -z "$(cat "${d}/${root}/cpuset.cpus")" ]]; then
    cat "${d}/cpuset.cpus" >"${d}/${root}/cpuset.cpus"
    cat "${d}/cpuset.mems" >"${d}/${root}/cpuset.mems"
  fi
}

# node2_down: stop node 2 and remove all of it: processes (kubelet, pods, containerd, shims),
# its mount namespace (with every mount in it), network namespace (with its bridge, pod veths
# and iptables), the veth pair, the host's route, its cgroup root, its runtime state, IPAM
# records and CNI cache. Kept for the next up: its containerd image store, kubelet directory
# and certificates (down.sh --purge deletes them with the rest).
node2_down() {
  local procs pids i cg
  stop_bg node2-kubelet 20
  procs="$(while read -r d; do cat "${d}/cgroup.procs" 2>/dev/null || true; done < <(kubepods_cgroups "${NODE2_CGROUP_ROOT}") | sort -u)"
  if [[ -n "${procs}" ]]; then
    log "node 2: killing pod processes ($(wc -w <<<"${procs}"))"
    # shellcheck disable=SC2086
    kill -KILL ${procs} 2>/dev/null || true
  fi
  if [[ -n "$(pid_of node2-containerd)" ]]; then
    local tasks t
    tasks="$(ctr2_ tasks ls -q 2>/dev/null || true)"
    for t in ${tasks}; do ctr2_ tasks kill -a -s SIGKILL "${t}" >/dev/null 2>&1 || true; done
    for t in ${tasks}; do ctr2_ tasks delete -f "${t}" >/dev/null 2>&1 || true; done
  fi
  stop_bg node2-containerd 20
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids="$(
      shim_pids "${NODE2_CONTAINERD_SOCK}"
      node2_procs
    )"
    pids="$(sort -u <<<"${pids}" | grep . || true)"
    [[ -z "${pids}" ]] && break
    ((i == 1)) && log "node 2: stopping processes left in its namespaces: ${pids//$'\n'/ }"
    # shellcheck disable=SC2086
    if ((i >= 5)); then kill -KILL ${pids} 2>/dev/null || true; else kill -TERM ${pids} 2>/dev/null || true; fi
    sleep 0.3
  done
  # The namespaces: with no process left in them, unmounting the mount namespace's file ends
  # it and every mount in it (pod network namespaces, root filesystems, volumes); deleting the
  # network namespace takes its end of the veth pair, so the host's end and route go too.
  if findmnt -n --mountpoint "${NODE2_MNTNS}" >/dev/null 2>&1; then
    log "node 2: removing its mount namespace"
    umount "${NODE2_MNTNS}" 2>/dev/null || umount -l "${NODE2_MNTNS}"
  fi
  if findmnt -n --mountpoint "${NODE2_NSDIR}" >/dev/null 2>&1; then
    umount "${NODE2_NSDIR}" 2>/dev/null || umount -l "${NODE2_NSDIR}"
  fi
  rm -rf "${NODE2_NSDIR}"
  if [[ -e "/run/netns/${NODE2_NETNS}" ]]; then
    log "node 2: removing network namespace ${NODE2_NETNS}"
    ip netns delete "${NODE2_NETNS}"
  fi
  if ip link show "${NODE2_VETH_HOST}" >/dev/null 2>&1; then ip link delete "${NODE2_VETH_HOST}"; fi
  if [[ -n "$(ip route show "${NODE2_POD_CIDR}" 2>/dev/null)" ]]; then ip route delete "${NODE2_POD_CIDR}" 2>/dev/null || true; fi
  cg="$(kubepods_cgroups "${NODE2_CGROUP_ROOT}")"
  if [[ -n "${cg}" ]]; then
    log "node 2: removing its cgroups (${NODE2_CGROUP_ROOT})"
    while read -r d; do rmdir "${d}" 2>/dev/null || true; done <<<"${cg}"
  fi
  rm -rf "${NODE2_RUNSTATE}" "${NODE2_CNI_IPAM_DIR}" "${NODE2_STATE}/cni"
}

# node2_leftovers: one line per thing of node 2 still there (nothing after node2_down).
node2_leftovers() {
  local c
  for c in "${NODE2_COMPONENTS[@]}"; do [[ -z "$(pid_of "${c}")" ]] || echo "process ${c}"; done
  [[ -z "$(shim_pids "${NODE2_CONTAINERD_SOCK}")" ]] || echo "node 2 shims $(shim_pids "${NODE2_CONTAINERD_SOCK}" | tr '\n' ' ')"
  [[ -z "$(node2_procs)" ]] || echo "processes in node 2's namespaces: $(node2_procs | tr '\n' ' ')"
  ! findmnt -n --mountpoint "${NODE2_MNTNS}" >/dev/null 2>&1 || echo "mount namespace ${NODE2_MNTNS}"
  ! findmnt -n --mountpoint "${NODE2_NSDIR}" >/dev/null 2>&1 || echo "mount ${NODE2_NSDIR}"
  [[ ! -e "/run/netns/${NODE2_NETNS}" ]] || echo "network namespace ${NODE2_NETNS}"
  ! ip link show "${NODE2_VETH_HOST}" >/dev/null 2>&1 || echo "veth ${NODE2_VETH_HOST}"
  [[ -z "$(ip route show "${NODE2_POD_CIDR}" 2>/dev/null)" ]] || echo "route ${NODE2_POD_CIDR}"
  [[ -z "$(kubepods_cgroups "${NODE2_CGROUP_ROOT}")" ]] || echo "cgroups $(kubepods_cgroups "${NODE2_CGROUP_ROOT}" | tr '\n' ' ')"
  return 0
}
