#!/usr/bin/env bash
# hack/cluster/load-images.sh — import image tarballs into the local cluster's containerd
# (namespace k8s.io, where the CRI plugin, hence kubelet, looks), since no registry can be
# pulled from here. Pods then use the images with imagePullPolicy Never or IfNotPresent.
#
#   hack/cluster/load-images.sh            every _output/images/*.tar (go run ./hack/images all)
#                                          and the test guest's containerDisk (make guest)
#   hack/cluster/load-images.sh FILE.tar…  just these
#
# A tarball whose sha256 was imported before and whose image is still in containerd is
# skipped (record in _output/cluster/images.loaded), so re-running is cheap. What it did import
# is listed in _output/cluster/images.changed for hack/cluster/rollout.sh.
set -euo pipefail
# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ -S "${CONTAINERD_SOCK}" ]] || die "containerd of the local cluster is not running (hack/cluster/up.sh)"
files=("$@")
if ((${#files[@]} == 0)); then
  shopt -s nullglob
  files=("${IMAGES_OUT}"/*.tar)
  [[ -s "${ROOT}/_output/guest/containerdisk.tar" ]] && files+=("${ROOT}/_output/guest/containerdisk.tar")
  shopt -u nullglob
  ((${#files[@]})) || die "no image tarballs in ${IMAGES_OUT}: run go run ./hack/images all (make images)"
fi

RECORD="${OUT}/images.loaded"
touch "${RECORD}"
present="$(ctr_ images ls -q)"
for f in "${files[@]}"; do
  [[ -s "${f}" ]] || die "${f}: no such image tarball"
  # The names the tarball carries (docker save manifest), as containerd normalises them.
  mapfile -t refs < <(tar -xOf "${f}" manifest.json | jq -r '.[].RepoTags[]?' |
    sed -E 's#^([^/]+)$#docker.io/library/\1#; s#^([^./:]+/[^/]+)$#docker.io/\1#')
  sum="$(sha256sum "${f}" | cut -d' ' -f1)"
  all_present=1
  for r in "${refs[@]}"; do grep -qxF "${r}" <<<"${present}" || all_present=0; done
  if ((all_present)) && grep -qxF "${sum} ${f}" "${RECORD}"; then
    log "image ${refs[*]}: already imported"
    continue
  fi
  t0="${SECONDS}"
  ctr_ images import "${f}" >/dev/null
  { grep -vF " ${f}" "${RECORD}" || true; echo "${sum} ${f}"; } >"${RECORD}.new"
  mv -f "${RECORD}.new" "${RECORD}"
  log "image ${refs[*]}: imported from ${f} in $((SECONDS - t0))s"
  # The images keep their tag (dev) when rebuilt, so running pods would keep the old ones:
  # record that something changed for hack/cluster/rollout.sh.
  echo "${refs[*]}" >>"${OUT}/images.changed"
done
