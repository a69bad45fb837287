#!/usr/bin/env bash
# The fresh-machine check: a brand-new Debian 12 (debootstrap minbase plus git and make, as
# a newcomer's VM would have), this checkout cloned into /root/iwscope under a 0700 /root,
# then `.ci/run` (= the README's `make test`) inside it as root. Run by hand, as root, on a
# machine with nothing listening on the stack's ports (54329, 63799, 8700, 8750); takes
# about half an hour (apt, pip, the Go toolchain and helm, then the suite).
#
#   scripts/fresh-machine-check.sh                 # .ci/run in a fresh chroot
#   scripts/fresh-machine-check.sh -- make demo    # any command instead, in /root/iwscope
#   KEEP=1 scripts/fresh-machine-check.sh ...      # keep the chroot afterwards
#   WORKTREE=1 scripts/fresh-machine-check.sh ...  # the working tree's files (uncommitted
#                                                  # changes too) instead of a clone of HEAD
#
# The chroot runs in its own mount namespace with its root bind-mounted on itself (so that
# `ip netns` can make /run/netns a shared mount inside it) and /proc, /sys, /dev and a fresh
# /run; it shares the machine's network namespace and kernel. The Debian mirror is the one
# this machine's apt uses (IWSCOPE_FRESH_MIRROR overrides). The debootstrapped base is
# cached under $IWSCOPE_FRESH_DIR (default /var/tmp/iwscope-fresh) and copied for each run.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
fresh_dir="${IWSCOPE_FRESH_DIR:-/var/tmp/iwscope-fresh}"
suite="${IWSCOPE_FRESH_SUITE:-bookworm}"
base="${fresh_dir}/base-${suite}"
command=(bash .ci/run)
if [ "${1:-}" = "--" ]; then shift; command=("$@"); fi

[ "$(id -u)" = 0 ] || { echo "fresh-machine-check: run as root" >&2; exit 1; }
for port in 54329 63799 8700 8750; do
  if (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
    echo "fresh-machine-check: port ${port} is in use here; stop this machine's stack first (make clean)" >&2
    exit 1
  fi
done
# shellcheck source=scripts/debian.sh
. "${repo}/scripts/debian.sh"
ensure_debian_packages debootstrap debian-archive-keyring
mirror="$(debian_mirror)"
if [ ! -f "${base}/.complete" ]; then
  echo "fresh-machine-check: debootstrap ${suite} (minbase + git, make) into ${base}" >&2
  rm -rf "$base"
  mkdir -p "$fresh_dir"
  debootstrap --variant=minbase --include=git,make,ca-certificates "$suite" "$base" ${mirror:+"$mirror"} >&2
  touch "${base}/.complete"
fi

root="$(mktemp -d "${fresh_dir}/run.XXXXXX")"
chroot_processes() {  # every process whose root directory is the chroot (its daemons outlive the command)
  local proc
  for proc in /proc/[0-9]*; do
    if [ "$(readlink "${proc}/root" 2>/dev/null)" = "$root" ]; then echo "${proc#/proc/}"; fi
  done
  return 0
}
cleanup() {
  local pids
  pids="$(chroot_processes)"
  if [ -n "$pids" ]; then
    kill -TERM $pids 2>/dev/null || true
    sleep 3
    pids="$(chroot_processes)"
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  fi
  if [ -z "${KEEP:-}" ]; then rm -rf --one-file-system "$root"; else echo "kept ${root}" >&2; fi
}
trap cleanup EXIT
cp -a "${base}/." "$root/"
rm -f "${root}/.complete"
cp /etc/resolv.conf "${root}/etc/resolv.conf"
# This machine's network trust, as a VM on the same network would be provisioned with it: the
# local CA certificates (an egress proxy's, say) and the TLS/proxy variables that name them.
add_local_ca_certificates "$root"
pass_env=()
while IFS= read -r name; do pass_env+=("${name}=${!name}"); done < <(compgen -e |
  grep -E '^(SSL_CERT_(FILE|DIR)|PIP_CERT|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|GIT_SSL_CAINFO|NODE_EXTRA_CA_CERTS|PIP_DEFAULT_TIMEOUT|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY)$' || true)
chmod 0700 "${root}/root"
if [ -n "${WORKTREE:-}" ]; then
  mkdir "${root}/root/iwscope"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r -n 200 sh -c \
    'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh | tar --null -T - -cf -) | tar -xf - -C "${root}/root/iwscope"
  git -C "${root}/root/iwscope" init -q && git -C "${root}/root/iwscope" add -A &&
    git -C "${root}/root/iwscope" -c user.name=check -c user.email=check@localhost commit -qm worktree
else
  git clone -q --no-local "$repo" "${root}/root/iwscope"
fi

echo "fresh-machine-check: running '${command[*]}' in ${root}/root/iwscope" >&2
started=$(date +%s)
status=0
unshare --mount --propagation private -- bash -euc '
  root="$1"; shift
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=0755 tmpfs "$root/run"
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
  nenv="$1"; shift
  exec chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 CI=true \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${@:1:$nenv}" \
    bash -c "cd /root/iwscope && exec \"\$@\"" bash "${@:$((nenv + 1))}"
' bash "$root" "${#pass_env[@]}" "${pass_env[@]}" "${command[@]}" || status=$?
elapsed=$(( $(date +%s) - started ))
printf 'fresh-machine-check: exit %s after %dm%02ds\n' "$status" $((elapsed / 60)) $((elapsed % 60)) >&2
exit "$status"
