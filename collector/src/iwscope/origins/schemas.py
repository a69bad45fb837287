"""Origin enrollment (mirror of ``iwprobe.wire.OriginEnrollRequest``) and listing."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from iwprobe import wire
from iwscope.probes.schemas import ArmPortModel
from iwscope.wiretypes import NO_NUL, WIRE_MODEL_CONFIG, Port


class OriginEnrollRequestIn(BaseModel):
    """Mirror of :class:`iwprobe.wire.OriginEnrollRequest`.

    A QUIC arm (wire v9: ``10q``, ``10pq``; HTTP/3 on the UDP port of the same number as its TCP
    arm) is an ordinary entry of ``arms``; it needs ``tls``, since HTTP/3 runs over TLS 1.3 only
    (an origin serving it has a certificate, and then serves HTTPS on every TCP arm too)."""

    model_config = WIRE_MODEL_CONFIG

    name: Annotated[str, Field(min_length=1, max_length=200), NO_NUL]
    region: Annotated[str, Field(min_length=1, max_length=64), NO_NUL]
    host: Annotated[str, Field(min_length=1, max_length=253), NO_NUL]
    arms: Annotated[list[ArmPortModel], Field(min_length=1, max_length=32)] = []
    version: Annotated[str, Field(max_length=64), NO_NUL] = ""
    echo_port: Port | None = None
    tls: bool = False
    host6: Annotated[str, Field(min_length=1, max_length=253), NO_NUL] | None = None

    @model_validator(mode="after")
    def _quic_needs_tls(self) -> OriginEnrollRequestIn:
        quic = [arm.arm for arm in self.arms if wire.arm_label_protocol(arm.arm) == "quic"]
        if quic and not self.tls:
            raise ValueError(f"arms {', '.join(quic)} are QUIC arms: HTTP/3 runs over TLS only, so the origin needs tls")
        return self


class OriginOut(BaseModel):
    id: str
    name: str
    region: str
    host: str
    arms: list[ArmPortModel]
    echo_port: int | None = None
    tls: bool = False
    host6: str | None = None
    version: str
    enrolled_at: dt.datetime
    last_seen_at: dt.datetime | None
    revoked_at: dt.datetime | None
