#!/usr/bin/env bash
# hack/cluster/load-images.sh — import image tarballs into the local cluster's containerd of
# every running node (namespace k8s.io, where the CRI plugin, hence kubelet, looks), since no
# registry can be pulled from here. Pods then use the images with imagePullPolicy Never or
# IfNotPresent.
#
#   hack/cluster/load-images.sh [--node N]            every _output/images/*.tar (go run
#                                                     ./hack/images all) and the test guest's
#                                                     containerDisk (make guest)
#   hack/cluster/load-images.sh [--node N] FILE.tar…  just these
#
# --node 1 or 2: that node's containerd only (up.sh, before node 2's kubelet starts). A tarball
# whose sha256 was imported into a node before and whose image is still there is skipped (record
# per node: _output/cluster/images.loaded, images.loaded.node2), so re-running is cheap. An
# import that replaced an image a node had under the same name is listed in
# _output/cluster/images.changed for hack/cluster/rollout.sh (its pods may run the old one).
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

only=""
if [[ "${1:-}" == --node ]]; then
  only="${2:-}"
  [[ "${only}" == 1 || "${only}" == 2 ]] || die "--node 1 or --node 2"
  shift 2
fi
[[ -S "${CONTAINERD_SOCK}" ]] || die "containerd of the local cluster is not running (hack/cluster/up.sh)"
files=("$@")
if ((${#files[@]} == 0)); then
  shopt -s nullglob
  files=("${IMAGES_OUT}"/*.tar)
  [[ -s "${ROOT}/_output/guest/containerdisk.tar" ]] && files+=("${ROOT}/_output/guest/containerdisk.tar")
  shopt -u nullglob
  ((${#files[@]})) || die "no image tarballs in ${IMAGES_OUT}: run go run ./hack/images all (make images)"
fi

# load node socket record: import the files into one node's containerd.
load() {
  local node="$1" sock="$2" record="$3" present f refs sum all_present any_present t0 r
  touch "${record}"
  present="$(ctr --address "${sock}" --namespace k8s.io images ls -q)"
  for f in "${files[@]}"; do
    [[ -s "${f}" ]] || die "${f}: no such image tarball"
    # The names the tarball carries (docker save manifest), as containerd normalises them.
    mapfile -t refs < <(tar -xOf "${f}" manifest.json | jq -r '.[].RepoTags[]?' |
      sed -E 's#^([^/]+)$#docker.io/library/\1#; s#^([^./:]+/[^/]+)$#docker.io/\1#')
    sum="$(sha256sum "${f}" | cut -d' ' -f1)"
    all_present=1
    any_present=0
    for r in "${refs[@]}"; do
      if grep -qxF "${r}" <<<"${present}"; then any_present=1; else all_present=0; fi
    done
    if ((all_present)) && grep -qxF "${sum} ${f}" "${record}"; then
      log "${node}: image ${refs[*]}: already imported"
      continue
    fi
    t0="${SECONDS}"
    ctr --address "${sock}" --namespace k8s.io images import "${f}" >/dev/null
    { grep -vF " ${f}" "${record}" || true; echo "${sum} ${f}"; } >"${record}.new"
    mv -f "${record}.new" "${record}"
    log "${node}: image ${refs[*]}: imported from ${f} in $((SECONDS - t0))s"
    # The images keep their tag (dev) when rebuilt, so running pods would keep the old ones:
    # record that something changed for hack/cluster/rollout.sh.
    ((any_present == 0)) || echo "${refs[*]}" >>"${OUT}/images.changed"
  done
}

if [[ -z "${only}" || "${only}" == 1 ]]; then
  load "node ${NODE_NAME}" "${CONTAINERD_SOCK}" "${OUT}/images.loaded"
fi
if [[ -z "${only}" || "${only}" == 2 ]]; then
  if [[ -n "$(pid_of node2-containerd)" ]]; then
    load "node ${NODE2_NAME}" "${NODE2_CONTAINERD_SOCK}" "${OUT}/images.loaded.node2"
  elif [[ "${only}" == 2 ]]; then
    die "containerd of node 2 is not running (make up NODES=2)"
  fi
fi
