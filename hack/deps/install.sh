#!/usr/bin/env bash
# hack/deps/install.sh SET... — install the Debian packages of the named sets of
# hack/deps/packages.txt that are not installed yet. Every `deps-<set>` make target runs this; a
# make target that calls a command a fresh machine lacks depends on the set that has it (make
# verify checks that it does).
#
# Quiet and quick when everything is there (one dpkg-query). Otherwise it prints the packages it
# installs; `apt-get update` runs first only when the package lists are missing or older than a
# day, or when an install with the present lists fails (a version the mirror has dropped).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIST="${HERE}/packages.txt"

die() { echo "deps: $*" >&2; exit 1; }
(($#)) || die "usage: hack/deps/install.sh SET... (sets: $(awk '!/^#/ && NF {print $1}' "${LIST}" | sort -u | tr '\n' ' '))"

wanted=()
for set in "$@"; do
  pkgs=$(awk -v s="${set}" '!/^#/ && $1 == s {print $2}' "${LIST}")
  [[ -n "${pkgs}" ]] || die "no set '${set}' in ${LIST} (sets: $(awk '!/^#/ && NF {print $1}' "${LIST}" | sort -u | tr '\n' ' '))"
  read -r -d '' -a more <<<"${pkgs}" || true
  wanted+=("${more[@]}")
done

missing=()
while read -r pkg status; do
  [[ "${status}" == installed ]] || missing+=("${pkg}")
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${wanted[@]}" 2>/dev/null || true)
# dpkg-query prints nothing at all for a package it has never heard of.
for pkg in "${wanted[@]}"; do
  dpkg-query -W "${pkg}" >/dev/null 2>&1 || missing+=("${pkg}")
done
((${#missing[@]})) || exit 0
read -r -a missing <<<"$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')"

[[ "$(id -u)" == 0 ]] || die "packages missing for set(s) $*: ${missing[*]}; run as root (apt-get install) or install them yourself"
command -v apt-get >/dev/null || die "packages missing for set(s) $*: ${missing[*]}, and there is no apt-get"

start=${SECONDS}
echo "==> deps ($*): installing Debian packages ${missing[*]}"
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"${log}" 2>&1
}
log=$(mktemp)
trap 'rm -f "${log}"' EXIT
if [[ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -1)" ]]; then
  echo "==> deps: apt-get update (package lists missing or older than a day)"
  apt-get update -qq >"${log}" 2>&1 || { cat "${log}" >&2; die "apt-get update failed"; }
fi
if ! apt_install; then
  echo "==> deps: install failed with the present package lists; apt-get update and retry"
  apt-get update -qq >"${log}" 2>&1 || { cat "${log}" >&2; die "apt-get update failed"; }
  apt_install || { cat "${log}" >&2; die "apt-get install ${missing[*]} failed"; }
fi
echo "==> deps ($*): installed ${missing[*]} in $((SECONDS - start))s"
