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
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
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
