#!/usr/bin/env bash
# The base image the image checks build on: Debian 12 (debootstrap minbase) with python3,
# python3-venv and python3-pip -- the role python:3.11-slim-bookworm plays in a registry
# build -- for machines that reach Debian's mirror and PyPI but no image registry. Prints the
# image's name (localhost/iwscope-base:bookworm). Run as root; the debootstrapped tree is cached
# under $IWSCOPE_IMAGES_DIR (default /var/tmp/iwscope-images) and imported into podman once.
#
# Debian's pip refuses to install into the system Python (PEP 668's EXTERNALLY-MANAGED); an
# image's Python is its own, so the marker is removed, as the official python images have none.
# This machine's local CA certificates (an egress proxy's) are added, as they would be to a VM.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
images_dir="${IWSCOPE_IMAGES_DIR:-/var/tmp/iwscope-images}"
suite=bookworm
base="${images_dir}/base-${suite}"
image="localhost/iwscope-base:${suite}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-${repo}/docker/podman-containers.conf}"
# shellcheck source=scripts/debian.sh
. "${repo}/scripts/debian.sh"

[ "$(id -u)" = 0 ] || { echo "image-base: run as root" >&2; exit 1; }
ensure_debian_packages debootstrap debian-archive-keyring podman buildah runc
if [ ! -f "${base}/.complete" ]; then
  echo "image-base: debootstrap ${suite} (minbase + python3, venv, pip) into ${base}" >&2
  rm -rf "$base"
  mkdir -p "$images_dir"
  mirror="$(debian_mirror)"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$suite" "$base" ${mirror:+"$mirror"} >&2
  add_local_ca_certificates "$base"
  rm -f "${base}"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "${base}"/var/lib/apt/lists/* "${base}"/var/cache/apt/archives/*.deb
  touch "${base}/.complete"
  podman rmi -f "$image" >/dev/null 2>&1 || true
fi
# Bumped when what the import sets changes, so that a cached image is imported again.
recipe=2
if [ "$(podman image inspect --format '{{index .Labels "iwscope.base-recipe"}}' "$image" 2>/dev/null)" != "$recipe" ]; then
  # PATH as a registry image sets it: `podman run` supplies one when an image has none, `podman kube play` does not.
  tar -C "$base" --exclude=./.complete -c . \
    | podman import --quiet --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change "LABEL iwscope.base-recipe=${recipe}" - "$image" >/dev/null
fi
echo "$image"
