#!/usr/bin/env bash
# hack/cluster/up.sh — bring up a real Kubernetes on this machine (make up): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kubelet from the binaries
# `make k8s-bins` cached in _output/k8s/bin, Debian's containerd + runc (behind
# hack/cluster/runc-wrapper, see ENVIRONMENT.md), the CNI bridge for pods from `make
# cni-plugins`, and an admin kubeconfig at _output/cluster/kubeconfig.
#
# NODES=2 adds a second node on this machine: its own kubelet and containerd in network and
# mount namespaces of their own (hack/cluster/node2.sh). NODES=1 removes a second node (its
# processes, namespaces and Node object). Without NODES, as many nodes as the last up made
# (_output/cluster/nodes; 1 at first), so that a plain `make up` keeps a second node.
#
# Idempotent: a component already running is left alone, certificates and images already made
# are kept, so a second run takes a few seconds. hack/cluster/down.sh undoes it; see
# hack/cluster/README.md for what runs where and how to debug it. Needs root.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=hack/cluster/node2.sh
source "$(dirname "${BASH_SOURCE[0]}")/node2.sh"

START="${SECONDS}"
[[ "$(id -u)" == 0 ]] || die "needs root (containerd, kubelet, iptables, mounts)"

# --- preflight -----------------------------------------------------------------------------
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet etcd; do
  [[ -x "${K8S_BIN}/${b}" ]] || die "${K8S_BIN}/${b} missing: run make k8s-bins first"
done
for b in bridge host-local loopback; do
  [[ -x "${CNI_BIN}/${b}" ]] || die "${CNI_BIN}/${b} missing: run make cni-plugins first"
done
command -v kubectl >/dev/null || die "kubectl not found"
NODES="${NODES:-$(cat "${NODES_FILE}" 2>/dev/null || true)}"
NODES="${NODES:-1}"
[[ "${NODES}" == 1 || "${NODES}" == 2 ]] || die "NODES=${NODES}: the local cluster has 1 or 2 nodes"
NODE_IP="$(node_ip)"
[[ -n "${NODE_IP}" ]] || die "no IPv4 default route: cannot pick the node address"
mkdir -p "${OUT}" "${PKI}" "${LOGS}" "${PIDS}" "${CFG}" "${HELPERS}" "${STATE}" "${RUNSTATE}"
# The fixed ports must be ours or free: another process on them would answer our health checks.
check_port() { # component port
  [[ -n "$(pid_of "$1")" ]] && return 0
  port_free "$2" || die "port $2 (for $1) is taken by another process: $(ss -Hltnp "sport = :$2" | head -1)"
}
check_port etcd "${ETCD_CLIENT_PORT}"
check_port etcd "${ETCD_PEER_PORT}"
check_port kube-apiserver "${APISERVER_PORT}"
check_port kube-controller-manager "${KCM_PORT}"
check_port kube-scheduler "${SCHED_PORT}"
check_port kubelet "${KUBELET_PORT}"
check_port kubelet "${KUBELET_HEALTHZ_PORT}"

# --- Debian packages ------------------------------------------------------------------------
# containerd, runc, iptables, conntrack, ethtool, socat, openssl, jq, curl, iproute2 and procps
# come from the Makefile's deps sets (make up, make cluster-up: hack/deps/packages.txt).
for c in containerd ctr runc iptables openssl jq curl ip ss sysctl nsenter unshare findmnt; do
  command -v "${c}" >/dev/null || die "${c} not found: run this through make (make up or make cluster-up), which installs the Debian packages it needs"
done
# Debian's containerd package may have started a system containerd (on systemd hosts): it is
# not ours and we never touch it; ours has its own socket, root and state directories.

# --- helpers built from this repository ------------------------------------------------------
# go build is a no-op when nothing changed (build cache), so this is cheap on the second run.
log "building helpers: runc-wrapper, images tool"
RUNC="$(command -v runc)"
(cd "${ROOT}" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.realRunc=${RUNC}" \
  -o "${HELPERS}/runc-wrapper" ./hack/cluster/runc-wrapper)
(cd "${ROOT}" && go build -o "${HELPERS}/kubevisor-images" ./hack/images)

# --- certificates ---------------------------------------------------------------------------
# One CA signs everything (ECDSA P-256: fast to make); etcd listens on localhost without TLS.
# A certificate is made once; changing the node's name or address remakes the serving ones.
ca_ok() { [[ -s "${PKI}/$1.crt" && -s "${PKI}/$1.key" ]]; }
make_ca() { # name cn
  ca_ok "$1" && return 0
  openssl ecparam -name prime256v1 -genkey -noout -out "${PKI}/$1.key" 2>/dev/null
  openssl req -x509 -new -key "${PKI}/$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "${PKI}/$1.crt" 2>/dev/null
}
make_cert() { # name ca subject eku [sans]
  local name="$1" ca="$2" subj="$3" eku="$4" sans="${5:-}" ext
  ca_ok "${name}" && return 0
  ext="${PKI}/${name}.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=${eku}"
    [[ -n "${sans}" ]] && echo "subjectAltName=${sans}"
  } >"${ext}"
  openssl ecparam -name prime256v1 -genkey -noout -out "${PKI}/${name}.key" 2>/dev/null
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" 2>/dev/null |
    openssl x509 -req -CA "${PKI}/${ca}.crt" -CAkey "${PKI}/${ca}.key" -CAcreateserial -days 3650 -sha256 \
      -extfile "${ext}" -out "${PKI}/${name}.crt" 2>/dev/null
  rm -f "${ext}"
}
node_id="${NODE_NAME} ${NODE_IP} ${NODE2_NAME} ${NODE2_IP}"
if [[ "$(cat "${PKI}/.node" 2>/dev/null || true)" != "${node_id}" ]]; then
  rm -f "${PKI}"/{apiserver,kubelet,node2-kubelet,node2-kubelet-client}.{crt,key}
  echo "${node_id}" >"${PKI}/.node"
fi
log "certificates in ${PKI}"
make_ca ca kubevisor-cluster-ca
make_ca front-proxy-ca kubevisor-cluster-front-proxy-ca
make_cert apiserver ca "/CN=kube-apiserver" serverAuth \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.${CLUSTER_DOMAIN},DNS:localhost,DNS:${NODE_NAME},IP:127.0.0.1,IP:${NODE_IP},IP:${KUBERNETES_SVC_IP}"
make_cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
make_cert admin ca "/O=system:masters/CN=kubernetes-admin" clientAuth
make_cert controller-manager ca "/CN=system:kube-controller-manager" clientAuth
make_cert scheduler ca "/CN=system:kube-scheduler" clientAuth
make_cert kubelet-client ca "/O=system:nodes/CN=system:node:${NODE_NAME}" clientAuth
make_cert kubelet ca "/CN=${NODE_NAME}" serverAuth "DNS:${NODE_NAME},DNS:localhost,IP:${NODE_IP},IP:127.0.0.1"
# Node 2's kubelet (made also while it does not run: cheap, and a later NODES=2 finds them).
make_cert node2-kubelet-client ca "/O=system:nodes/CN=system:node:${NODE2_NAME}" clientAuth
make_cert node2-kubelet ca "/CN=${NODE2_NAME}" serverAuth "DNS:${NODE2_NAME},DNS:localhost,IP:${NODE2_IP},IP:127.0.0.1"
# The aggregation layer (the subresource API is an APIService) authenticates as front-proxy-client.
make_cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" clientAuth
if [[ ! -s "${PKI}/sa.key" ]]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "${PKI}/sa.key" 2>/dev/null
  openssl ec -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
fi
chmod 600 "${PKI}"/*.key

# write_kubeconfig file user [server]: certificates embedded, so the file can be copied
# elsewhere. The server defaults to the API server on localhost.
write_kubeconfig() {
  local file="$1" user="$2" server="${3:-https://127.0.0.1:${APISERVER_PORT}}" tmp
  tmp="$(mktemp "${file}.XXXX")"
  cat >"${tmp}" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kubevisor
  cluster:
    server: ${server}
    certificate-authority-data: $(base64 -w0 <"${PKI}/ca.crt")
users:
- name: ${user}
  user:
    client-certificate-data: $(base64 -w0 <"${PKI}/${user}.crt")
    client-key-data: $(base64 -w0 <"${PKI}/${user}.key")
contexts:
- name: kubevisor
  context: {cluster: kubevisor, user: ${user}}
current-context: kubevisor
KC
  chmod 600 "${tmp}"
  mv -f "${tmp}" "${file}"
}
write_kubeconfig "${KUBECONFIG_ADMIN}" admin
write_kubeconfig "${CFG}/controller-manager.kubeconfig" controller-manager
write_kubeconfig "${CFG}/scheduler.kubeconfig" scheduler
write_kubeconfig "${CFG}/kubelet.kubeconfig" kubelet-client
# Node 2's localhost is its own network namespace: it reaches the API server at the host's address.
mkdir -p "${NODE2_CFG}"
write_kubeconfig "${NODE2_CFG}/kubelet.kubeconfig" node2-kubelet-client "https://${NODE_IP}:${APISERVER_PORT}"

# config_changed component file: write_config, and say so when the running component still has
# the old configuration (up.sh does not restart running components: down.sh && up.sh does).
config_changed() {
  if write_config "$2" && [[ -n "$(pid_of "$1")" ]]; then
    log "$1: configuration $2 changed; it applies after hack/cluster/down.sh && hack/cluster/up.sh"
  fi
  return 0
}

# --- control plane --------------------------------------------------------------------------
http_ok() { curl -fsS --max-time 2 "$@"; }
api_ok() {
  curl -fsS --max-time 2 --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" \
    "https://127.0.0.1:${APISERVER_PORT}$1"
}
# start_component name health-seconds health-command... -- args...
ensure() {
  local name="$1" secs="$2" health=() args=() t0
  shift 2
  while (($#)) && [[ "$1" != "--" ]]; do health+=("$1"); shift; done
  shift
  args=("$@")
  if [[ -n "$(pid_of "${name}")" ]]; then
    wait_for "${name}" "${secs}" "${name}" "${health[@]}"
    log "${name}: running (pid $(pid_of "${name}"))"
    return 0
  fi
  t0="${SECONDS}"
  log "${name}: starting (log ${LOGS}/${name}.log)"
  start_bg "${name}" "${args[@]}"
  wait_for "${name}" "${secs}" "${name}" "${health[@]}"
  log "${name}: healthy in $((SECONDS - t0))s (pid $(pid_of "${name}"))"
}

ensure etcd 60 http_ok "http://127.0.0.1:${ETCD_CLIENT_PORT}/health" -- \
  --name default --data-dir "${STATE}/etcd" \
  --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
  --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
  --initial-cluster "default=http://127.0.0.1:${ETCD_PEER_PORT}" \
  --quota-backend-bytes 2147483648 --log-level warn

# Admission: the defaults plus NodeRestriction, and the webhook plugins named explicitly (the
# Kubevisor API server registers mutating and validating webhooks). No kube-proxy runs, so the
# API server reaches webhook and aggregated-API Services at their endpoints' pod IPs
# (--enable-aggregator-routing), which the host routes to over the pod bridge.
ensure kube-apiserver 120 api_ok /readyz -- \
  --etcd-servers "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
  --bind-address 0.0.0.0 --secure-port "${APISERVER_PORT}" --advertise-address "${NODE_IP}" \
  --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
  --client-ca-file "${PKI}/ca.crt" \
  --service-cluster-ip-range "${SERVICE_CIDR}" \
  --service-account-issuer "https://kubernetes.default.svc.${CLUSTER_DOMAIN}" \
  --service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
  --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook \
  --allow-privileged=true \
  --kubelet-client-certificate "${PKI}/apiserver-kubelet-client.crt" --kubelet-client-key "${PKI}/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "${PKI}/ca.crt" --kubelet-preferred-address-types InternalIP,Hostname \
  --requestheader-client-ca-file "${PKI}/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "${PKI}/front-proxy-client.crt" --proxy-client-key-file "${PKI}/front-proxy-client.key" \
  --enable-aggregator-routing=true \
  --profiling=false --v=1

ensure kube-controller-manager 60 http_ok -k "https://127.0.0.1:${KCM_PORT}/healthz" -- \
  --kubeconfig "${CFG}/controller-manager.kubeconfig" \
  --authentication-kubeconfig "${CFG}/controller-manager.kubeconfig" \
  --authorization-kubeconfig "${CFG}/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "${KCM_PORT}" \
  --root-ca-file "${PKI}/ca.crt" --service-account-private-key-file "${PKI}/sa.key" \
  --use-service-account-credentials=true \
  --cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key" \
  --controllers '*,bootstrapsigner,tokencleaner' \
  --enable-hostpath-provisioner=true \
  --service-cluster-ip-range "${SERVICE_CIDR}" --leader-elect=false --profiling=false --v=1

ensure kube-scheduler 60 http_ok -k "https://127.0.0.1:${SCHED_PORT}/healthz" -- \
  --kubeconfig "${CFG}/scheduler.kubeconfig" \
  --authentication-kubeconfig "${CFG}/scheduler.kubeconfig" \
  --authorization-kubeconfig "${CFG}/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "${SCHED_PORT}" --leader-elect=false --profiling=false --v=1

# --- node network ---------------------------------------------------------------------------
# Save the sysctls kubelet and the bridge plugin change, once (a second up must not record
# kubelet's values as the originals); down restores them.
# A sysctl added to SYSCTLS since the file was made is added to it.
touch "${OUT}/sysctl.saved"
for s in "${SYSCTLS[@]}"; do
  grep -q "^${s}=" "${OUT}/sysctl.saved" || echo "${s}=$(sysctl -n "${s}")" >>"${OUT}/sysctl.saved"
done
sysctl -qw net.ipv4.ip_forward=1
# Post-copy live migration: the launcher pods' QEMU is unprivileged and needs userfaultfd.
sysctl -qw vm.unprivileged_userfaultfd=1

log "pod network: bridge ${BRIDGE} ${POD_CIDR} (CNI config ${CFG}/net.d)"
mkdir -p "${CFG}/net.d" "${CNI_IPAM_DIR}"
# ipMasq is off: the plugin would make one iptables chain per pod, which a forced down (pods
# killed without a CNI DEL) would leave behind. One masquerade rule of ours covers the subnet.
# cni_config file bridge subnet gateway ipam-dir: a node's CNI network.
cni_config() {
  write_config "$1" <<JSON || true
{
  "cniVersion": "1.0.0",
  "name": "${CNI_NET_NAME}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$2",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$5",
        "ranges": [[{"subnet": "$3", "gateway": "$4"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
JSON
}
cni_config "${CFG}/net.d/10-kubevisor-cluster.conflist" "${BRIDGE}" "${POD_CIDR}" "${POD_GATEWAY}" "${CNI_IPAM_DIR}"

# iptables: one chain per table, jumped to from the built-in chains, so down removes all of it.
ipt_chain() { # table chain: create (or flush) our chain
  iptables -w -t "$1" -N "$2" 2>/dev/null || iptables -w -t "$1" -F "$2"
}
ipt_jump() { # table from-chain to-chain
  iptables -w -t "$1" -C "$2" -j "$3" 2>/dev/null || iptables -w -t "$1" -I "$2" 1 -j "$3"
}
# Pod traffic to another node's pods keeps its source address; only what leaves the pod
# networks is masqueraded.
ipt_chain nat "${IPT_CHAIN}-POSTROUTING"
iptables -w -t nat -A "${IPT_CHAIN}-POSTROUTING" -s "${POD_CIDR}" ! -d "${CLUSTER_POD_CIDR}" -j MASQUERADE \
  -m comment --comment "kubevisor cluster: pod egress"
if [[ "${NODES}" == 2 ]]; then
  # Node 2's own traffic (and its pods', masqueraded in its namespace) leaving this machine.
  iptables -w -t nat -A "${IPT_CHAIN}-POSTROUTING" -s "${NODE2_IP}/32" ! -d "${CLUSTER_POD_CIDR}" ! -o "${NODE2_VETH_HOST}" \
    -j MASQUERADE -m comment --comment "kubevisor cluster: node 2 egress"
fi
ipt_jump nat POSTROUTING "${IPT_CHAIN}-POSTROUTING"
# No kube-proxy: the kubernetes Service (in-cluster clients' KUBERNETES_SERVICE_HOST) is sent
# to the API server directly.
ipt_chain nat "${IPT_CHAIN}-SERVICES"
iptables -w -t nat -A "${IPT_CHAIN}-SERVICES" -d "${KUBERNETES_SVC_IP}/32" -p tcp --dport 443 \
  -j DNAT --to-destination "${NODE_IP}:${APISERVER_PORT}" -m comment --comment "kubevisor cluster: default/kubernetes"
ipt_jump nat PREROUTING "${IPT_CHAIN}-SERVICES"
ipt_jump nat OUTPUT "${IPT_CHAIN}-SERVICES"
# Forwarding to and from the pod bridge is allowed even where FORWARD's policy is DROP.
ipt_chain filter "${IPT_CHAIN}-FORWARD"
iptables -w -A "${IPT_CHAIN}-FORWARD" -i "${BRIDGE}" -j ACCEPT
iptables -w -A "${IPT_CHAIN}-FORWARD" -o "${BRIDGE}" -j ACCEPT
if [[ "${NODES}" == 2 ]]; then
  iptables -w -A "${IPT_CHAIN}-FORWARD" -i "${NODE2_VETH_HOST}" -j ACCEPT
  iptables -w -A "${IPT_CHAIN}-FORWARD" -o "${NODE2_VETH_HOST}" -j ACCEPT
fi
ipt_jump filter FORWARD "${IPT_CHAIN}-FORWARD"

# --- containerd -----------------------------------------------------------------------------
# Its own root, state and socket (no clash with a system containerd), runc behind our wrapper
# (ENVIRONMENT.md: negative oom_score_adj fails with EIO; RLIMIT_NOFILE cannot exceed 20000),
# our CNI plugins and config, the locally built pause image as the sandbox image, and pod
# network namespaces mounted under its state directory (down unmounts everything there).
# containerd_config component file root state socket net.d: a node's containerd configuration.
containerd_config() {
  local comp="$1" file="$2" root="$3" state="$4" sock="$5" netd="$6"
  config_changed "${comp}" "${file}" <<TOML
version = 2
root = "${root}"
state = "${state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "${sock}"

[plugins."io.containerd.internal.v1.opt"]
  path = "${root}-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  # Devices given to a container (the device plugins' /dev/kvm, /dev/net/tun, /dev/vhost-net)
  # are owned by its runAsUser and runAsGroup, as they must be for an unprivileged launcher's
  # VM process to open them (these machines' /dev/kvm is 0600 root). KubeVirt asks the same of
  # its nodes.
  device_ownership_from_security_context = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "${HELPERS}/runc-wrapper"
        Root = "${state%/containerd}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${CNI_BIN}"
    conf_dir = "${netd}"
    max_conf_num = 1
TOML
}
containerd_config containerd "${CFG}/containerd.toml" "${STATE}/containerd" "${RUNSTATE}/containerd" "${CONTAINERD_SOCK}" "${CFG}/net.d"
ensure containerd 60 ctr --address "${CONTAINERD_SOCK}" version -- \
  --config "${CFG}/containerd.toml" --log-level info

# The sandbox image: built (hack/images pause) and imported when containerd lacks it.
if ! ctr_ images ls -q | grep -qxF "${PAUSE_IMAGE}"; then
  [[ -s "${IMAGES_OUT}/pause.tar" ]] || (cd "${ROOT}" && "${HELPERS}/kubevisor-images" --out "${IMAGES_OUT}" pause)
  "$(dirname "${BASH_SOURCE[0]}")/load-images.sh" "${IMAGES_OUT}/pause.tar"
else
  log "sandbox image ${PAUSE_IMAGE} present"
fi

# --- shared host state directory ------------------------------------------------------------
# Kubevisor's node handler mounts containerDisk images under /run/kubevisor with Bidirectional
# propagation for launcher pods to see (HostToContainer). The runtime accepts that only on a
# shared mount; this machine's / is private (no systemd), so the directory is a shared mount of
# its own: a tmpfs of RUN_KUBEVISOR_SIZE (default 2g), so that the per-VMI directories have a
# file system of their own, which the fault matrix fills (a full disk under the VMIs) without
# touching the machine's /run. down.sh unmounts it (what it held goes with it, as /run's does at
# a reboot: the handler makes it again).
RUN_KUBEVISOR_SIZE="${RUN_KUBEVISOR_SIZE:-2g}"
mkdir -p /run/kubevisor
if ! findmnt -n --mountpoint /run/kubevisor >/dev/null 2>&1; then
  mount -t tmpfs -o "size=${RUN_KUBEVISOR_SIZE},mode=0755" kubevisor-run /run/kubevisor
  log "/run/kubevisor: a shared tmpfs of ${RUN_KUBEVISOR_SIZE} (for Kubevisor's containerDisk volumes and per-VMI directories)"
elif [[ "$(findmnt -n -o FSTYPE --mountpoint /run/kubevisor)" != tmpfs ]]; then
  log "/run/kubevisor is mounted, not as a tmpfs of its own (left by an older up.sh?): kept; the fault matrix's full-disk case needs make down and up"
fi
findmnt -n -o PROPAGATION --mountpoint /run/kubevisor | grep -q shared || mount --make-rshared /run/kubevisor

# The kubelet's root directory: launcher pods' per-VMI directories are emptyDirs there, which
# the handler binds onto /run/kubevisor/vmi/<uid> from its Bidirectional mount of the pods
# directory, and the launcher container receives the handler's mounts in it (HostToContainer).
# The runtime accepts both only on a shared mount, which / is not here: the directory is a
# shared bind mount of itself (down.sh unmounts it).
mkdir -p "${KUBELET_ROOT}"
findmnt -n --mountpoint "${KUBELET_ROOT}" >/dev/null 2>&1 || mount --bind "${KUBELET_ROOT}" "${KUBELET_ROOT}"
findmnt -n -o PROPAGATION --mountpoint "${KUBELET_ROOT}" | grep -q shared || mount --make-rshared "${KUBELET_ROOT}"
# Its pods directory, which holds the pods' emptyDirs and so the per-VMI directories (the VMs'
# overlays, cloud-init media, sockets), is a tmpfs of KUBELET_PODS_SIZE (default 4g): a file
# system of their own, which the fault matrix fills (a full disk under the VMIs) without
# touching the machine's root. Pods already there (a kubelet that ran without it) are kept.
KUBELET_PODS_SIZE="${KUBELET_PODS_SIZE:-4g}"
mkdir -p "${KUBELET_ROOT}/pods"
if ! findmnt -n --mountpoint "${KUBELET_ROOT}/pods" >/dev/null 2>&1; then
  if [[ -z "$(ls -A "${KUBELET_ROOT}/pods")" ]]; then
    mount -t tmpfs -o "size=${KUBELET_PODS_SIZE},mode=0750" kubevisor-kubelet-pods "${KUBELET_ROOT}/pods"
    mount --make-shared "${KUBELET_ROOT}/pods"
    log "${KUBELET_ROOT}/pods: a shared tmpfs of ${KUBELET_PODS_SIZE} (the pods' volumes, the per-VMI directories among them)"
  else
    log "${KUBELET_ROOT}/pods holds pods of a kubelet that ran without a file system of its own there: kept; the fault matrix's full-disk case needs make down and up"
  fi
fi

# --- kubelet --------------------------------------------------------------------------------
# cgroup v1 (hybrid) host with swap: failCgroupV1/failSwapOn off; cgroupfs (no systemd);
# authentication by client certificates of our CA and webhook tokens, authorization by the API
# server; no iptables utility chains (kube-proxy's business; none runs) and no oom_score_adj
# for itself (the kernel refuses negative values here). The static CPU manager gives a
# Guaranteed pod's whole CPUs to it alone (dedicatedCpuPlacement VMIs); it needs CPU reserved,
# which it rounds up to whole CPUs for its shared pool: kubeReserved 100m keeps CPU 0 shared and
# leaves one CPU of a 2-CPU machine to hand out, with 1.9 CPUs allocatable (reservedSystemCPUs
# "0" would leave 1).
# kubelet_config component file socket cert-name [cgroup-root]: a node's kubelet configuration.
kubelet_config() {
  local comp="$1" file="$2" sock="$3" cert="$4" cgroot=""
  # Node 2's pod cgroups under a root of its own: each kubelet sees and manages its own only.
  [[ -z "${5:-}" ]] || cgroot=$'\n'"cgroupRoot: $5"
  config_changed "${comp}" "${file}" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://${sock}
cgroupDriver: cgroupfs${cgroot}
failCgroupV1: false
failSwapOn: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ${PKI}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: ${PKI}/${cert}.crt
tlsPrivateKeyFile: ${PKI}/${cert}.key
address: 0.0.0.0
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
clusterDomain: ${CLUSTER_DOMAIN}
resolvConf: /etc/resolv.conf
makeIPTablesUtilChains: false
oomScoreAdj: 0
serializeImagePulls: false
evictionHard:
  memory.available: 200Mi
  nodefs.available: 5%
  imagefs.available: 5%
  nodefs.inodesFree: 2%
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
cpuManagerPolicy: static
kubeReserved:
  cpu: 100m
YAML
}
kubelet_config kubelet "${CFG}/kubelet.yaml" "${CONTAINERD_SOCK}" kubelet
# The kubelet refuses to start on a CPU manager state file of another policy (one written
# before the static policy was configured): a kubelet that does not run holds no CPUs.
cpu_state_check() { # component kubelet-root
  local cpu_state="$2/cpu_manager_state"
  if [[ -z "$(pid_of "$1")" && -f "${cpu_state}" ]] && ! grep -q '"policyName":"static"' "${cpu_state}"; then
    rm -f "${cpu_state}"
    log "$1: removed ${cpu_state} of another CPU manager policy"
  fi
}
cpu_state_check kubelet "${KUBELET_ROOT}"
ensure kubelet 60 http_ok "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz" -- \
  --config "${CFG}/kubelet.yaml" --kubeconfig "${CFG}/kubelet.kubeconfig" \
  --root-dir "${KUBELET_ROOT}" --node-ip "${NODE_IP}" --hostname-override "${NODE_NAME}" --v=1

log "waiting for node ${NODE_NAME} to be Ready"
node_ready() { # [node]
  [[ "$(kubectl_ get node "${1:-${NODE_NAME}}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}
wait_for "node ${NODE_NAME} Ready" 120 kubelet node_ready

# --- node 2 ---------------------------------------------------------------------------------
if [[ "${NODES}" == 2 ]]; then
  log "node 2: ${NODE2_NAME} (${NODE2_IP}, pods ${NODE2_POD_CIDR} on ${NODE2_BRIDGE}, network namespace ${NODE2_NETNS})"
  node2_network "${NODE_IP}"
  node2_mounts
  node2_cgroups
  mkdir -p "${NODE2_CFG}/net.d" "${NODE2_CNI_IPAM_DIR}" "${NODE2_STATE}" "${NODE2_RUNSTATE}"
  cni_config "${NODE2_CFG}/net.d/10-kubevisor-cluster.conflist" "${NODE2_BRIDGE}" "${NODE2_POD_CIDR}" "${NODE2_POD_GATEWAY}" "${NODE2_CNI_IPAM_DIR}"
  containerd_config node2-containerd "${NODE2_CFG}/containerd.toml" "${NODE2_STATE}/containerd" "${NODE2_RUNSTATE}/containerd" \
    "${NODE2_CONTAINERD_SOCK}" "${NODE2_CFG}/net.d"
  ensure node2-containerd 60 ctr --address "${NODE2_CONTAINERD_SOCK}" version -- \
    --config "${NODE2_CFG}/containerd.toml" --log-level info
  # Every image tarball there is (the sandbox image at least), before its kubelet starts: the
  # DaemonSets' pods on it then start at once instead of backing off from a failed pull.
  "${CLUSTER_SCRIPTS}/load-images.sh" --node 2
  kubelet_config node2-kubelet "${NODE2_CFG}/kubelet.yaml" "${NODE2_CONTAINERD_SOCK}" node2-kubelet "${NODE2_CGROUP_ROOT}"
  cpu_state_check node2-kubelet "${NODE2_STATE}/kubelet"
  # Its kubelet root is KUBELET_ROOT in its mount namespace (NODE2_BINDS).
  ensure node2-kubelet 60 in_node2 curl -fsS --max-time 2 "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz" -- \
    --config "${NODE2_CFG}/kubelet.yaml" --kubeconfig "${NODE2_CFG}/kubelet.kubeconfig" \
    --root-dir "${KUBELET_ROOT}" --node-ip "${NODE2_IP}" --hostname-override "${NODE2_NAME}" --v=1
  log "waiting for node ${NODE2_NAME} to be Ready"
  wait_for "node ${NODE2_NAME} Ready" 120 node2-kubelet node_ready "${NODE2_NAME}"
else
  if [[ -n "$(node2_leftovers)" ]]; then
    log "node 2: NODES=1, stopping and removing ${NODE2_NAME}"
    node2_down
  fi
  if kubectl_ get node "${NODE2_NAME}" >/dev/null 2>&1; then
    log "node 2: deleting Node ${NODE2_NAME} (NODES=1)"
    kubectl_ delete node "${NODE2_NAME}" --wait=false >/dev/null
  fi
fi
echo "${NODES}" >"${NODES_FILE}"

# Claims of the default storage class get a directory of this machine: the controller manager's
# hostPath provisioner (--enable-hostpath-provisioner, development only: single node) makes
# /tmp/hostpath_pv/<uuid> for each and removes it with the claim. VMs' persistent state claims
# and PVC disks use it.
kubectl_ apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: ${STORAGE_CLASS}
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
YAML
log "node ${NODE_NAME} Ready (${NODE_IP}, pods ${POD_CIDR} on ${BRIDGE}); up in $((SECONDS - START))s"
[[ "${NODES}" != 2 ]] || log "node ${NODE2_NAME} Ready (${NODE2_IP}, pods ${NODE2_POD_CIDR} on ${NODE2_BRIDGE} in network namespace ${NODE2_NETNS})"
log "logs: ${LOGS}/<component>.log; stop with hack/cluster/down.sh"
cat <<EOF2

Cluster is up. Use it with:
  export KUBECONFIG=${KUBECONFIG_ADMIN}
  kubectl get nodes
EOF2
