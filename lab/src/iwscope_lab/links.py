"""Link parameters: what one access link does to packets in each direction.

``down`` is towards the host (e.g. origin -> probe data), ``up`` is from the host.  The
emulator (``lab/emulator/iwemu``) applies, per direction: loss -> drop-tail buffer ->
serialisation at ``rate_bps`` (IP bytes) -> one-way ``delay_ms`` (+ jitter that never
reorders).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

LossModel = Literal["bernoulli", "gilbert"]

#: Mean burst length (packets) used to derive Gilbert-Elliott transition probabilities
#: from an average ``loss`` when ``ge_p`` / ``ge_r`` are not given.
DEFAULT_GE_BURST_PACKETS = 3.0

_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)(?:bit/s|bps|b)?\s*$")
_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(value: str | int | float | None) -> float | None:
    """``"1.2M"``, ``"56k"``, ``"1G"``, ``"100Mbit/s"`` or a number of bit/s -> bit/s (None = unlimited)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"rate {value!r}: expected bit/s or a string like '1.2M'")
    if isinstance(value, (int, float)):
        rate = float(value)
    else:
        match = _RATE_RE.match(value)
        if not match:
            raise ValueError(f"rate {value!r}: expected bit/s or a string like '56k', '1.2M', '1G'")
        rate = float(match.group(1)) * _RATE_UNITS[match.group(2).lower()]
    if rate <= 0:
        raise ValueError(f"rate {value!r}: must be positive (omit it for an unlimited link)")
    return rate


def format_rate(rate_bps: float | None) -> str:
    """Human form of a rate: ``1.2 Mbit/s``."""
    if rate_bps is None:
        return "unlimited"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if rate_bps >= scale:
            return f"{rate_bps / scale:g} {unit}"
    return f"{rate_bps:g} bit/s"


@dataclass(frozen=True)
class DirectionSpec:
    """One direction of an access link."""

    #: Bottleneck rate in bit/s of IP packets; None = unlimited (no serialisation delay).
    rate_bps: float | None = None
    #: One-way propagation delay, applied after serialisation.
    delay_ms: float = 0.0
    #: Loss probability (Bernoulli), or the average loss Gilbert-Elliott is derived from.
    loss: float = 0.0
    loss_model: LossModel = "bernoulli"
    #: Drop-tail buffer limits (packets waiting for or in serialisation); None = unlimited.
    buffer_bytes: int | None = None
    buffer_packets: int | None = None
    #: Standard deviation of a normal added to the delay; deliveries are never reordered
    #: (a packet leaves no earlier than the one before it).
    jitter_ms: float = 0.0
    #: Gilbert-Elliott: P(good->bad), P(bad->good) per packet and the loss in each state.
    #: When ge_p / ge_r are None they come from ``loss`` and ``ge_burst_packets``.
    ge_p: float | None = None
    ge_r: float | None = None
    ge_loss_good: float = 0.0
    ge_loss_bad: float = 1.0
    ge_burst_packets: float = DEFAULT_GE_BURST_PACKETS

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.rate_bps is not None and not self.rate_bps > 0:
            problems.append(f"rate_bps={self.rate_bps!r} must be > 0 or None")
        if not self.delay_ms >= 0:
            problems.append(f"delay_ms={self.delay_ms!r} must be >= 0")
        if not self.jitter_ms >= 0:
            problems.append(f"jitter_ms={self.jitter_ms!r} must be >= 0")
        for name in ("loss", "ge_loss_good", "ge_loss_bad"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                problems.append(f"{name}={value!r} must be within [0, 1]")
        for name in ("ge_p", "ge_r"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                problems.append(f"{name}={value!r} must be within [0, 1]")
        if self.loss_model not in ("bernoulli", "gilbert"):
            problems.append(f"loss_model={self.loss_model!r} must be 'bernoulli' or 'gilbert'")
        for name in ("buffer_bytes", "buffer_packets"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(f"{name}={value!r} must be a positive integer or None")
        if not self.ge_burst_packets >= 1:
            problems.append(f"ge_burst_packets={self.ge_burst_packets!r} must be >= 1")
        if problems:
            raise ValueError("invalid link direction: " + "; ".join(problems))

    def gilbert_parameters(self) -> tuple[float, float, float, float]:
        """(p, r, loss_good, loss_bad); derived so the stationary loss equals ``loss``."""
        if self.ge_p is not None and self.ge_r is not None:
            return self.ge_p, self.ge_r, self.ge_loss_good, self.ge_loss_bad
        if self.loss >= 1.0:
            return 1.0, 0.0, 1.0, 1.0
        r = 1.0 / self.ge_burst_packets
        # Stationary P(bad) = p / (p + r); with loss_bad = 1 and loss_good = 0 it is the loss.
        p = min(1.0, self.loss * r / (1.0 - self.loss))
        return p, r, 0.0, 1.0

    def emulator_settings(self, prefix: str) -> list[str]:
        """``prefix.key=value`` tokens for iwemu (prefix is ``down`` or ``up``)."""
        p, r, loss_good, loss_bad = self.gilbert_parameters()
        values: dict[str, Any] = {
            "rate": 0 if self.rate_bps is None else repr(float(self.rate_bps)),
            "delay_ms": repr(float(self.delay_ms)),
            "jitter_ms": repr(float(self.jitter_ms)),
            "loss_model": self.loss_model,
            "loss": repr(float(self.loss)),
            "ge_p": repr(p),
            "ge_r": repr(r),
            "ge_loss_good": repr(loss_good),
            "ge_loss_bad": repr(loss_bad),
            "buffer_bytes": self.buffer_bytes or 0,
            "buffer_packets": self.buffer_packets or 0,
        }
        return [f"{prefix}.{key}={value}" for key, value in values.items()]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DirectionSpec:
        return cls(**data)

    def with_changes(self, **changes: Any) -> DirectionSpec:
        return replace(self, **changes)


@dataclass(frozen=True)
class LinkSpec:
    """An access link: ``down`` = towards the host, ``up`` = from the host."""

    down: DirectionSpec = field(default_factory=DirectionSpec)
    up: DirectionSpec = field(default_factory=DirectionSpec)

    @classmethod
    def symmetric(
        cls,
        rate_bps: float | None = None,
        rtt_ms: float = 0.0,
        loss: float = 0.0,
        buffer_bytes: int | None = None,
        buffer_packets: int | None = None,
        jitter_ms: float = 0.0,
        loss_model: LossModel = "bernoulli",
    ) -> LinkSpec:
        """Same parameters both ways, the round trip split evenly (``rtt_ms / 2`` each way).

        ``loss`` applies to each direction.
        """
        direction = DirectionSpec(
            rate_bps=rate_bps,
            delay_ms=rtt_ms / 2.0,
            loss=loss,
            loss_model=loss_model,
            buffer_bytes=buffer_bytes,
            buffer_packets=buffer_packets,
            jitter_ms=jitter_ms,
        )
        return cls(down=direction, up=direction)

    @property
    def rtt_ms(self) -> float:
        """Round-trip propagation delay this link contributes."""
        return self.down.delay_ms + self.up.delay_ms

    def emulator_settings(self) -> list[str]:
        return self.down.emulator_settings("down") + self.up.emulator_settings("up")

    def to_dict(self) -> dict[str, Any]:
        return {"down": self.down.to_dict(), "up": self.up.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LinkSpec:
        return cls(down=DirectionSpec.from_dict(data["down"]), up=DirectionSpec.from_dict(data["up"]))
