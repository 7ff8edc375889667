#!/usr/bin/env bash
# hack/cluster/lib.sh — settings and helpers shared by up.sh, down.sh, load-images.sh and
# smoke.sh (sourced, not run). Every name, port, directory and address of the local cluster is
# here, so that the scripts agree and `down` removes exactly what `up` made.
# shellcheck disable=SC2034  # variables are used by the scripts that source this file

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_SCRIPTS="${ROOT}/hack/cluster"
K8S_BIN="${K8S_BIN:-${ROOT}/_output/k8s/bin}" # make k8s-bins
CNI_BIN="${CNI_BIN:-${ROOT}/_output/cni/bin}" # make cni-plugins
# Files of the repository checkout: certificates, kubeconfigs, configs, logs, pid files.
OUT="${CLUSTER_OUT:-${ROOT}/_output/cluster}"
PKI="${OUT}/pki"
LOGS="${OUT}/logs"
PIDS="${OUT}/run"
CFG="${OUT}/config"
HELPERS="${OUT}/bin"
KUBECONFIG_ADMIN="${OUT}/kubeconfig"
# Machine state outside the checkout: etcd data and containerd's image store persist across
# down/up (so the second up is fast); the runtime state under /run goes with down.
STATE="/var/lib/kubevisor-cluster"
RUNSTATE="/run/kubevisor-cluster"
# kubelet keeps its default root: device plugins and DaemonSets' hostPaths expect
# /var/lib/kubelet/device-plugins and /var/lib/kubelet/plugins_registry.
KUBELET_ROOT="/var/lib/kubelet"
CONTAINERD_SOCK="${RUNSTATE}/containerd/containerd.sock"
CNI_NET_NAME="kubevisor-cluster"
CNI_IPAM_DIR="${STATE}/cni-ipam"
# Fixed ports (envtest instances of other tests use random ones).
APISERVER_PORT=6443
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380
KCM_PORT=10257
SCHED_PORT=10259
KUBELET_PORT=10250
KUBELET_HEALTHZ_PORT=10248
# Networks: pods on a bridge of their own; services virtual (no kube-proxy: only the API
# server's own Service address is forwarded, by an iptables DNAT rule of ours).
BRIDGE="kvc0"
POD_CIDR="10.247.0.0/24"
POD_GATEWAY="10.247.0.1"
SERVICE_CIDR="10.96.0.0/16"
KUBERNETES_SVC_IP="10.96.0.1"
CLUSTER_DOMAIN="cluster.local"
# Our iptables chains (nat and filter); down deletes them and the jumps to them.
IPT_CHAIN="KV-CLUSTER" # iptables chain names must stay under 29 characters
# Images: the sandbox image is built locally (hack/images pause), never pulled.
IMAGES_OUT="${ROOT}/_output/images"
PAUSE_IMAGE="docker.io/kubevisor/pause:dev"
# The default storage class (up.sh): the controller manager's hostPath provisioner, which makes
# each claim's directory under HOSTPATH_PV_DIR (a path of its own that it does not let us choose).
STORAGE_CLASS="local"
HOSTPATH_PV_DIR="/tmp/hostpath_pv"
NODE_NAME="${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}"
# sysctls kubelet (and the bridge plugin) change; up saves their values once, down restores them.
# vm.unprivileged_userfaultfd: up sets it to 1, so that the unprivileged QEMU of a launcher pod
# can take a post-copy migration (QEMU 7.2 asks for userfaultfd without /dev/userfaultfd).
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward vm.unprivileged_userfaultfd)
# Components in start order (down stops them in reverse).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)
# How many nodes the last up made (make up NODES=2); up without NODES takes this, else 1.
NODES_FILE="${OUT}/nodes"
# All nodes' pods: each node has a /24 of it; traffic between them keeps its source addresses.
CLUSTER_POD_CIDR="10.247.0.0/16"

# --- the second node (make up NODES=2; hack/cluster/node2.sh) ----------------------------------
# Node 2 is a second kubelet and containerd on this machine, in a network namespace of its own
# (a veth pair to the host: its InternalIP is its end of it) and a mount namespace of its own
# (persistent: bound to NODE2_MNTNS), where per-node directories are mounted over the paths
# that hold node-local state (NODE2_BINDS), so that its kubelet, its pods' hostPath volumes and
# the handler's host paths never meet the first node's. Its pod cgroups are under a cgroup root
# of its own. Its processes run under nsenter into both namespaces.
NODE2_NAME="${NODE_NAME}-2"
NODE2_NETNS="kv-cluster-node2"
NODE2_VETH_HOST="kvn2"   # the host's end of the veth pair
NODE2_VETH_NODE="eth0"   # node 2's end, in its network namespace
NODE2_LINK_CIDR="10.248.0.0/30"
NODE2_HOST_IP="10.248.0.1"
NODE2_IP="10.248.0.2"
NODE2_BRIDGE="kvc1"      # in node 2's network namespace
NODE2_POD_CIDR="10.247.1.0/24"
NODE2_POD_GATEWAY="10.247.1.1"
NODE2_STATE="${STATE}/node2"
NODE2_RUNSTATE="${RUNSTATE}/node2"
NODE2_CFG="${CFG}/node2"
NODE2_CONTAINERD_SOCK="${NODE2_RUNSTATE}/containerd/containerd.sock"
NODE2_CNI_IPAM_DIR="${NODE2_STATE}/cni-ipam"
# The mount namespace file lives on a private mount of its own (unshare(1) wants that).
NODE2_NSDIR="${RUNSTATE}/node2-ns"
NODE2_MNTNS="${NODE2_NSDIR}/mnt"
NODE2_CGROUP_ROOT="/kubevisor-node2"
# path:directory — node 2 sees directory at path. /tmp (and so the default storage class's
# claims under HOSTPATH_PV_DIR), /dev and /sys stay the machine's.
NODE2_BINDS=(
  "${KUBELET_ROOT}:${NODE2_STATE}/kubelet"
  "/var/lib/kubevisor:${NODE2_STATE}/kubevisor"
  "/run/kubevisor:${NODE2_RUNSTATE}/kubevisor"
  "/var/lib/cni:${NODE2_STATE}/cni"
  "/var/log/pods:${NODE2_STATE}/log/pods"
  "/var/log/containers:${NODE2_STATE}/log/containers"
)
NODE2_COMPONENTS=(node2-containerd node2-kubelet)

log() { printf '==> cluster: %s\n' "$*" >&2; }
die() { printf '==> cluster: error: %s\n' "$*" >&2; exit 1; }

# node_ip: the address of the interface that carries the default route.
node_ip() {
  ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}'
}

ctr_() { ctr --address "${CONTAINERD_SOCK}" --namespace k8s.io "$@"; }
ctr2_() { ctr --address "${NODE2_CONTAINERD_SOCK}" --namespace k8s.io "$@"; }
# in_node2 command...: run a command in node 2's network namespace (ip, iptables, sysctl, curl).
in_node2() { nsenter --net="/run/netns/${NODE2_NETNS}" -- "$@"; }
kubectl_() { kubectl --kubeconfig "${KUBECONFIG_ADMIN}" "$@"; }

# binary_of component: the executable a component runs, to tell its process from a stale pid.
# Symlinks resolved: /proc/<pid>/exe names the real file (_output/k8s/bin may be a link farm).
# node2-<component> is node 2's process of the component.
binary_of() {
  case "${1#node2-}" in
  containerd) readlink -f "$(command -v containerd)" ;;
  *) readlink -f "${K8S_BIN}/${1#node2-}" ;;
  esac
}

# pid_of component: the pid of our running process of that component, or nothing. From its
# pid file; without one (removed by make clean, say), from the processes running the
# component's binary with one of our directories on their command line, so that envtest's
# kube-apiserver and etcd of other tests (same binaries, other arguments) are never taken; node
# 2's processes have its configuration directory on theirs, the first node's do not.
pid_of() {
  local f="${PIDS}/$1.pid" pid exe bin p cmd
  bin="$(binary_of "$1")"
  if [[ -f "${f}" ]]; then
    pid="$(cat "${f}")"
    exe="$(readlink "/proc/${pid}/exe" 2>/dev/null || true)"
    if [[ -n "${pid}" && "${exe% (deleted)}" == "${bin}" ]]; then
      echo "${pid}"
      return 0
    fi
  fi
  for p in /proc/[0-9]*; do
    exe="$(readlink "${p}/exe" 2>/dev/null || true)"
    [[ "${exe% (deleted)}" == "${bin}" ]] || continue
    cmd="$(tr '\0' ' ' 2>/dev/null <"${p}/cmdline" || true)"
    if [[ "$1" == node2-* ]]; then
      [[ "${cmd}" == *"${NODE2_CFG}/"* ]] || continue
    else
      [[ "${cmd}" != *"${NODE2_CFG}/"* ]] || continue
      grep -qE -- "(${OUT}|${STATE})/" <<<"${cmd}" || continue
    fi
    echo "${p#/proc/}"
    return 0
  done
  return 0
}

# start_bg component args...: run the component's binary in its own session, detached from the
# calling shell (so make's or an ssh session's end does not stop it), with its log and pid file.
# Node 2's components (node2-*) run in its mount and network namespaces (nsenter execs the
# binary: the pid is the component's).
start_bg() {
  local name="$1" bin pid wrap=()
  shift
  bin="$(binary_of "${name}")"
  [[ "${name}" != node2-* ]] || wrap=(nsenter --mount="${NODE2_MNTNS}" --net="/run/netns/${NODE2_NETNS}" --)
  mkdir -p "${LOGS}" "${PIDS}"
  printf '\n=== %s started %s: %s %s %s\n' "${name}" "$(date -u +%FT%TZ)" "${wrap[*]}" "${bin}" "$*" >>"${LOGS}/${name}.log"
  setsid "${wrap[@]}" "${bin}" "$@" >>"${LOGS}/${name}.log" 2>&1 </dev/null &
  pid=$!
  echo "${pid}" >"${PIDS}/${name}.pid"
  disown "${pid}" 2>/dev/null || true
}

# stop_bg component [seconds]: SIGTERM (unless NOTERM=1: already sent), wait, then SIGKILL;
# removes the pid file.
stop_bg() {
  local name="$1" wait="${2:-20}" pid i t0="${SECONDS}"
  pid="$(pid_of "${name}")"
  if [[ -n "${pid}" ]]; then
    log "stopping ${name} (pid ${pid})"
    [[ "${NOTERM:-0}" == 1 ]] || kill -TERM "${pid}" 2>/dev/null || true
    for ((i = 0; i < wait * 10; i++)); do
      [[ -d "/proc/${pid}" ]] || break
      sleep 0.1
    done
    if [[ -d "/proc/${pid}" ]]; then
      log "${name} (pid ${pid}) did not stop in ${wait}s: SIGKILL"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.2
    fi
    log "${name} stopped in $((SECONDS - t0))s"
  fi
  rm -f "${PIDS}/${name}.pid"
}

# wait_for what seconds component command...: poll command until it succeeds; fail at once if
# the component's process is gone, or after the timeout, showing the end of its log.
wait_for() {
  local what="$1" secs="$2" comp="$3" deadline why
  shift 3
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    why=""
    if [[ -n "${comp}" && -z "$(pid_of "${comp}")" ]]; then
      why="${comp} exited"
    elif ((SECONDS >= deadline)); then
      why="not ready after ${secs}s"
    fi
    if [[ -n "${why}" ]]; then
      if [[ -n "${comp}" && -f "${LOGS}/${comp}.log" ]]; then
        echo "--- last lines of ${LOGS}/${comp}.log:" >&2
        tail -n 25 "${LOGS}/${comp}.log" >&2
      fi
      die "${what}: ${why}"
    fi
    sleep 0.5
  done
}

# write_config file: write stdin to file only when it differs, atomically (containerd watches
# the CNI directory and would read a half-written file). Returns 0 when the file changed.
write_config() {
  local file="$1" tmp
  tmp="$(mktemp "$(dirname "${file}")/.$(basename "${file}").XXXX")"
  cat >"${tmp}"
  if cmp -s "${tmp}" "${file}"; then
    rm -f "${tmp}"
    return 1
  fi
  mv -f "${tmp}" "${file}"
}

# port_free port: nothing listens on the TCP port.
port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }

# our_mounts: mount points under our directories, deepest first.
our_mounts() {
  awk '{print $5}' /proc/self/mountinfo | sed 's/\\040/ /g' |
    grep -E "^(${RUNSTATE}|${STATE}|${KUBELET_ROOT})(/|$)" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- || true
}

# kubepods_cgroups [root]: cgroup directories kubelet made for pods (cgroupfs driver), deepest
# first: the first node's (/kubepods), or with root (NODE2_CGROUP_ROOT) that whole tree, root
# included.
kubepods_cgroups() {
  local d sub="${1:+${1#/}}"
  sub="${sub:-kubepods}"
  for d in /sys/fs/cgroup/*/"${sub}" /sys/fs/cgroup/"${sub}"; do
    [[ -d "${d}" ]] && find "${d}" -depth -type d
  done
  return 0
}

# shim_pids [socket]: containerd-shim processes started by our containerd (its socket, default
# the first node's, is on their command line), so a system containerd's shims are never touched.
shim_pids() {
  local p sock="${1:-${CONTAINERD_SOCK}}"
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"${p}/cmdline" | grep -qF -- "-address ${sock} " && echo "${p#/proc/}"
  done
  return 0
}
