#!/usr/bin/env bash
# Builds Kubevisor's own test guest from Debian packages only (`make guest` runs this):
#
#   $OUT/vmlinuz            Debian's cloud kernel (linux-image-cloud-amd64), for direct kernel boot
#   $OUT/initramfs.cpio.gz  busybox-static + the kernel modules it needs + dropbear (sshd),
#                           qemu-ga (the QEMU guest agent) and the libraries they link +
#                           hack/guest/rootfs
#                           (its /init prints the markers that tests look for: see
#                           rootfs/sbin/kubevisor-setup)
#   $OUT/cmdline            the kernel command line to boot them with
#   $OUT/disk.raw           the same guest as an MBR disk that boots with SeaBIOS (syslinux on
#   $OUT/disk.qcow2         a FAT partition; built on image files, no mounts or loop devices)
#                           and with UEFI (OVMF, without Secure Boot: syslinux.efi is unsigned)
#   $OUT/BUILD-INFO         package versions and sha256 sums of the above
#   $OUT/containerdisk/     disk.qcow2 as a containerDisk image, kubevisor/test-guest:latest
#   $OUT/containerdisk.tar  (/disk/disk.qcow2, owner 107:107, mode 0444): an OCI image layout,
#                           and a `docker save` tarball for `ctr images import` (written by
#                           hack/guest/containerdisk, with go run: $GO, default go)
#
# The kernel, busybox, dropbear and qemu-guest-agent .debs are fetched with `apt-get download` into $CACHE and unpacked
# in a temporary directory: nothing is installed on the host for the guest's contents. The
# host tools (cpio, dosfstools, mtools, syslinux, fdisk, qemu-utils) come from the Makefile's
# deps sets (make guest). Environment: OUT (default _output/guest), CACHE (default $OUT/.cache),
# KERNEL_PKG (default linux-image-cloud-amd64), DISK_MB (default 64).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

OUT=${OUT:-$PWD/_output/guest}
CACHE=${CACHE:-$OUT/.cache}
KERNEL_PKG=${KERNEL_PKG:-linux-image-cloud-amd64}
DISK_MB=${DISK_MB:-64}
CMDLINE="console=ttyS0 panic=-1"
# Fixed timestamps make the initramfs reproducible.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
ROOTFS=hack/guest/rootfs
# Modules loaded at boot when the kernel has them as modules (built-in or absent ones are
# skipped): virtio devices, CD-ROM/disk buses, the seed filesystems, the ACPI power button,
# the TPM interfaces (built into the Debian cloud kernel), efivarfs (the EFI variables of a
# guest booted with UEFI).
MODULES=(
  virtio_pci virtio_net virtio_blk virtio_scsi virtio_balloon virtio_console virtio_rng
  ata_piix ahci sd_mod sr_mod isofs vfat nls_cp437 nls_iso8859_1 nls_utf8
  e1000 e1000e button evdev virtio_input tpm_crb tpm_tis efivarfs
)

start=$SECONDS

work=$(mktemp -d "${TMPDIR:-/tmp}/kubevisor-guest.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT" "$CACHE"

# fetch_deb PKG: sets deb to the path of PKG's candidate .deb in $CACHE, downloading it when
# absent. Stale package lists (a version the mirror dropped) get one apt-get update.
fetch_deb() {
  local pkg=$1 uri file size
  uri=$(apt-get download --print-uris "$pkg" 2>/dev/null) || true
  if [[ -z $uri ]]; then
    apt_update_once
    uri=$(apt-get download --print-uris "$pkg")
  fi
  read -r _ file size _ <<<"$uri"
  deb=$CACHE/$file
  [[ ! -f $deb || $(stat -c %s "$deb") != "$size" ]] || return 0
  step "downloading $file"
  if ! (cd "$CACHE" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >/dev/null); then
    [[ -z $_apt_updated ]] || die "cannot download $pkg"
    apt_update_once
    fetch_deb "$pkg"
  fi
}

# The metapackage (linux-image-cloud-amd64) depends on the versioned kernel package.
apt-cache show "$KERNEL_PKG" >/dev/null 2>&1 || apt_update_once
kpkg=$(apt-cache depends --important "$KERNEL_PKG" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
kpkg=${kpkg:-$KERNEL_PKG}

step "kernel: $kpkg"
fetch_deb "$kpkg"
kdeb=$deb
fetch_deb busybox-static
bdeb=$deb
dpkg-deb -x "$kdeb" "$work/kernel"
dpkg-deb -x "$bdeb" "$work/busybox"
bb=$work/busybox/bin/busybox
kver=$(basename "$(echo "$work"/kernel/lib/modules/*)")
kmods=$work/kernel/lib/modules/$kver
# The .deb leaves modules.dep to its postinst: generate it (busybox depmod, no kmod needed).
"$bb" depmod -b "$work/kernel" "$kver"

step "initramfs: busybox $(dpkg-deb -f "$bdeb" Version), modules of $kver"
root=$work/initramfs
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,root,var/log,lib/modules/"$kver"}
ln -s /run "$root/var/run"
install -m 0755 "$bb" "$root/bin/busybox"
while read -r applet; do
  [[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
done < <("$bb" --list-full)
cp -R "$ROOTFS"/. "$root"/
chmod 0755 "$root/init" "$root/sbin/kubevisor-setup" "$root/etc/udhcpc.script" \
  "$root/etc/acpi/PWRF/00000080"
chmod 0700 "$root/root"

# modpath NAME FILE: the path (relative to the modules directory) of module NAME listed in
# FILE (modules.dep or modules.builtin); '-' and '_' are the same in module names.
modpath() {
  awk -F: -v want="${1//-/_}" '{ n = $1; sub(/.*\//, "", n); sub(/\.ko$/, "", n); gsub(/-/, "_", n)
    if (n == want) { print $1; exit } }' "$2"
}
declare -A copied=()
# copy_mod PATH: copies a module and, first, the modules it depends on.
copy_mod() {
  local rel=$1 dep deps
  [[ -z ${copied[$rel]:-} ]] || return 0
  copied[$rel]=1
  read -ra deps <<<"$(awk -F': *' -v m="$rel" '$1 == m { print $2; exit }' "$kmods/modules.dep")"
  for dep in "${deps[@]}"; do
    copy_mod "$dep"
  done
  install -D -m 0644 "$kmods/$rel" "$root/lib/modules/$kver/$rel"
}
loaded=() builtin=() absent=()
for m in "${MODULES[@]}"; do
  if rel=$(modpath "$m" "$kmods/modules.dep") && [[ -n $rel ]]; then
    copy_mod "$rel"
    loaded+=("$m")
  elif [[ -n $(modpath "$m" "$kmods/modules.builtin") ]]; then
    builtin+=("$m")
  else
    absent+=("$m")
  fi
done
# dropbear, the SSH server (vmctl ssh), and qemu-ga, the QEMU guest agent (on the virtio-serial
# port org.qemu.guest_agent.0), with the shared libraries they need, found through the ELF
# NEEDED entries of what is copied (objdump from binutils, which gcc brings). base-files gives
# Debian's os-release, which the agent reports (guest-get-osinfo).
step "initramfs: dropbear, qemu-guest-agent and their libraries"
user_debs=(dropbear-bin libtomcrypt1 libtommath1 libgmp10 libcrypt1 zlib1g libc6
  qemu-guest-agent libglib2.0-0 libpcre2-8-0 libnuma1
  libudev1 liburing2 base-files)
user_versions=()
for p in "${user_debs[@]}"; do
  fetch_deb "$p"
  dpkg-deb -x "$deb" "$work/user"
  user_versions+=("$p $(dpkg-deb -f "$deb" Version)")
done
install -m 0755 "$work/user/usr/sbin/dropbear" "$root/usr/sbin/dropbear"
install -m 0755 "$work/user/usr/sbin/qemu-ga" "$root/usr/sbin/qemu-ga"
install -D -m 0644 "$work/user/usr/lib/os-release" "$root/usr/lib/os-release"
ln -s ../usr/lib/os-release "$root/etc/os-release"
mkdir -p "$root/lib/x86_64-linux-gnu" "$root/lib64"
libs=("$work/user/usr/sbin/dropbear" "$work/user/usr/sbin/qemu-ga")
declare -A have_lib=()
while ((${#libs[@]})); do
  elf=${libs[0]}
  libs=("${libs[@]:1}")
  while read -r needed; do
    [[ -z ${have_lib[$needed]:-} ]] || continue
    have_lib[$needed]=1
    lib=$(find "$work/user" -name "$needed" \( -type f -o -type l \) | head -n 1)
    [[ -n $lib ]] || die "$(basename "$elf") needs $needed, which none of ${user_debs[*]} has"
    install -m 0755 "$(readlink -f "$lib")" "$root/lib/x86_64-linux-gnu/$needed"
    libs+=("$(readlink -f "$lib")")
  done < <(objdump -p "$elf" | awk '$1 == "NEEDED" { print $2 }')
done
ld=$(find "$work/user" -name 'ld-linux-x86-64.so.2' | head -n 1)
[[ -n $ld ]] || die "libc6 has no ld-linux-x86-64.so.2"
install -m 0755 "$(readlink -f "$ld")" "$root/lib64/ld-linux-x86-64.so.2"
echo "    ${user_versions[*]}; libraries: ${!have_lib[*]}"
printf '%s\n' "${loaded[@]}" >"$root/etc/modules"
cp "$kmods/modules.builtin" "$root/lib/modules/$kver/"
"$bb" depmod -b "$root" "$kver"
echo "    modules: ${#copied[@]} files for: ${loaded[*]}"
echo "    built in: ${builtin[*]:-none}; not in this kernel: ${absent[*]:-none}"
printf 'kernel=%s\nbusybox=%s\n' "$kver" "$(dpkg-deb -f "$bdeb" Version)" >"$root/etc/kubevisor-guest-release"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
  cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -9 -n >"$work/initramfs.cpio.gz"
cp "$work/kernel/boot/vmlinuz-$kver" "$work/vmlinuz"
echo "$CMDLINE" >"$work/cmdline"

# The disk boots with UEFI too: OVMF finds the removable-media loader \EFI\BOOT\BOOTX64.EFI
# on the FAT partition of an MBR disk, here syslinux's EFI build (syslinux-efi, fetched like
# the kernel) with its ldlinux.e64 (syslinux-common, a host tool) and the same configuration.
fetch_deb syslinux-efi
sdeb=$deb
dpkg-deb -x "$sdeb" "$work/syslinux-efi"

step "disk: ${DISK_MB} MiB MBR, FAT16 partition with syslinux (BIOS) and syslinux.efi (UEFI)"
part_start=2048 # sectors: the partition starts at 1 MiB
part_kib=$(((DISK_MB * 2048 - part_start) / 2))
cat >"$work/syslinux.cfg" <<EOF
SERIAL 0 115200
DEFAULT kubevisor
PROMPT 0
TIMEOUT 0
LABEL kubevisor
  LINUX /vmlinuz
  INITRD /initrd.gz
  APPEND $CMDLINE
EOF
fat=$work/fat.img
mkfs.vfat -F 16 -h "$part_start" -n KVBOOT -i 4b564731 -C "$fat" "$part_kib" >/dev/null
mcopy -i "$fat" "$work/vmlinuz" ::/vmlinuz
mcopy -i "$fat" "$work/initramfs.cpio.gz" ::/initrd.gz
mcopy -i "$fat" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --install "$fat" # boot sector + ldlinux.sys/ldlinux.c32, through mtools
mmd -i "$fat" ::/EFI ::/EFI/BOOT
mcopy -i "$fat" "$work/syslinux-efi/usr/lib/SYSLINUX.EFI/efi64/syslinux.efi" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$fat" /usr/lib/syslinux/modules/efi64/ldlinux.e64 ::/EFI/BOOT/ldlinux.e64
mcopy -i "$fat" "$work/syslinux.cfg" ::/EFI/BOOT/syslinux.cfg
truncate -s "${DISK_MB}M" "$work/disk.raw"
printf 'label: dos\nlabel-id: 0x4b564731\nstart=%d, type=e, bootable\n' "$part_start" |
  sfdisk --quiet "$work/disk.raw"
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$fat" of="$work/disk.raw" bs=512 seek="$part_start" conv=notrunc,sparse status=none
qemu-img convert -f raw -O qcow2 "$work/disk.raw" "$work/disk.qcow2"

{
  echo "kernel-package=$kpkg $(dpkg-deb -f "$kdeb" Version)"
  echo "kernel-release=$kver"
  echo "busybox=busybox-static $(dpkg-deb -f "$bdeb" Version)"
  echo "efi-loader=syslinux-efi $(dpkg-deb -f "$sdeb" Version)"
  echo "user=${user_versions[*]}"
  echo "cmdline=$CMDLINE"
  echo "modules=${loaded[*]}"
  (cd "$work" && sha256sum vmlinuz initramfs.cpio.gz disk.raw disk.qcow2)
} >"$work/BUILD-INFO"
for f in vmlinuz initramfs.cpio.gz cmdline disk.raw disk.qcow2 BUILD-INFO; do
  mv -f "$work/$f" "$OUT/$f"
done

step "containerDisk image of disk.qcow2 (go run ./hack/guest/containerdisk)"
"${GO:-go}" run ./hack/guest/containerdisk --disk "$OUT/disk.qcow2" --ref kubevisor/test-guest:latest \
  --layout "$OUT/containerdisk" --tarball "$OUT/containerdisk.tar"

step "done in $((SECONDS - start)) s: $OUT"
(cd "$OUT" && du -h --apparent-size vmlinuz initramfs.cpio.gz disk.raw disk.qcow2 containerdisk.tar | sed 's/^/    /')
