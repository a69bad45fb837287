"""Server enrollment and configuration (mirrors of ``iwprobe.wire``, wire v6) and the fleet listing."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, Field

from iwprobe import wire
from iwscope.passive.schemas import PassiveArmIn
from iwscope.wiretypes import (
    NO_NUL,
    WIRE_MODEL_CONFIG,
    AssignmentSeed,
    FlushInterval,
    Phase,
    Port,
    PrefixV4,
    PrefixV6,
    SampleShare,
    WireUUID,
    WireVersion,
)

#: A server's ports: at most ``wire.MAX_PASSIVE_PORTS``.
Ports = Annotated[list[Port], Field(max_length=wire.MAX_PASSIVE_PORTS)]


class ServerEnrollRequestIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.ServerEnrollRequest`."""

    model_config = WIRE_MODEL_CONFIG

    name: Annotated[str, Field(min_length=1, max_length=200), NO_NUL]
    region: Annotated[str, Field(min_length=1, max_length=64), NO_NUL]
    ports: Ports = []
    version: Annotated[str, Field(max_length=64), NO_NUL] = ""
    kernel: Annotated[str, Field(max_length=128), NO_NUL] = ""


class PassiveStudyOut(BaseModel):
    """Mirror of :class:`iwprobe.wire.PassiveStudy`: a passive campaign as one server runs it."""

    campaign_id: int
    name: str
    arms: Annotated[list[PassiveArmIn], Field(min_length=1, max_length=wire.MAX_PASSIVE_ARMS)]
    ports: Annotated[list[Port], Field(min_length=1, max_length=wire.MAX_PASSIVE_PORTS)]
    prefix_v4: PrefixV4
    prefix_v6: PrefixV6
    assignment_seed: AssignmentSeed
    starts_at: str
    ends_at: str
    sample_share: SampleShare
    flush_interval_s: FlushInterval = 60
    phase: Phase = 0


class ServerConfigOut(BaseModel):
    """Mirror of :class:`iwprobe.wire.ServerConfig`: the study in force for a server now, if any."""

    wire_version: WireVersion
    server_id: WireUUID
    generated_at: str
    poll_after_s: Annotated[float, Field(ge=0)]
    study: PassiveStudyOut | None = None


class ServerOut(BaseModel):
    """A server in the fleet listing (``GET /api/v1/servers``)."""

    id: str
    name: str
    region: str
    ports: list[int]
    version: str
    kernel: str
    enrolled_at: dt.datetime
    last_seen_at: dt.datetime | None
    revoked_at: dt.datetime | None
    #: The last :class:`iwprobe.wire.ServerHeartbeat` (arms state, connections seen, capture
    #: losses, spool backlog) with the time it was received.
    last_heartbeat: dict[str, Any] | None
