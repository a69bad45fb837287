# Shared by the scripts that make a Debian tree with debootstrap (fresh-machine-check.sh,
# image-base.sh): sourced, not run.

# The first Debian archive this machine's apt is configured with (IWSCOPE_FRESH_MIRROR overrides).
debian_mirror() {
  if [ -n "${IWSCOPE_FRESH_MIRROR:-}" ]; then echo "$IWSCOPE_FRESH_MIRROR"; return; fi
  grep -rhoE '(URIs:|^deb)\s+\S+/debian/?(\s|$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
    | grep -oE 'https?://\S+/debian/?' | head -n 1 || true
}

# This machine's local CA certificates (an egress proxy's, say) added to the tree at $1.
add_local_ca_certificates() {
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"
    chroot "$1" update-ca-certificates >/dev/null 2>&1
  fi
}

# Install those of the named packages that are missing (debian-archive-keyring: Ubuntu's
# debootstrap needs it to check a Debian suite).
ensure_debian_packages() {
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
