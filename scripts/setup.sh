#!/usr/bin/env bash
# Idempotent setup on a fresh Debian/Ubuntu machine as root: system packages that are
# missing, the virtualenv, the four distributions in editable mode, the link emulator.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null || need+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v ip >/dev/null || need+=(iproute2)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
command -v runuser >/dev/null || need+=(util-linux)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
stamp=.venv/.iwscope-installed
if [ ! -f "$stamp" ] || [ -n "$(find probe collector lab dashboard requirements-test.txt -maxdepth 1 \( -name pyproject.toml -o -name 'requirements-*.txt' \) -newer "$stamp")" ]; then
  .venv/bin/pip install -q -e probe -e 'collector[test]' -e lab -e 'dashboard[test]' -r requirements-test.txt
  touch "$stamp"
fi
if [ -f lab/emulator/Makefile ]; then make -s -C lab/emulator; fi
