"""Each package's public surface, pinned (after httpx's tests/test_exported_members.py).

What other packages and users may import is listed here by name.  Adding a name to a package's
``__all__`` or removing one fails this test until the list below changes with it -- in the same
commit, where a reviewer sees the contract move.  Names a module defines without an underscore
must be exported (or renamed private), so nothing public-looking is public by accident.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import types

import pytest

PUBLIC: dict[str, list[str]] = {
    "iwprobe": [
        "Arm",
        "BACKGROUND_WARMUP_RTTS",
        "CensusResult",
        "CollectorClient",
        "CollectorError",
        "ConnectionCapture",
        "FetchResult",
        "Inference",
        "Origin",
        "OriginConfig",
        "Packet",
        "ProbeAgent",
        "RoutePlan",
        "Spool",
        "SpoolFull",
        "Uploader",
        "__version__",
        "capture_status",
        "census",
        "fetch",
        "infer",
        "parse_arms",
        "parse_tcp_info",
        "read_tcp_info",
        "setup_routes",
        "sizes",
        "wire",
    ],
    "iwprobe.wire": [
        "ACCEPTED_WIRE_VERSIONS",
        "API_PREFIX",
        "ARM_LABEL_PATTERN",
        "ArmPort",
        "CLIENT_PREFIX_HEX_CHARS",
        "CREDENTIAL_SEPARATOR",
        "CampaignSchedule",
        "CensusRecord",
        "ClientIw",
        "DEFAULT_ARM",
        "DEFAULT_PREFIX_V4",
        "DEFAULT_PREFIX_V6",
        "ECHO_MAGIC",
        "ERROR_KINDS",
        "EchoStats",
        "EnrollRequest",
        "EnrollResponse",
        "FAMILIES",
        "FLOW_FRAGMENT_BACKGROUND",
        "FLOW_FRAGMENT_BACKGROUND_ALONE",
        "FLOW_FRAGMENT_PREFIX",
        "FLOW_ROLES",
        "HIST_BINS",
        "HIST_MIN_US",
        "HIST_RATIO",
        "Heartbeat",
        "IW_STATUSES",
        "LEARNED_BASE_IW",
        "MAX_BATCH_RECORDS",
        "MAX_BODY_BYTES",
        "MAX_CENSUS_URLS",
        "MAX_CENSUS_URL_CHARS",
        "MAX_ECHO_PACKET_BYTES",
        "MAX_ECHO_SAMPLES",
        "MAX_IW_REASON_CHARS",
        "MAX_IW_SEGMENTS",
        "MAX_OBJECT_BYTES",
        "MAX_TRACES_PER_BATCH",
        "MAX_TRACE_PACKETS",
        "MAX_PASSIVE_ARMS",
        "MAX_PASSIVE_IW",
        "MAX_PASSIVE_PORTS",
        "MAX_SIZE_OCTAVE",
        "MAX_TLS_VERSION_CHARS",
        "MIN_ECHO_PACKET_BYTES",
        "OBJECT_PATH_PREFIX",
        "OBSERVATIONS_BATCH_PATH",
        "ORIGIN_ENROLL_PATH",
        "ObservationBatch",
        "OriginEnrollRequest",
        "OriginObservation",
        "PASSIVE_ARM_PATTERN",
        "PASSIVE_BANDWIDTH_EDGES_BPS",
        "PASSIVE_BATCH_PATH",
        "PASSIVE_BDP_EDGES_BYTES",
        "PASSIVE_CLUSTER_GROUPS",
        "PASSIVE_PORT_KINDS",
        "PASSIVE_PREFIX_V4_RANGE",
        "PASSIVE_PREFIX_V6_RANGE",
        "PASSIVE_RTT_EDGES_MS",
        "PASSIVE_SHARE_SCALE",
        "PROBE_ENROLL_PATH",
        "PROBE_HEADER",
        "PROBE_HEARTBEAT_PATH",
        "PROBE_SCHEDULE_PATH",
        "PROTOCOLS",
        "PassiveAggregate",
        "PassiveArm",
        "PassiveBatch",
        "PassiveConnection",
        "PassiveStudy",
        "PathSample",
        "QUIC_MIN_DATAGRAM_BYTES",
        "SCHEMA_FILE",
        "SEGMENTATION_OFFLOADS",
        "SEND_PATHS",
        "SERVER_CONFIG_PATH",
        "SERVER_ENROLL_PATH",
        "SIZE_DISTRIBUTIONS",
        "Schedule",
        "ScheduleTarget",
        "ServerConfig",
        "ServerEnrollRequest",
        "ServerHeartbeat",
        "TCP_INFO_FIELDS",
        "TRACES_BATCH_PATH",
        "TRACE_COLUMNS",
        "TRACE_FLIGHT_FIELDS",
        "TRACE_HEADER",
        "TRACE_OPTIONAL_INTS",
        "TRACE_SIDES",
        "TRACE_VERSION",
        "TRIALS_BATCH_PATH",
        "TRIAL_HEADER",
        "TraceBatch",
        "TraceRecord",
        "TrialBatch",
        "TrialRecord",
        "UploadResult",
        "WIRE_VERSION",
        "arm_label_iw",
        "arm_label_protocol",
        "bucket_index",
        "check_trace",
        "dumps",
        "flow_role",
        "hist_bin",
        "is_plain_arm",
        "load_schema",
        "new_id",
        "parse_timestamp",
        "size_octave",
        "tcp_arm_label",
        "to_dict",
        "utc_timestamp",
    ],
    "iwscope.analysis": [
        "ArmFit",
        "ArmPercentiles",
        "ArmStats",
        "BucketComparison",
        "BucketModelFit",
        "CensusDay",
        "CensusTarget",
        "CostCampaign",
        "CostFlows",
        "CostInteractive",
        "CostInterference",
        "CostReport",
        "FairnessPoint",
        "FilterOptions",
        "Filters",
        "Headline",
        "IwAnswer",
        "LossBucket",
        "Metric",
        "ModelFit",
        "PASSIVE_DIMENSIONS",
        "PassiveDimension",
        "PassiveFilters",
        "PathInputs",
        "PathIwCheck",
        "PathModelFit",
        "PercentileTable",
        "ProbeRow",
        "RefreshResult",
        "RegionSummary",
        "arm_order",
        "census_series",
        "census_targets",
        "compare_by",
        "compare_many",
        "cost",
        "fairness",
        "filter_options",
        "fleet",
        "headline",
        "iter_trials_csv",
        "iw_check",
        "latency_cdf",
        "latency_vs_iw",
        "loss_summary",
        "model_fit",
        "passive_buckets",
        "passive_campaigns",
        "passive_days",
        "passive_filter_options",
        "passive_load",
        "passive_regions",
        "passive_share_sweep",
        "passive_summary",
        "percentile_table",
        "rebuild_rollups",
        "refresh_rollups",
        "region_summary",
        "reset_rollups",
        "tls_by_flight",
        "trial_near",
        "trials_page",
        "used_arms",
    ],
    "iwscope.exports": [
        "ExportFilters",
        "FORMATS",
        "TABLES",
        "TableSpec",
        "iter_parquet",
        "write_csv",
        "write_parquet",
    ],
    "iwscope.model": [
        "BBR_CWND_MIN",
        "BurstQueue",
        "CHANGE_CIPHER_SPEC_RECORD_BYTES",
        "CONGESTION_CONTROLS",
        "CLIENT_HELLO_BYTES",
        "CUBIC_BETA",
        "CongestionControl",
        "CsaEstimate",
        "DEFAULT_MSS",
        "DEFAULT_SAMPLES",
        "DUPTHRESH",
        "Drop",
        "ECDSA_P256_SIGNATURE_BYTES",
        "HANDSHAKE_HEADER_BYTES",
        "HEADER_BYTES",
        "HTTP_HEADER_BYTES",
        "HTTP_REQUEST_BYTES",
        "INITIAL_RTO_S",
        "LossPrediction",
        "OPENSSL_FIRST_WRITE_BYTES",
        "Prediction",
        "QUANTILES",
        "QUIC_DATAGRAM_BYTES",
        "QUIC_STREAM_PAYLOAD_BYTES",
        "RTO_MAX_S",
        "RTO_MIN_S",
        "SYNACK_TIMER_FIRST",
        "SYN_BYTES",
        "Spread",
        "TIMER_MIN_S",
        "TLS12_CLIENT_FINISHED_FLIGHT_BYTES",
        "TLS12_SERVER_FINISHED_FLIGHT_BYTES",
        "TLS12_SERVER_HELLO_BYTES",
        "TLS12_SERVER_HELLO_DONE_BYTES",
        "TLS12_SERVER_KEY_EXCHANGE_BYTES",
        "TLS13_ENCRYPTED_EXTENSIONS_BYTES",
        "TLS13_RECORD_PROTECTION_BYTES",
        "TLS13_SERVER_HELLO_BYTES",
        "TLS13_SESSION_TICKETS_BYTES",
        "TLS_MAX_RECORD_PLAINTEXT",
        "TLS_RECORD_HEADER_BYTES",
        "Trial",
        "congestion_control",
        "csa_latency",
        "explain_gap",
        "first_flight_queue",
        "predict",
        "predict_appconnect",
        "predict_h3_total",
        "predict_https_total",
        "predict_quic_saving",
        "predict_with_loss",
        "quic_handshake_rounds",
        "rto_after_handshake_s",
        "simulate_connection",
        "slow_start_rounds",
        "tls_first_flight_bytes",
        "tls_handshake_rounds",
        "tls_response_bytes",
    ],
    "iwscope_dashboard": [
        "create_app",
    ],
}
#: Helpers a module imports for its own use (typing, dataclasses): not part of any surface.
IMPORTED_HELPERS = {"annotations", "Any", "Optional", "dataclass", "field"}
#: Console scripts and ``iwscope`` command plugins: the command-line surface.
ENTRY_POINTS = {
    ("console_scripts", "iwprobe"): "iwprobe.__main__:main",
    ("console_scripts", "iwscope"): "iwscope.cli:main",
    ("iwscope.commands", "dashboard"): "iwscope_dashboard.cli:dashboard",
    ("iwscope.commands", "lab"): "iwscope_lab.cli:lab",
    ("iwscope.commands", "trace"): "iwscope_dashboard.trace_cli:trace",
}


@pytest.mark.unit
@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_exported_names_are_the_pinned_ones(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = sorted(module.__all__)
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ repeats a name"
    added = sorted(set(exported) - set(PUBLIC[module_name]))
    removed = sorted(set(PUBLIC[module_name]) - set(exported))
    assert not added and not removed, f"{module_name}: exported now {added}, no longer {removed}: update PUBLIC with the change"


@pytest.mark.unit
@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_every_exported_name_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module_name} exports names it cannot give: {missing}"


@pytest.mark.unit
@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_nothing_public_looking_is_left_unexported(module_name: str) -> None:
    module = importlib.import_module(module_name)
    stray = sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and name not in module.__all__
        and name not in IMPORTED_HELPERS
        and not isinstance(value, types.ModuleType)
    )
    assert not stray, f"{module_name} defines public-looking names it does not export: {stray} (export or rename with _)"


@pytest.mark.unit
def test_commands_are_the_pinned_entry_points() -> None:
    points = {
        (point.group, point.name): point
        for group in ("console_scripts", "iwscope.commands")
        for point in importlib.metadata.entry_points(group=group)
        if point.value.split(".")[0] in {"iwprobe", "iwscope", "iwscope_dashboard", "iwscope_lab"}
    }
    found = {key: point.value for key, point in points.items()}
    assert found == ENTRY_POINTS, "entry points differ from the pins: run make setup after a pull, or update ENTRY_POINTS"
    # Each one loads (console scripts too): its module imports and the name is a callable.
    not_callable = [key for key, point in points.items() if not callable(point.load())]
    assert not not_callable, f"pinned entry points that do not load a callable: {not_callable}"
