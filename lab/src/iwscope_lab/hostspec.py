"""The declared host of a lab topology: name, role, region, labels and access link.

A spec is what a scenario (or a caller) says about a host; it carries no runtime placement.
The namespace, devices and addresses are chosen when a :class:`~iwscope_lab.topology.Topology`
places the host (:class:`~iwscope_lab.topology.PlacedHost`).  Keeping the two apart lets
``scenarios`` build hosts without importing ``topology`` (which imports ``scenarios``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .links import LinkSpec

__all__ = ["Host", "HOST_NAME_RE"]

#: Host names: short enough that ``<run>-<host>`` is a valid namespace name.
HOST_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,30}$")


@dataclass
class Host:
    """A named host of a topology: one network namespace behind one emulated access link."""

    name: str
    role: str = "probe"
    region: str | None = None
    link: LinkSpec = field(default_factory=LinkSpec)
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not HOST_NAME_RE.match(self.name) or self.name == "core":
            raise ValueError(f"host name {self.name!r}: use 1-31 of [a-z0-9_.-], not 'core'")
