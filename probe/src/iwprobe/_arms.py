"""IW policies ("arms") an origin serves, their ports, marks and routing tables.

An arm is a *policy* for the first flight of a connection, named by a label:

``N``        IW ``N`` segments sent as the kernel sends them (a burst at line rate);
``Np``       IW ``N`` *paced*: the first window is spread evenly over the RTT the handshake
             measured ("initial spreading").  The kernel's own pacing never paces a
             connection's first 10 data segments, so the origin writes them itself (one
             MSS per write at RTT/N intervals, see :mod:`iwprobe._pacing`) and hands the
             rest to the kernel's internal pacing (``SO_MAX_PACING_RATE``);
``learned``  temporal sharing (RFC 9040, Riptide): a connection starts with the congestion
             window the last connection to the same client prefix (/24, /48) ended with,
             through a per-prefix ``initcwnd`` route (see :mod:`iwprobe._learned`); without
             a remembered value it starts with :data:`LEARNED_BASE_IW`.

Ports (``B`` = the base port): ``N`` keeps ``B + N`` (as before policies existed), ``Np`` is
``B + 1000 + N``, ``learned`` is ``B + 2000``.  ``iwprobe origin --print-arms`` prints them.

Marks and tables: ``N`` and ``Np`` share mark ``mark_base + N`` and table ``table_base + N``
(the same ``initcwnd``); ``learned`` has its own, ``+ 1001``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import wire

#: Largest IW of a plain arm (segments).
MAX_IW = 1000
#: Largest IW of a paced arm (its port must stay below the learned arm's).
MAX_PACED_IW = 999
PACED_PORT_OFFSET = 1000
LEARNED_PORT_OFFSET = 2000
#: Offset of the learned arm's mark, table and rule priority (above every plain IW).
LEARNED_SLOT = MAX_IW + 1
#: Initial window of a learned-arm connection to a prefix nothing is remembered for.
LEARNED_BASE_IW = wire.LEARNED_BASE_IW
#: Most segments a learned initial window may be (CDNs use up to 64-100).
LEARNED_CAP_IW = 64

POLICIES = ("fixed", "paced", "learned")


@dataclass(frozen=True)
class Arm:
    """One listener's policy."""

    #: ``"10"``, ``"10p"``, ``"learned"``.
    label: str
    #: The initial window the policy starts from (``learned``: the value used without history).
    iw: int
    policy: str

    @property
    def paced(self) -> bool:
        return self.policy == "paced"

    @property
    def slot(self) -> int:
        """Offset of the arm's mark, table and rule priority from their bases."""
        return LEARNED_SLOT if self.policy == "learned" else self.iw

    def port(self, base_port: int) -> int:
        if self.policy == "paced":
            return base_port + PACED_PORT_OFFSET + self.iw
        if self.policy == "learned":
            return base_port + LEARNED_PORT_OFFSET
        return base_port + self.iw

    def describe(self, base_port: int) -> dict[str, object]:
        """What ``--print-arms`` prints for this arm."""
        return {"arm": self.label, "iw": self.iw, "paced": self.paced, "policy": self.policy, "port": self.port(base_port)}


def parse_arm(label: str, learned_base_iw: int = LEARNED_BASE_IW) -> Arm:
    """An :class:`Arm` from its label; ``ValueError`` says what is wrong."""
    text = label.strip().lower()
    iw = wire.arm_label_iw(text, learned_base_iw)  # the label grammar lives in the wire format
    if wire.arm_label_protocol(text) == "quic":
        raise ValueError(f"{label!r} is a QUIC arm: list its TCP arm ({wire.tcp_arm_label(text)}) and serve HTTP/3 with --quic")
    if text == "learned":
        return Arm("learned", learned_base_iw, "learned")
    if text.endswith("p"):
        if not 1 <= iw <= MAX_PACED_IW:
            raise ValueError(f"a paced arm's IW must be 1..{MAX_PACED_IW}, got {label!r}")
        return Arm(f"{iw}p", iw, "paced")
    if not 1 <= iw <= MAX_IW:
        raise ValueError(f"an IW must be 1..{MAX_IW}, got {label!r}")
    return Arm(str(iw), iw, "fixed")


def parse_arms(text: str | Sequence[object], learned_base_iw: int = LEARNED_BASE_IW) -> list[Arm]:
    """Arms from ``"3,10,10p,32,learned"`` (or a list of labels, ints or :class:`Arm`),
    deduplicated, in order: plain by IW, then paced by IW, then learned."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    parsed = (
        part if isinstance(part, Arm) else parse_arm(str(part), learned_base_iw)
        for part in parts
        if isinstance(part, Arm) or str(part).strip()
    )
    arms = {arm.label: arm for arm in parsed}
    if not arms:
        raise ValueError("at least one arm is needed")
    return sorted(arms.values(), key=lambda arm: (POLICIES.index(arm.policy), arm.iw))


def labels(arms: Sequence[Arm]) -> str:
    return ",".join(arm.label for arm in arms)


def arm_ports(arms: Sequence[Arm], base_port: int, quic: bool = False) -> list[wire.ArmPort]:
    """What an origin enrolls: every arm's listener, and with ``quic`` (wire v9) the QUIC arm
    ``Nq``/``Npq`` of every plain and paced one, on the same port number in UDP (the learned
    policy is a TCP route's)."""
    ports = [wire.ArmPort(arm.iw, arm.port(base_port), arm.label, arm.paced) for arm in arms]
    if quic:
        ports += [
            wire.ArmPort(arm.iw, arm.port(base_port), f"{arm.label}q", arm.paced) for arm in arms if arm.policy != "learned"
        ]
    return ports


__all__ = [
    "Arm",
    "parse_arm",
    "parse_arms",
    "labels",
    "arm_ports",
    "POLICIES",
    "MAX_IW",
    "MAX_PACED_IW",
    "PACED_PORT_OFFSET",
    "LEARNED_PORT_OFFSET",
    "LEARNED_SLOT",
    "LEARNED_BASE_IW",
    "LEARNED_CAP_IW",
]
