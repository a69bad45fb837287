#!/usr/bin/env bash
# Idempotent setup on a fresh Debian 12 / Ubuntu 24.04 machine as root: the system packages
# that are missing, the virtualenv with the pinned third-party packages of requirements.lock
# (versions and hashes: `make lock` refreshes it), the four distributions in editable mode,
# the link emulator.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
command -v redis-server >/dev/null && getent passwd redis >/dev/null || need+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && getent passwd postgres >/dev/null || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v ip >/dev/null || need+=(iproute2)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
command -v runuser >/dev/null || need+=(util-linux)
command -v sysctl >/dev/null || need+=(procps)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)            # the TLS tests compare with curl's time_appconnect
command -v systemd-analyze >/dev/null || need+=(systemd)   # the deploy tests score the units
command -v git >/dev/null || need+=(git)
have ca-certificates || need+=(ca-certificates)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v ethtool >/dev/null || need+=(ethtool)      # the IW grid toggles the lab devices' GSO
command -v nft >/dev/null || need+=(nftables)         # iwprobe tap's arms (an nftables rule marks SYNs)
command -v tcpdump >/dev/null || need+=(tcpdump)     # the held-out check of the probe's trial traces
command -v wrk >/dev/null || need+=(wrk)              # load from clients nobody here wrote (the tap's cost,
command -v h2load >/dev/null || need+=(nghttp2-client)  #   zero failed requests while arms change)
# Web servers nobody here wrote, for the IW-inference grid (tests/lab/test_lab_iwgrid.py), the
# real-users lab (nginx behind iwprobe tap) and the QUIC census (Caddy: quic-go's HTTP/3), which
# start them themselves with their own configuration on the lab's addresses: installed but never
# left running or enabled (Debian starts and enables lighttpd, nginx and caddy on :80 when they
# are installed).
servers=()
have lighttpd || servers+=(lighttpd)
have nginx || servers+=(nginx)
have caddy || servers+=(caddy)
packages=("${need[@]}" "${servers[@]}")
if ((${#packages[@]})); then
  echo "setup: installing ${packages[*]}"
  apt-get update -qq
fi
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ((${#servers[@]})); then
  # A policy-rc.d that refuses every start (exit 101) for the install only; one already there
  # (a container's) is put back afterwards, also when the install fails.
  policy=/usr/sbin/policy-rc.d
  saved_policy=""
  if [ -e "$policy" ]; then
    saved_policy="$(mktemp /usr/sbin/.policy-rc.d.iwscope.XXXXXX)"
    cp -p "$policy" "$saved_policy"
  fi
  restore_policy() {
    if [ -n "$saved_policy" ]; then mv -f "$saved_policy" "$policy"; else rm -f "$policy"; fi
  }
  trap restore_policy EXIT
  printf '#!/bin/sh\n# iwscope setup: no service starts while its packages install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${servers[@]}" >/dev/null
  restore_policy
  trap - EXIT
  for server in "${servers[@]}"; do
    if command -v systemctl >/dev/null; then
      systemctl disable --quiet "$server" 2>/dev/null || true   # offline too: removes the links
      if systemctl is-active --quiet "$server" 2>/dev/null; then systemctl stop "$server"; fi
    elif command -v update-rc.d >/dev/null; then
      update-rc.d "$server" disable >/dev/null 2>&1 || true
    fi
    # Started by its init script despite the policy: stop it by its pid file (if it is that server).
    pid="$(cat "/run/$server.pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$server" ]; then kill "$pid"; fi
  done
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.iwscope-installed
if [ ! -f "$stamp" ] || [ -n "$(find requirements.lock probe collector lab dashboard -maxdepth 1 \
      \( -name pyproject.toml -o -name requirements.lock \) -newer "$stamp")" ]; then
  # Third-party packages exactly as locked (a new upstream release cannot change a run), then
  # the project's own distributions from this checkout, built with the locked setuptools.
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements.lock
  .venv/bin/pip install -q --no-deps --no-build-isolation -e probe -e collector -e lab -e dashboard
  .venv/bin/pip check
  touch "$stamp"
fi
if [ -f lab/emulator/Makefile ]; then make -s -C lab/emulator; fi
