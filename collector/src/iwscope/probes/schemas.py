"""Probe enrollment, heartbeat and schedule messages (mirrors of ``iwprobe.wire``), fleet listing."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from iwprobe import wire
from iwscope.wiretypes import NO_NUL, WIRE_MODEL_CONFIG, ArmLabel, Family, Iw, Port, WireUUID, WireVersion


class EnrollRequestIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.EnrollRequest`."""

    model_config = WIRE_MODEL_CONFIG

    name: Annotated[str, Field(min_length=1, max_length=200), NO_NUL]
    region: Annotated[str, Field(min_length=1, max_length=64), NO_NUL]
    country: Annotated[str, Field(pattern=r"^[A-Z]{2}$")] | None = None
    asn: Annotated[int, Field(ge=0, le=4_294_967_295)] | None = None
    labels: Annotated[dict[Annotated[str, NO_NUL], Annotated[str, Field(max_length=200), NO_NUL]], Field(max_length=32)] = {}
    version: Annotated[str, Field(max_length=64), NO_NUL] = ""


class EnrollResponseOut(BaseModel):
    """Mirror of :class:`iwprobe.wire.EnrollResponse`."""

    id: str
    credential: str


class HeartbeatIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.Heartbeat`."""

    model_config = WIRE_MODEL_CONFIG

    version: Annotated[str, Field(max_length=64), NO_NUL]
    spool_backlog: Annotated[int, Field(ge=0)]
    spool_bytes: Annotated[int, Field(ge=0)]
    uptime_s: Annotated[float, Field(ge=0, strict=False)]
    trials_measured: Annotated[int, Field(ge=0)]
    iw_capture: Annotated[str, Field(max_length=200), NO_NUL] = ""


class ArmPortModel(BaseModel):
    """Mirror of :class:`iwprobe.wire.ArmPort`."""

    model_config = WIRE_MODEL_CONFIG

    iw: Iw
    port: Port
    arm: ArmLabel = ""
    paced: bool = False


class ScheduleTargetOut(BaseModel):
    origin_id: str
    host: str
    arms: list[ArmPortModel]
    echo_port: int | None = None
    tls: bool = False
    host6: str | None = None


class CampaignScheduleOut(BaseModel):
    campaign_id: int
    name: str
    arms: list[int]
    sizes: list[int] | None
    size_dist: str | None
    sizes_per_round: int
    repetitions: int
    interval_s: float
    starts_at: str
    ends_at: str | None
    calibrate: bool
    targets: list[ScheduleTargetOut]
    arrival_rate_per_s: float | None = None
    background_bytes: int | None = None
    background_iw: int | None = None
    arm_labels: list[str] = []
    arm_shares: list[float] = []
    interactive_interval_us: int | None = None
    interactive_packet_bytes: int = 160
    page_connections: int | None = None
    family: Family = ""
    census_urls: list[str] = []
    #: Wire v7: the share of rounds the probe traces (``wire.CampaignSchedule.trace_share``).
    trace_share: float = 0.0


class ScheduleOut(BaseModel):
    """Mirror of :class:`iwprobe.wire.Schedule`."""

    wire_version: WireVersion = wire.WIRE_VERSION
    probe_id: WireUUID
    generated_at: str
    poll_after_s: float
    campaigns: list[CampaignScheduleOut]


class ProbeOut(BaseModel):
    """A probe in the fleet listing."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    region: str
    country: str | None
    asn: int | None
    labels: dict[str, Any]
    version: str
    enrolled_at: dt.datetime
    last_seen_at: dt.datetime | None
    revoked_at: dt.datetime | None
    #: ``spool_backlog`` of the last heartbeat (records the probe still has to upload).
    backlog: int | None
    last_heartbeat: dict[str, Any] | None
