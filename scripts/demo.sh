#!/usr/bin/env bash
# The main job: local PostgreSQL + Redis, the collector stack (API, worker, beat) and the
# dashboard left running in the background, a short multi-region lab campaign (`world`
# scenario: 17 probes in 6 regions behind emulated links), then the dashboard's URL and a check
# that every dashboard page shows data (headless Chromium; `iwscope dashboard check-pages`).
# Running it again reuses the running stack and adds another campaign.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/iwscope lab cleanup >/dev/null 2>&1 || true
exec .venv/bin/iwscope lab demo "$@"
