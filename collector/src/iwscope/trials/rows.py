"""How validated records become rows: the tables' column lists and each record as the JSON
object of its row.

:mod:`iwscope.trials.services` sends a group's rows as ONE JSON document per table and inserts
them with ``json_populate_recordset`` (the registry insert in the same statement), all in one
round trip: on a machine where a psycopg round trip costs 115-240 us of CPU, the COPY of before
(a registry insert, then a COPY of two round trips) cost more than the rows themselves
(docs/ingest-throughput.md).  Values are what the columns hold (``None`` for NULL, ``tcp_info``
and ``echo`` as objects for their ``jsonb`` columns); PostgreSQL parses each with the column
type's own input function, as COPY did.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import msgspec

from iwprobe import wire
from iwscope.trials import fastwire
from iwscope.trials.models import OBSERVATION_TCPI_COLUMNS, TRIAL_TCPI_COLUMNS, tcpi_column_name

TRIAL_WIRE_COLUMNS = (
    "trial_id",
    "started_at",
    "probe_id",
    "campaign_id",
    "origin_id",
    "round",
    "arm_iw",
    "object_size",
    "url",
    "dns_us",
    "connect_us",
    "ttfb_us",
    "total_us",
    "bytes_received",
    "http_status",
    "error_kind",
    "error_detail",
    "syn_retrans",
)
TRIAL_STAGE_COLUMNS = (
    TRIAL_WIRE_COLUMNS
    + tuple(tcpi_column_name(name) for name in TRIAL_TCPI_COLUMNS)
    + (
        "tcp_info",
        "arm",
        "role",
        "page_id",
        "echo",
        "tls_version",
        "tls_handshake_us",
        "family",
        "client_iw_status",
        "client_iw_segments",
        "client_iw_bytes",
        "client_iw_mss",
        "client_iw_reason",
    )
)
SAMPLE_COLUMNS = ("sample_id", "probe_id", "origin_id", "measured_at", "min_rtt_us", "bottleneck_bps", "transfer_bytes", "method")
OBSERVATION_WIRE_COLUMNS = (
    "trial_id",
    "origin_id",
    "arm_iw",
    "port",
    "client_addr",
    "object_size",
    "request_at",
    "first_byte_us",
    "response_latency_us",
    "snd_cwnd_at_accept",
    "cwnd_mismatch",
    "rwnd_limited",
    "peer_rwnd",
    "http_status",
    "error_kind",
    "arm",
    "tls_version",
    "tls_handshake_us",
    "tls_first_flight_bytes",
    "tls_flight_acked_us",
    "family",
    "send_path",
    "segmentation_offload",
)
OBSERVATION_STAGE_COLUMNS = (
    OBSERVATION_WIRE_COLUMNS + tuple(tcpi_column_name(name) for name in OBSERVATION_TCPI_COLUMNS) + ("tcp_info",)
)


def columns(names: Iterable[str]) -> str:
    return ", ".join(names)


def trial_record(trial: fastwire.FastTrial, started_at: str) -> dict[str, Any]:
    """One ``trials`` row (``TRIAL_STAGE_COLUMNS``) as the JSON object
    :data:`iwscope.trials.services` inserts (``json_populate_recordset``: one statement with the
    registry insert instead of an insert and a two-round-trip COPY).  The typed ``tcpi_*``
    columns are spelled out to save a loop per row; tests/collector/test_collector_group_writer.py
    checks that the keys are exactly ``TRIAL_STAGE_COLUMNS``.
    """
    tcp = trial.tcp_info
    get = tcp.get
    iw = trial.client_iw
    return {
        "trial_id": trial.trial_id,
        "started_at": started_at,
        "probe_id": trial.probe_id,
        "campaign_id": trial.campaign_id,
        "origin_id": trial.origin_id,
        "round": trial.round,
        "arm_iw": trial.arm_iw,
        "object_size": trial.object_size,
        "url": trial.url,
        "dns_us": trial.dns_us,
        "connect_us": trial.connect_us,
        "ttfb_us": trial.ttfb_us,
        "total_us": trial.total_us,
        "bytes_received": trial.bytes_received,
        "http_status": trial.http_status,
        "error_kind": trial.error_kind,
        "error_detail": trial.error_detail,
        "syn_retrans": trial.syn_retrans,
        "tcpi_rtt_us": get("rtt"),
        "tcpi_rttvar_us": get("rttvar"),
        "tcpi_min_rtt_us": get("min_rtt"),
        "tcpi_total_retrans": get("total_retrans"),
        "tcpi_segs_in": get("segs_in"),
        "tcpi_data_segs_in": get("data_segs_in"),
        "tcpi_rcv_space": get("rcv_space"),
        "tcpi_rcv_mss": get("rcv_mss"),
        "tcpi_bytes_received": get("bytes_received"),
        "tcp_info": tcp,
        "arm": None if wire.is_plain_arm(trial.arm, trial.arm_iw) else trial.arm,
        "role": wire.flow_role(trial.url, trial.role),
        "page_id": trial.page_id,
        "echo": None if trial.echo is None else msgspec.to_builtins(trial.echo),
        "tls_version": trial.tls_version or None,
        "tls_handshake_us": trial.tls_handshake_us,
        "family": trial.family or None,
        "client_iw_status": None if iw is None else iw.status,
        "client_iw_segments": None if iw is None else iw.segments,
        "client_iw_bytes": None if iw is None else iw.bytes,
        "client_iw_mss": None if iw is None else iw.mss,
        "client_iw_reason": None if iw is None else iw.reason or None,
    }


def utc_text(original: str, parsed: dt.datetime) -> str:
    """A validated timestamp as PostgreSQL reads it: the wire text itself when it is plain UTC
    (``...Z``, ASCII), else the instant converted to UTC (PostgreSQL refuses offsets beyond
    +-15:59, which Python accepts)."""
    if original[-1] == "Z" and original.isascii():
        return original
    return parsed.astimezone(dt.UTC).isoformat()


def observation_record(observation: fastwire.FastObservation, request_at: dt.datetime) -> dict[str, Any]:
    """One ``origin_observations`` row (``OBSERVATION_STAGE_COLUMNS``: values) as the JSON object
    :data:`iwscope.trials.services` inserts; ``request_at`` is the record's parsed ``request_at``
    (the record keeps the wire text)."""
    tcp_info = observation.tcp_info
    values = (
        observation.trial_id,
        observation.origin_id,
        observation.arm_iw,
        observation.port,
        observation.client_addr,
        observation.object_size,
        request_at,
        observation.first_byte_us,
        observation.response_latency_us,
        observation.snd_cwnd_at_accept,
        observation.cwnd_mismatch,
        observation.rwnd_limited,
        observation.peer_rwnd,
        observation.http_status,
        observation.error_kind,
        observation.arm or None,
        observation.tls_version or None,
        observation.tls_handshake_us,
        observation.tls_first_flight_bytes,
        observation.tls_flight_acked_us,
        observation.family or None,
        observation.send_path,  # NOT NULL: '' is "not said"
        observation.segmentation_offload,
        *(tcp_info.get(name) for name in OBSERVATION_TCPI_COLUMNS),
        tcp_info,
    )
    return dict(zip(OBSERVATION_STAGE_COLUMNS, values, strict=True))


def sample_record(sample: fastwire.FastPathSample, measured_at: dt.datetime) -> dict[str, Any]:
    """One ``path_samples`` row (``SAMPLE_COLUMNS``) as a JSON object."""
    values = (
        sample.sample_id,
        sample.probe_id,
        sample.origin_id,
        measured_at,
        sample.min_rtt_us,
        sample.bottleneck_bps,
        sample.transfer_bytes,
        sample.method,
    )
    return dict(zip(SAMPLE_COLUMNS, values, strict=True))
