# shellcheck shell=bash
# Shared helpers of hack/guest/build.sh and hack/guest/smoke.sh (sourced, not run).
# Progress lines, and installing Debian packages with apt-get only when they are missing
# (`apt-get update` runs at most once, and only when something must be fetched).

step() { printf '==> guest: %s\n' "$*"; }
die() { printf 'guest: error: %s\n' "$*" >&2; exit 1; }

_apt_updated=
apt_update_once() {
  [[ -z $_apt_updated ]] || return 0
  step "apt-get update"
  apt-get update -qq || die "apt-get update failed"
  _apt_updated=1
}

# need_pkgs PKG...: installs the Debian packages that are not installed yet.
need_pkgs() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' installed$' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  apt_update_once
  step "apt-get install ${missing[*]}"
  local log
  if ! log=$(DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" 2>&1); then
    printf '%s\n' "$log" >&2
    die "apt-get install ${missing[*]} failed"
  fi
}
