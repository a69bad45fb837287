#!/usr/bin/env bash
# The fast tier (`make test-unit`): the tests of pure code -- statistics and buckets, the wire
# format's encode/decode and schema, object sizes, the slow-start and cost models, plans, the
# probe's spool and uploader against an in-process stub, configuration parsing.  No root, no
# PostgreSQL/Redis/Celery, no network namespaces, no Chromium; well under a minute.
#
# The list below is the tier: a module, or a module::test where the rest of the module needs a
# service.  A test fits here only if it needs none of the above; the test database and Redis
# are pointed at a closed port, so one that reaches for them fails here instead of quietly using
# a local stack.  `make test` still runs every one of these too.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  echo "no .venv: run make setup first" >&2
  exit 2
fi

UNIT_TESTS=(
  tests/analysis/test_stats.py
  tests/analysis/test_cost_stats.py
  tests/analysis/test_paired.py
  tests/analysis/test_passive_stats.py
  tests/analysis/test_precision.py::test_duration_sets_the_time_box_and_adaptive_needs_one
  tests/campaign/test_model.py
  tests/campaign/test_reproduce_report.py
  tests/collector/test_collector_wire_contract.py
  tests/collector/test_collector_fastwire.py::test_fast_decoder_agrees_with_pydantic_on_generated_batches
  tests/collector/test_collector_fastwire.py::test_fast_decoder_agrees_with_pydantic_on_raw_json_oddities
  tests/collector/test_collector_fastwire.py::test_fast_decoder_agrees_on_every_timestamp_form
  tests/collector/test_collector_admission.py::test_probe_traffic_is_uploads_heartbeats_schedules_and_enrollment
  tests/collector/test_collector_admission.py::test_admission_limits_are_validated
  tests/collector/test_collector_db_overload.py::test_pool_settings_are_validated
  tests/cost/test_cost_model.py
  tests/cost/test_cost_report.py
  tests/cost/test_cost_learned_windows.py
  tests/cost/test_cost_arms_lab.py::test_print_arms_names_policies_and_keeps_plain_ports
  tests/fairness/test_fairness_demo_lines.py
  tests/fairness/test_fairness_report.py
  tests/fairness/test_fairness_schedule.py::test_bad_offered_load_fields_are_refused_clearly
  tests/fairness/test_fairness_schedule.py::test_flow_role_of_a_url
  tests/fairness/test_fairness_schedule.py::test_background_warmup_is_ten_rtts_at_most_half_the_uncontended_run
  tests/probe/test_iwprobe_plan.py
  tests/probe/test_iwprobe_sizes.py
  tests/probe/test_iwprobe_spool.py
  tests/probe/test_iwprobe_agent.py
  tests/probe/test_iwprobe_tcpinfo.py
  tests/probe/test_iwprobe_iwinfer.py
  tests/probe/test_iwprobe_tap.py
  tests/probe/test_iwprobe_tls.py
  tests/probe/test_iwprobe_upload_retry_after.py
  tests/probe/test_iwprobe_standalone.py::test_sources_are_python_3_9_syntax
)
# Pure, but minutes of simulation (coverage of the paired intervals over many replications):
# left to `make test`.
SLOW=(
  --deselect tests/analysis/test_paired.py::test_paired_interval_covers_the_true_effect
  --deselect tests/analysis/test_paired.py::test_paired_interval_is_narrower_than_unpaired
  --deselect tests/analysis/test_paired.py::test_cell_estimator_covers_and_beats_independent_samples
)

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
.venv/bin/python -m pytest "${options[@]}" --junitxml="$junit" "${SLOW[@]}" "${UNIT_TESTS[@]}" "$@"
