#!/usr/bin/env bash
# hack/k8s/build.sh — build the real Kubernetes and etcd binaries the project tests
# against (envtest's KUBEBUILDER_ASSETS, and the single-node cluster tier):
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
#       from k8s.io/kubernetes (version pinned in hack/k8s/go.mod)
#   etcd
#       from go.etcd.io/etcd/server/v3 (version pinned in hack/k8s/etcd/go.mod)
#
# into a git-ignored cache directory, by default _output/k8s/bin. A binary is built
# only when it is missing or its stamp line in $OUT/.stamp (binary, version, hash of
# the module's go.mod/go.sum and the link flags) no longer matches; an interrupted run
# resumes with the binaries it had not finished. FORCE=1 rebuilds everything.
# `make k8s-bins` runs this; envtest finds the result through
# KUBEBUILDER_ASSETS=<repo>/_output/k8s/bin (absolute path). See hack/k8s/README.md.
#
# Environment:
#   K8S_CACHE_DIR the cache (default: ~/.cache/kubevisor/k8s/bin), linked from <repo>/_output/k8s/bin
#   K8S_BIN_DIR  build into this directory instead of the cache, without the link
#   FORCE=1      rebuild even when the stamp matches
#   ONLY="..."   build just these binaries (space separated), e.g. ONLY="kube-apiserver etcd"
#
# Cold (empty Go build cache, 2 CPUs): kube-apiserver 3.5 min, kube-controller-manager
# 1 min, kube-scheduler, kubelet and etcd under 30 s each (they reuse the cached packages);
# 5m20s in all. Warm (all present and stamped): about 0.05 s.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
# The binaries live in a per-user cache outside the clone, so a fresh clone of the repository
# (CI's) reuses them; _output/k8s/bin is a symlink to it. K8S_BIN_DIR builds into a directory of
# its own instead.
LINK="${ROOT}/_output/k8s/bin"
CACHE="${K8S_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/kubevisor/k8s/bin}"
if [[ -n "${K8S_BIN_DIR:-}" ]]; then
  OUT="${K8S_BIN_DIR}"
else
  OUT="${CACHE}"
  mkdir -p "${OUT}" "$(dirname "${LINK}")"
  if [[ -d "${LINK}" && ! -L "${LINK}" ]]; then
    # A checkout from before the cache: move what it built there rather than rebuild it.
    cp -an "${LINK}/." "${OUT}/" && rm -rf "${LINK}"
  fi
  ln -sfn "${OUT}" "${LINK}"
fi
FORCE="${FORCE:-0}"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
ALL_BINS=("${K8S_BINS[@]}" etcd)
read -r -a WANT <<<"${ONLY:-${ALL_BINS[*]}}"

# Each module is built on its own: no go.work, no GOFLAGS such as -mod=vendor from outside.
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { printf '==> k8s-bins: %s\n' "$*" >&2; }

mkdir -p "${OUT}"
STAMP="${OUT}/.stamp"
touch "${STAMP}"
# One build at a time per output directory (flock is util-linux; skip the lock without it).
if command -v flock >/dev/null; then
  exec 9>"${OUT}/.lock"
  flock 9
fi

modinfo() { # dir module -> "version commit-time" as the module's go.mod resolves it
  (cd "$1" && go list -m -f '{{.Version}} {{with .Time}}{{.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2")
}

read -r K8S_VERSION K8S_TIME <<<"$(modinfo "${HERE}" k8s.io/kubernetes)"
read -r ETCD_VERSION _ <<<"$(modinfo "${HERE}/etcd" go.etcd.io/etcd/server/v3)"

# k8s.io/component-base/version: what `--version` and the API server's /version report.
# Without gitVersion/gitMajor/gitMinor kubectl and client-go cannot parse the server version.
k8s_mm="${K8S_VERSION#v}"
K8S_MAJOR="${k8s_mm%%.*}"
k8s_mm="${k8s_mm#*.}"
K8S_MINOR="${k8s_mm%%.*}"
# buildDate: the release's commit time as the module proxy records it, so builds are
# reproducible. gitCommit: the module zip carries no commit hash.
V=k8s.io/component-base/version
K8S_LDFLAGS="-s -w -X ${V}.gitVersion=${K8S_VERSION} -X ${V}.gitMajor=${K8S_MAJOR} -X ${V}.gitMinor=${K8S_MINOR}"
K8S_LDFLAGS+=" -X ${V}.gitTreeState=clean -X ${V}.buildDate=${K8S_TIME:-1970-01-01T00:00:00Z}"
K8S_LDFLAGS+=" -X ${V}.gitCommit=module-${K8S_VERSION}"
ETCD_LDFLAGS="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-${ETCD_VERSION}"

buildhash() { # dir ldflags -> short hash of the module's go.mod, go.sum and the link flags
  { cat "$1/go.mod" "$1/go.sum"; echo "$2"; } | sha256sum | cut -c1-12
}
K8S_HASH="$(buildhash "${HERE}" "${K8S_LDFLAGS}")"
ETCD_HASH="$(buildhash "${HERE}/etcd" "${ETCD_LDFLAGS}")"

stamp_line() { # bin -> the stamp line its current build must carry
  case "$1" in
  etcd) echo "etcd ${ETCD_VERSION} ${ETCD_HASH}" ;;
  *) echo "$1 ${K8S_VERSION} ${K8S_HASH}" ;;
  esac
}

up_to_date() { # bin
  [[ "${FORCE}" != 1 && -x "${OUT}/$1" ]] && grep -qxF "$(stamp_line "$1")" "${STAMP}"
}

build_one() { # bin
  local bin="$1" dir pkg ldflags start secs tmp
  case "${bin}" in
  etcd) dir="${HERE}/etcd" pkg=go.etcd.io/etcd/server/v3 ldflags="${ETCD_LDFLAGS}" ;;
  kube-apiserver | kube-controller-manager | kube-scheduler | kubelet)
    dir="${HERE}" pkg="k8s.io/kubernetes/cmd/${bin}" ldflags="${K8S_LDFLAGS}" ;;
  *) log "unknown binary ${bin} (want: ${ALL_BINS[*]})"; return 2 ;;
  esac
  if up_to_date "${bin}"; then
    log "${bin}: up to date ($(stamp_line "${bin}" | cut -d' ' -f2))"
    return 0
  fi
  log "${bin}: building ${pkg} ..."
  start="${SECONDS}"
  tmp="${OUT}/.${bin}.tmp"
  (cd "${dir}" && go build -trimpath -ldflags "${ldflags}" -o "${tmp}" "${pkg}")
  mv -f "${tmp}" "${OUT}/${bin}"
  # Replace this binary's stamp line; written only after the binary is in place.
  { grep -v "^${bin} " "${STAMP}" || true; stamp_line "${bin}"; } >"${STAMP}.new"
  mv -f "${STAMP}.new" "${STAMP}"
  secs=$((SECONDS - start))
  log "${bin}: built in $((secs / 60))m$((secs % 60))s, $(du -h "${OUT}/${bin}" | cut -f1)"
}

total_start="${SECONDS}"
for bin in "${WANT[@]}"; do
  build_one "${bin}"
done
secs=$((SECONDS - total_start))
log "done in $((secs / 60))m$((secs % 60))s: ${OUT} (KUBEBUILDER_ASSETS=${OUT})"
