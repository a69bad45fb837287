"""The declared host of a lab topology (name, role, region, labels and access link) and the
host as one run placed it.

A spec (:class:`Host`) is what a scenario (or a caller) says about a host; it carries no
runtime placement.  The namespace, devices and addresses are chosen when a
:class:`~iwscope_lab.topology.Topology` places the host (:class:`PlacedHost`, also exported by
``topology``).  Keeping both here lets ``scenarios`` build hosts without importing
``topology`` (which imports ``scenarios``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .links import LinkSpec

__all__ = ["Host", "PlacedHost", "HOST_NAME_RE", "MAX_USERS"]

#: Host names: short enough that ``<run>-<host>`` is a valid namespace name.
HOST_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,30}$")
#: User addresses one host may have (a run has at most as many in total).
MAX_USERS = 1024


@dataclass
class Host:
    """A named host of a topology: one network namespace behind one emulated access link."""

    name: str
    role: str = "probe"
    region: str | None = None
    link: LinkSpec = field(default_factory=LinkSpec)
    labels: dict[str, str] = field(default_factory=dict)
    #: Extra client addresses behind this host's link, one /24 each (emulated users; see
    #: addressing.py for the plan).  0: none, the host has only its own address.
    users: int = 0

    def __post_init__(self) -> None:
        if not HOST_NAME_RE.match(self.name) or self.name == "core":
            raise ValueError(f"host name {self.name!r}: use 1-31 of [a-z0-9_.-], not 'core'")
        if isinstance(self.users, bool) or not isinstance(self.users, int) or not 0 <= self.users <= MAX_USERS:
            raise ValueError(f"host {self.name}: users={self.users!r} must be an integer within 0-{MAX_USERS}")


@dataclass
class PlacedHost:
    """A host spec placed in one run: its namespace, devices and (once up) addresses.

    ``name``, ``role``, ``region``, ``labels`` and ``link`` are the spec's: :meth:`iwscope_lab.topology.Topology.set_link`
    replaces the spec's link, so a caller holding the :class:`Host` sees the link the run has.
    """

    spec: Host
    index: int
    netns: str
    device: str
    core_device: str
    address: str = ""
    core_address: str = ""
    #: IPv6 addresses in dual-stack runs ("" otherwise).
    address6: str = ""
    core_address6: str = ""
    #: The host's user addresses (``spec.users`` of them, one /24 each; /48s in ``user_addresses6``
    #: in dual-stack runs), on the namespace's ``lo`` and routed to this host's link by the core.
    user_addresses: list[str] = field(default_factory=list)
    user_addresses6: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> str:
        return self.spec.role

    @property
    def region(self) -> str | None:
        return self.spec.region

    @property
    def labels(self) -> dict[str, str]:
        return self.spec.labels

    @property
    def users(self) -> int:
        return self.spec.users

    @property
    def user_prefixes(self) -> list[str]:
        """The /24 of each user address (same order)."""
        return [address.rsplit(".", 1)[0] + ".0/24" for address in self.user_addresses]

    @property
    def link(self) -> LinkSpec:
        return self.spec.link

    @link.setter
    def link(self, spec: LinkSpec) -> None:
        self.spec.link = spec

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": self.name,
            "role": self.role,
            "region": self.region,
            "labels": dict(self.labels),
            "netns": self.netns,
            "address": self.address,
            "address6": self.address6,
            "device": self.device,
            "core_device": self.core_device,
            "link": self.link.to_dict(),
        }
        if self.users:  # only then: hosts without users describe themselves as before
            described.update(
                users=self.users, user_addresses=list(self.user_addresses), user_addresses6=list(self.user_addresses6)
            )
        return described


def probes_per_rtt(rtts_ms: tuple[int, ...], rate_bps: float, region: str) -> list[Host]:
    """One probe per RTT (``rtt<N>``, labelled ``rtt_ms``) on symmetric links of ``rate_bps``:
    the reproduction experiments' sweep of paths."""
    return [
        Host(
            f"rtt{rtt}",
            role="probe",
            region=region,
            link=LinkSpec.symmetric(rate_bps=rate_bps, rtt_ms=rtt),
            labels={"rtt_ms": str(rtt)},
        )
        for rtt in rtts_ms
    ]
