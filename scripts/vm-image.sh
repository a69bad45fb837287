#!/usr/bin/env bash
# The virtual machine image the VM rehearsal boots (tests/deploy/test_vms.py, docs/deployment.md):
# Debian 12 made by debootstrap with Debian's cloud kernel, cloud-init (NoCloud), OpenSSH and
# python3 -- what a Debian 12 "genericcloud" image carries, for machines that reach Debian's
# mirror but no image download site. Prints three paths, one per line: the raw ext4 root
# filesystem, the kernel and the initrd (qemu boots them with -kernel/-initrd, so the image needs
# no boot loader). Run as root; cached under $IWSCOPE_IMAGES_DIR (default /var/tmp/iwscope-images);
# each VM boots a copy-on-write overlay of it, never the image itself.
#
# What a cloud image sets that debootstrap does not: ifupdown (cloud-init's renderer on Debian
# 12), a serial console for the boot log, cloud-init limited to NoCloud (no minutes spent asking
# for EC2's metadata service), and no root password (SSH keys from cloud-init only).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
images_dir="${IWSCOPE_IMAGES_DIR:-/var/tmp/iwscope-images}"
suite=bookworm
# Bumped when what the image holds changes, so that a cached image is made again.
recipe=2
tree="${images_dir}/vm-${suite}"
image="${images_dir}/vm-${suite}-r${recipe}.ext4"
# shellcheck source=scripts/debian.sh
. "${repo}/scripts/debian.sh"

[ "$(id -u)" = 0 ] || { echo "vm-image: run as root" >&2; exit 1; }
ensure_debian_packages debootstrap debian-archive-keyring e2fsprogs qemu-system-x86 qemu-utils genisoimage
# The debootstrapped tree is kept across recipes; what the image sets on top of it is applied
# (again) whenever the image of the current recipe is missing.
if [ ! -f "${tree}/.complete" ]; then
  echo "vm-image: debootstrap ${suite} (kernel, cloud-init, ssh, python3) into ${tree}" >&2
  rm -rf "$tree"
  mkdir -p "$images_dir"
  mirror="$(debian_mirror)"
  # python3-cffi-backend by name: debootstrap does not resolve the virtual package
  # (python3-cffi-backend-api-max) that python3-cryptography, a dependency of cloud-init, needs.
  debootstrap --variant=minbase \
    --include=python3-cffi-backend,systemd-sysv,udev,kmod,ifupdown,iproute2,isc-dhcp-client,netbase,openssh-server,sudo,python3,cloud-init,linux-image-cloud-amd64,initramfs-tools,ca-certificates,procps \
    "$suite" "$tree" ${mirror:+"$mirror"} >&2
  add_local_ca_certificates "$tree"
  rm -rf "${tree}"/var/lib/apt/lists/* "${tree}"/var/cache/apt/archives/*.deb
  touch "${tree}/.complete"
fi
if [ ! -f "$image" ]; then
  # cloud-init: NoCloud only (no minutes spent asking for a cloud's metadata service), the C.UTF-8
  # locale (no locale generation), one host key type (key generation is slow without KVM).
  printf 'datasource_list: [ NoCloud, None ]\nlocale: C.UTF-8\nssh_genkeytypes: [ ed25519 ]\n' \
    >"${tree}/etc/cloud/cloud.cfg.d/90-iwscope.cfg"
  printf '/dev/vda / ext4 defaults,errors=remount-ro 0 1\n' >"${tree}/etc/fstab"
  printf 'auto lo\niface lo inet loopback\nsource /etc/network/interfaces.d/*\n' >"${tree}/etc/network/interfaces"
  : >"${tree}/etc/hostname"
  chroot "$tree" passwd -l root >/dev/null   # no root password: SSH keys from cloud-init only
  chroot "$tree" systemctl enable serial-getty@ttyS0.service >/dev/null 2>&1 || true
  rm -f "${tree}"/etc/ssh/ssh_host_*   # made at first boot by cloud-init, one set per VM
  rm -f "${images_dir}"/vm-"${suite}"-r*.ext4
  used_mb="$(du -sm "$tree" | cut -f1)"
  mkfs.ext4 -q -F -L iwscope-root -d "$tree" "${image}.part" "$((used_mb * 13 / 10 + 512))M" >&2
  mv "${image}.part" "$image"
fi
kernel="$(ls "${tree}"/boot/vmlinuz-* | sort -V | tail -n 1)"
initrd="$(ls "${tree}"/boot/initrd.img-* | sort -V | tail -n 1)"
printf '%s\n%s\n%s\n' "$image" "$kernel" "$initrd"
