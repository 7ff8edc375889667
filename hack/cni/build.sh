#!/usr/bin/env bash
# Builds the CNI plugins that the network driver (drivers/network) and its tests run, from
# github.com/containernetworking/plugins (the version hack/cni/go.mod requires), into
# $OUT (default _output/cni/bin, git-ignored). A plugin already there is not built again; remove
# the directory (or set FORCE=1) to rebuild. `make cni-plugins` runs this.
#
# Tests look for the plugins in $KUBEVISOR_CNI_BIN, else in <repo>/_output/cni/bin.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-$PWD/_output/cni/bin}
PLUGINS=(
  plugins/main/bridge
  plugins/ipam/host-local
  plugins/main/ptp
  plugins/main/loopback
  plugins/ipam/static
  plugins/meta/tuning
)
MODULE=github.com/containernetworking/plugins

mkdir -p "$OUT"
missing=()
for p in "${PLUGINS[@]}"; do
  if [[ ${FORCE:-} == 1 || ! -x $OUT/$(basename "$p") ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "==> CNI plugins up to date in $OUT: $(cd "$OUT" && echo *)"
  exit 0
fi

version=$(cd hack/cni && go list -m -f '{{.Version}}' "$MODULE")
start=$SECONDS
for p in "${missing[@]}"; do
  name=$(basename "$p")
  echo "==> building CNI plugin $name ($MODULE $version)"
  # -mod=mod lets the tiny hack/cni module fill in its go.sum on the first build.
  (cd hack/cni && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$version" \
    -o "$OUT/$name.tmp" "$MODULE/$p")
  mv "$OUT/$name.tmp" "$OUT/$name"
done
echo "==> CNI plugins in $OUT: $(cd "$OUT" && echo *) ($((SECONDS - start))s)"
