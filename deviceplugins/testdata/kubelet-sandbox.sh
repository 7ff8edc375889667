#!/usr/bin/env bash
# deviceplugins/testdata/kubelet-sandbox.sh — run TestRealKubeletRestart (go test -tags cluster)
# against a real kubelet and containerd of its own, without touching a cluster that may be
# running on the same machine:
#
#   deviceplugins/testdata/kubelet-sandbox.sh            (as root, from the repository root)
#
# The kubelet always serves /var/lib/kubelet/device-plugins/kubelet.sock and writes kernel
# sysctls (vm.overcommit_memory, kernel.panic, ...) when it starts. So the kubelet, its
# containerd and the test run in private mount and network namespaces (unshare): /var/lib,
# /var/log and /run are fresh tmpfs there, the sysctl files the kubelet writes are bound to
# copies, and the kubelet's ports live on a private loopback. The kubelet runs standalone (no
# API server) with a static pod directory, so the test can also run an unprivileged pod that
# asks for devices.kubevisor.io/kvm and /tun.
#
# Needs: the kubelet from `make k8s-bins` (KUBELET, default ~/.cache/kubevisor/k8s/bin/kubelet),
# Debian's containerd, runc and ctr, the pause image tarball from hack/images
# (PAUSE_TAR, default _output/images/pause.tar; tag docker.io/kubevisor/pause:dev), and Go to
# build the test and hack/cluster/runc-wrapper (this machine's kernel refuses negative
# oom_score_adj and raising RLIMIT_NOFILE; see ENVIRONMENT.md).
set -euo pipefail

if [[ "${1:-}" == "--inside" ]]; then
	W="$2"
	mount -t tmpfs none /var/lib
	mount -t tmpfs none /var/log
	mount -t tmpfs none /run
	mkdir -p "$W/sysctl"
	for s in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
		f="$W/sysctl/${s//\//_}"
		cat "/proc/sys/$s" >"$f"
		mount --bind "$f" "/proc/sys/$s"
	done
	ip link set lo up
	containerd --config "$W/containerd.toml" >"$W/containerd.log" 2>&1 &
	ctd=$!
	for _ in $(seq 1 100); do [[ -S "$W/ctd/containerd.sock" ]] && break; sleep 0.1; done
	ctr -a "$W/ctd/containerd.sock" -n k8s.io images import "$PAUSE_TAR" >/dev/null
	rc=0
	if "$W/kubelet.sh" start; then
		KUBEVISOR_KUBELET_RESTART="$W/kubelet.sh restart" \
			KUBEVISOR_KUBELET_PODRESOURCES="$W/kubelet/pod-resources/kubelet.sock" \
			KUBEVISOR_KUBELET_STATIC_POD_DIR="$W/manifests" \
			KUBEVISOR_HOSTDEV_DRIVER="$W/kubevisor-driver-hostdev" \
			"$W/deviceplugins.test" -test.run '^TestRealKubeletRestart$' -test.v -test.count=1 || rc=$?
	else
		rc=1
	fi
	# Static pods go with their manifests; give the kubelet a moment, then stop everything.
	rm -f "$W"/manifests/*.yaml
	sleep 3
	"$W/kubelet.sh" stop
	ctrw() { ctr -a "$W/ctd/containerd.sock" -n k8s.io "$@"; }
	for c in $(ctrw tasks ls -q 2>/dev/null); do
		ctrw tasks kill -s KILL "$c" >/dev/null 2>&1 || true
		sleep 0.2
		ctrw tasks delete "$c" >/dev/null 2>&1 || true
	done
	kill "$ctd"
	wait "$ctd" || true
	# Shims outlive containerd; end the ones this sandbox started (their command line names
	# its socket), so that nothing of it keeps running.
	for d in /proc/[0-9]*; do
		if tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -qF -- "-address $W/ctd/containerd.sock"; then
			kill "${d#/proc/}" 2>/dev/null || true
		fi
	done
	exit "$rc"
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KUBELET="${KUBELET:-$HOME/.cache/kubevisor/k8s/bin/kubelet}"
export PAUSE_TAR="${PAUSE_TAR:-$ROOT/_output/images/pause.tar}"
for f in "$KUBELET" "$PAUSE_TAR"; do
	[[ -e "$f" ]] || { echo "kubelet-sandbox: $f is missing" >&2; exit 2; }
done
W="$(mktemp -d /tmp/kvdp-sandbox.XXXXXX)"
echo "kubelet-sandbox: work directory $W (logs: kubelet.log, containerd.log; removed after a pass unless KEEP=1)"
mkdir -p "$W/ctd" "$W/manifests" "$W/podlogs"

(cd "$ROOT" && go build -o "$W/runc-wrapper" ./hack/cluster/runc-wrapper &&
	go build -o "$W/kubevisor-driver-hostdev" ./cmd/kubevisor-driver-hostdev &&
	go test -c -race -tags cluster -o "$W/deviceplugins.test" ./deviceplugins/)

cat >"$W/containerd.toml" <<EOF
version = 2
root = "$W/ctd/root"
state = "$W/ctd/state"
[grpc]
  address = "$W/ctd/containerd.sock"
[ttrpc]
  address = "$W/ctd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$W/ctd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  sandbox_image = "docker.io/kubevisor/pause:dev"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$W/runc-wrapper"
        Root = "$W/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$W/cni/bin"
    conf_dir = "$W/cni/conf"
EOF

# cgroupsPerQOS off and no enforced allocatable: the sandbox kubelet creates no cgroup
# hierarchy of its own next to a real cluster's.
cat >"$W/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
oomScoreAdj: 0
address: 127.0.0.1
port: 20250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 20248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://$W/ctd/containerd.sock
podLogsDir: $W/podlogs
staticPodPath: $W/manifests
fileCheckFrequency: 1s
EOF

cat >"$W/kubelet.sh" <<EOF
#!/bin/sh
# start | stop | restart the sandbox kubelet; start returns once kubelet.sock is served.
set -e
start() {
	"$KUBELET" --config "$W/kubelet.yaml" --root-dir "$W/kubelet" --hostname-override kvdp-sandbox --v=2 >>"$W/kubelet.log" 2>&1 &
	echo \$! >"$W/kubelet.pid"
	for i in \$(seq 1 300); do [ -S /var/lib/kubelet/device-plugins/kubelet.sock ] && return 0; sleep 0.1; done
	echo "kubelet did not serve kubelet.sock within 30s" >&2
	return 1
}
stop() {
	[ -f "$W/kubelet.pid" ] || return 0
	pid=\$(cat "$W/kubelet.pid")
	kill \$pid 2>/dev/null || true
	while kill -0 \$pid 2>/dev/null; do sleep 0.1; done
	rm -f "$W/kubelet.pid"
}
case "\$1" in
start) start ;;
stop) stop ;;
restart) stop; start ;;
esac
EOF
chmod +x "$W/kubelet.sh"

rc=0
unshare --mount --net --propagation private "$ROOT/deviceplugins/testdata/kubelet-sandbox.sh" --inside "$W" || rc=$?
if [[ $rc -eq 0 && -z "${KEEP:-}" ]]; then
	rm -rf "$W"
else
	echo "kubelet-sandbox: exit $rc; logs kept in $W"
fi
exit $rc
