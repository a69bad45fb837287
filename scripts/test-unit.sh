#!/usr/bin/env bash
# The fast tier (`make test-unit`): the tests of pure code -- statistics and buckets, the wire
# format's encode/decode and schema, object sizes, the slow-start and cost models, plans, the
# probe's spool and uploader against an in-process stub, configuration parsing.  No root, no
# PostgreSQL/Redis/Celery, no network namespaces, no Chromium; well under a minute.
#
# The tier is a pytest marker, not a list: a module says `pytestmark = pytest.mark.unit` (or a
# test `@pytest.mark.unit` where the rest of its module needs a service).  A test fits only if it
# needs none of the above; the test database and Redis are pointed at a closed port, so one that
# reaches for them fails here instead of quietly using a local stack.  Tests also marked `slow`
# (minutes of pure simulation) are left to `make test-slow` (by hand; not in make test or CI).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  echo "no .venv: run make setup first" >&2
  exit 2
fi

# A checkout the user cannot write to (another user's, read-only): no cache, the report elsewhere.
junit=artifacts/junit-unit.xml
options=()
if ! mkdir -p artifacts 2>/dev/null || [[ ! -w artifacts ]]; then
  junit="$(mktemp -d)/junit-unit.xml"
fi
[[ -w . ]] || options+=(-p no:cacheprovider)

# No services: the tests' own database and Redis on a closed port, and no local stack either
# (settings that fall back to this checkout's stack find none, as before `iwscope services start`).
export IWSCOPE_TEST_DATABASE_URL="postgresql+psycopg://unit-tier:none@127.0.0.1:9/no-database-in-the-unit-tier"
export IWSCOPE_TEST_REDIS_URL="redis://127.0.0.1:9/0"
IWSCOPE_RUN_DIR="$(mktemp -d)"
export IWSCOPE_RUN_DIR
trap 'rm -rf "$IWSCOPE_RUN_DIR"' EXIT
.venv/bin/python -m pytest "${options[@]}" --junitxml="$junit" -m "unit and not slow" tests "$@"
