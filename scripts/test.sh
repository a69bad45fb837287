#!/usr/bin/env bash
# The test suite: starts the local PostgreSQL and Redis, then pytest (warnings are errors).
# Extra arguments go to pytest (e.g. `scripts/test.sh -m faults`, `scripts/test.sh tests/lab`).
set -euo pipefail
cd "$(dirname "$0")/.."
# An assignment, so that set -e stops here when the services cannot start (an eval of a
# failed command substitution would run the suite against nothing).
services=$(.venv/bin/iwscope services start)
eval "$(sed 's/^/export IWSCOPE_TEST_/' <<<"$services")"
mkdir -p artifacts
scripts/ensure-helm.sh >/dev/null  # helm v3.16.4, built once (~90 s) and cached in /var/cache/iwscope
exec .venv/bin/pytest "$@"
