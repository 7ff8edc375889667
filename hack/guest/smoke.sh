#!/usr/bin/env bash
# Smoke test of the test guest built by hack/guest/build.sh: boots each of its forms with
# plain qemu-system-x86_64 under TCG (no KVM needed) and checks, with a timeout on every wait:
#   - the seed ISO (NoCloud `cidata`, or ConfigDrive `config-2`) is found, its user-data is
#     printed verbatim between the KUBEVISOR-USERDATA-BEGIN/END markers, and its instance-id;
#   - eth0 gets 10.0.2.15 from QEMU's user-mode DHCP (KUBEVISOR-IP);
#   - the guest's HTTP server answers `kubevisor-guest ok` through a host port forward;
#   - the console shell runs what is typed on the serial line;
#   - qemu-ga answers guest-get-osinfo (Debian 12) on the virtio-serial port
#     org.qemu.guest_agent.0 (KUBEVISOR-AGENT);
#   - QMP `system_powerdown` (ACPI power button) makes QEMU exit within 60 s.
# Cases: direct kernel boot with the NoCloud ISO on IDE, the qcow2 disk (SeaBIOS + syslinux)
# with the ISO on virtio-scsi (q35), the raw disk on IDE, direct kernel boot with a
# ConfigDrive ISO on virtio-blk, direct kernel boot without any seed, and (only for a guest
# built from the generic kernel, which has the drivers) q35 with a SATA CD-ROM and an e1000e.
# Prints each step and the boot time; exits non-zero on failure.
# Environment: OUT (default _output/guest), BOOT_TIMEOUT (seconds, default 180).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

OUT=${OUT:-$PWD/_output/guest}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-180}
POWERDOWN_TIMEOUT=60

for f in vmlinuz initramfs.cpio.gz cmdline disk.raw disk.qcow2; do
  [[ -f $OUT/$f ]] || die "$OUT/$f is missing: run hack/guest/build.sh (make guest) first"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kubevisor-guest-smoke.XXXXXX")
qemu_pid=
cleanup() {
  if [[ -n $qemu_pid ]] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# fail MSG: prints the end of the current guest's serial log, then stops.
fail() {
  if [[ -n ${log:-} && -f $log ]]; then
    echo "---- last lines of the serial console ($case) ----" >&2
    tail -n 40 "$log" | tr -d '\r' >&2
    echo "----" >&2
  fi
  die "$case: $*"
}

# wait_for PATTERN SECONDS: waits until the serial log has a line matching PATTERN.
wait_for() {
  local deadline=$((SECONDS + $2))
  until grep -q -- "$1" "$log"; do
    kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited while waiting for '$1'"
    ((SECONDS < deadline)) || fail "no '$1' on the console within $2 s"
    sleep 0.1
  done
}

free_port() {
  local p
  for _ in {1..100}; do
    p=$((20000 + RANDOM % 40000))
    [[ -n $(ss -Hltn "sport = :$p") ]] || { echo "$p"; return 0; }
  done
  die "no free TCP port found"
}

qmp() {
  printf '{"execute":"qmp_capabilities"}\n{"execute":"%s"}\n' "$1" |
    socat -t 2 - "UNIX-CONNECT:$work/qmp.sock"
}

# Seed ISOs, with a token so that stale output cannot pass.
token=$(date +%s)-$RANDOM
step "seed ISOs (token $token)"
mkdir -p "$work/nocloud" "$work/configdrive/openstack/latest"
ssh-keygen -q -t ed25519 -N '' -C "kubevisor-smoke-$token" -f "$work/id_ed25519"
printf '#cloud-config\n# kubevisor smoke %s\nruncmd:\n  - [echo, "hello from user-data"]\nssh_authorized_keys:\n  - %s\n' \
  "$token" "$(cat "$work/id_ed25519.pub")" >"$work/nocloud/user-data"
printf 'instance-id: smoke-nocloud-%s\nlocal-hostname: smoke-nocloud\n' "$token" >"$work/nocloud/meta-data"
# No final newline on purpose: the guest must still end the block with a marker line of its own.
printf '#!/bin/sh\necho "kubevisor smoke %s"' "$token" >"$work/configdrive/openstack/latest/user_data"
printf '{"uuid": "smoke-configdrive-%s", "hostname": "smoke-configdrive", "name": "smoke"}\n' "$token" \
  >"$work/configdrive/openstack/latest/meta_data.json"
genisoimage -quiet -V cidata -J -r -o "$work/nocloud.iso" "$work/nocloud"
genisoimage -quiet -V config-2 -J -r -o "$work/configdrive.iso" "$work/configdrive"

# run_case NAME SEED(nocloud|configdrive|none) QEMU-ARGS...: boots one form of the guest and
# checks it. The NIC is a virtio-net-pci unless $nic names another model.
nic=virtio-net-pci
run_case() {
  case=$1
  local seed=$2
  shift 2
  local userdata instance host port sshport t0 ready_ms got keys
  case $seed in
    nocloud)
      userdata=$work/nocloud/user-data
      instance=smoke-nocloud-$token
      host=smoke-nocloud
      ;;
    configdrive)
      userdata=$work/configdrive/openstack/latest/user_data
      instance=smoke-configdrive-$token
      host=smoke-configdrive
      ;;
    none) host=kubevisor-guest ;;
  esac
  log=$work/$case.serial
  port=$(free_port)
  sshport=$(free_port)
  rm -f "$work/qmp.sock" "$work/qga.sock" "$work/console"
  mkfifo "$work/console"
  exec 3<>"$work/console" # held open read-write: QEMU never sees end-of-file on its stdin

  : >"$log"
  step "$case: booting (TCG, HTTP forwarded from 127.0.0.1:$port)"
  t0=$(now_ms)
  qemu-system-x86_64 -accel tcg -m 256 -nographic -no-reboot \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:80,hostfwd=tcp:127.0.0.1:$sshport-:22" -device "$nic,netdev=n0" \
    -qmp "unix:$work/qmp.sock,server=on,wait=off" \
    -device virtio-serial-pci,id=virtio-serial0 -chardev "socket,id=qga0,path=$work/qga.sock,server=on,wait=off" \
    -device virtserialport,bus=virtio-serial0.0,chardev=qga0,name=org.qemu.guest_agent.0 \
    "$@" <&3 >"$log" 2>&1 &
  qemu_pid=$!

  wait_for '^KUBEVISOR-GUEST-READY' "$BOOT_TIMEOUT"
  ready_ms=$(($(now_ms) - t0))
  got=$(tr -d '\r' <"$log" | sed -n 's/^kubevisor-guest: ready \(.*\) after kernel start/\1/p')
  step "$case: KUBEVISOR-GUEST-READY $(printf '%d.%03d' $((ready_ms / 1000)) $((ready_ms % 1000))) s after QEMU start ($got after kernel start)"

  if [[ $seed == none ]]; then
    grep -q 'no cidata or config-2 filesystem found' "$log" || fail "no 'no cidata or config-2' message"
    ! grep -q '^KUBEVISOR-USERDATA-BEGIN' "$log" || fail "user-data markers without a seed"
    step "$case: no seed ISO reported"
  else
    grep -q "^KUBEVISOR-DATASOURCE: $seed " "$log" || fail "no 'KUBEVISOR-DATASOURCE: $seed' line"
    got=$(tr -d '\r' <"$log" | sed -n 's/^KUBEVISOR-INSTANCE-ID: //p')
    [[ $got == "$instance" ]] || fail "instance-id is '$got', want '$instance'"
    tr -d '\r' <"$log" | sed -n '/^KUBEVISOR-USERDATA-BEGIN$/,/^KUBEVISOR-USERDATA-END$/p' |
      sed '1d;$d' >"$work/userdata.got"
    { cat "$userdata"; [[ -z $(tail -c 1 "$userdata") ]] || echo; } >"$work/userdata.want"
    cmp -s "$work/userdata.got" "$work/userdata.want" ||
      fail "user-data on the console differs: $(diff "$work/userdata.want" "$work/userdata.got" || true)"
    step "$case: $seed user-data and instance-id $instance on the console"
  fi

  got=$(tr -d '\r' <"$log" | sed -n 's/^KUBEVISOR-IP: //p' | head -n 1)
  [[ $got == "10.0.2.15 eth0 "* ]] || fail "KUBEVISOR-IP is '$got', want 10.0.2.15 on eth0"
  step "$case: KUBEVISOR-IP: $got"

  local deadline=$((SECONDS + 30)) body=
  until body=$(curl -fsS --max-time 5 "http://127.0.0.1:$port/" 2>/dev/null) &&
    [[ $body == *"kubevisor-guest ok"* ]]; do
    ((SECONDS < deadline)) || fail "HTTP on 127.0.0.1:$port did not answer 'kubevisor-guest ok' within 30 s"
    sleep 1
  done
  [[ $body == *"hostname: $host"* ]] || fail "HTTP reply has no 'hostname: $host': $body"
  step "$case: HTTP: $(head -n 1 <<<"$body"), hostname $host"

  # SSH: the NoCloud user-data authorizes the smoke key; the others authorize none.
  keys=$(tr -d '\r' <"$log" | sed -n 's/^KUBEVISOR-SSH: \([0-9]*\) authorized keys$/\1/p')
  if [[ $seed == nocloud ]]; then
    [[ $keys == 1 ]] || fail "KUBEVISOR-SSH reports '$keys' authorized keys, want 1"
    # shellcheck disable=SC2016
    got=$(ssh -i "$work/id_ed25519" -p "$sshport" -o BatchMode=yes -o StrictHostKeyChecking=no \
      -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=30 root@127.0.0.1 \
      'echo KUBEVISOR-SSH-$((6*7))' 2>&1) || fail "ssh root@127.0.0.1:$sshport: $got"
    [[ $got == KUBEVISOR-SSH-42 ]] || fail "ssh ran the command and printed '$got'"
    step "$case: ssh with the user-data's key runs a command"
  else
    [[ $keys == 0 ]] || fail "KUBEVISOR-SSH reports '$keys' authorized keys, want 0"
  fi

  # The guest agent: a resync (0xFF, guest-sync-delimited), then guest-get-osinfo.
  grep -q '^KUBEVISOR-AGENT: org.qemu.guest_agent.0 ' "$log" || fail "no 'KUBEVISOR-AGENT: org.qemu.guest_agent.0' line"
  got=$(printf '\377{"execute":"guest-sync-delimited","arguments":{"id":4242}}\n{"execute":"guest-get-osinfo"}\n' |
    socat -t 5 - "UNIX-CONNECT:$work/qga.sock" 2>&1 | tr -d '\377') || fail "guest agent socket: $got"
  [[ $got == *'"return": 4242'* && $got == *'"version-id": "12"'* && $got == *'"id": "debian"'* ]] ||
    fail "qemu-ga guest-get-osinfo: '$got', want Debian 12"
  step "$case: qemu-ga: $(grep -o '"pretty-name": "[^"]*"' <<<"$got")"

  # The shell must evaluate the line: its echo would show the unexpanded $((6*7)).
  # shellcheck disable=SC2016
  printf 'echo KUBEVISOR-CONSOLE-$((6*7))\n' >&3
  wait_for '^KUBEVISOR-CONSOLE-42' 30
  step "$case: console shell answers"

  qmp system_powerdown >"$work/qmp.out" 2>&1 || fail "QMP: $(cat "$work/qmp.out")"
  [[ $(grep -c '"return": {}' "$work/qmp.out") == 2 ]] || fail "QMP system_powerdown: $(cat "$work/qmp.out")"
  t0=$(now_ms)
  local deadline=$((SECONDS + POWERDOWN_TIMEOUT)) rc=0
  while kill -0 "$qemu_pid" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "QEMU still runs ${POWERDOWN_TIMEOUT} s after system_powerdown"
    sleep 0.1
  done
  wait "$qemu_pid" || rc=$?
  qemu_pid=
  exec 3>&-
  ((rc == 0)) || fail "QEMU exited with status $rc"
  grep -q '^KUBEVISOR-POWEROFF' "$log" || fail "QEMU exited without the guest's KUBEVISOR-POWEROFF"
  step "$case: system_powerdown: QEMU exited in $(($(now_ms) - t0)) ms"
  echo "$case $ready_ms" >>"$work/times"
}

kernel=(-kernel "$OUT/vmlinuz" -initrd "$OUT/initramfs.cpio.gz" -append "$(cat "$OUT/cmdline")")
run_case kernel-nocloud-ide nocloud -M pc "${kernel[@]}" \
  -drive "file=$work/nocloud.iso,format=raw,media=cdrom,if=ide,readonly=on"
run_case disk-qcow2-nocloud-virtio-scsi nocloud -M q35 \
  -drive "file=$OUT/disk.qcow2,format=qcow2,if=virtio,snapshot=on" \
  -device virtio-scsi-pci,id=scsi0 \
  -drive "file=$work/nocloud.iso,format=raw,if=none,id=seed,media=cdrom,readonly=on" \
  -device scsi-cd,drive=seed,bus=scsi0.0
run_case disk-raw-nocloud-ide nocloud -M pc \
  -drive "file=$OUT/disk.raw,format=raw,if=ide,snapshot=on" \
  -drive "file=$work/nocloud.iso,format=raw,media=cdrom,if=ide,index=2,readonly=on"
run_case kernel-configdrive-virtio-blk configdrive -M pc "${kernel[@]}" \
  -drive "file=$work/configdrive.iso,format=raw,if=virtio,readonly=on"
run_case kernel-no-seed none -M q35 "${kernel[@]}"
# Debian's cloud kernel has no AHCI and no e1000/e1000e driver: q35's own SATA CD-ROM and
# NIC need a guest built from the generic kernel (KERNEL_PKG=linux-image-amd64 build.sh).
if grep -q '^modules=.* ahci .*e1000e' "$OUT/BUILD-INFO"; then
  nic=e1000e run_case kernel-nocloud-q35-sata-e1000e nocloud -M q35 "${kernel[@]}" \
    -drive "file=$work/nocloud.iso,format=raw,media=cdrom,if=ide,readonly=on"
fi

step "all cases passed; boot to KUBEVISOR-GUEST-READY (ms):"
sed 's/^/    /' "$work/times"
