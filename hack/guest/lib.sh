# shellcheck shell=bash
# Shared helpers of hack/guest/build.sh and hack/guest/smoke.sh (sourced, not run).
# Progress lines, and `apt-get update` at most once (for fetching the kernel and busybox .debs).
# The Debian packages the scripts call come from the Makefile's deps sets (make guest,
# make guest-smoke: hack/deps/packages.txt).

step() { printf '==> guest: %s\n' "$*"; }
die() { printf 'guest: error: %s\n' "$*" >&2; exit 1; }

_apt_updated=
apt_update_once() {
  [[ -z $_apt_updated ]] || return 0
  step "apt-get update"
  apt-get update -qq || die "apt-get update failed"
  _apt_updated=1
}
