"""Lab scenarios: YAML files naming hosts and their access links, checked on load.

A scenario has ``hosts`` (each with a ``link``) and/or a ``sweep`` that expands into one probe
per value.  A link gives symmetric defaults (``rate``, ``rtt_ms`` split evenly, ``loss`` per
direction, ``buffer_bytes`` ...) and optional ``down`` / ``up`` overrides for asymmetric
access links (``down`` = towards the host).  Rates are bit/s numbers or strings like
``56k``, ``1.2M``, ``1G``.  The probe -> origin round trip is the sum of both hosts'
``rtt_ms`` (origins get zero-delay links).  ``dual_stack: true`` gives every host an IPv6
address too.  A host's ``users: N`` gives it N extra client addresses, one /24 each, behind its
link (emulated users of a passive study: role ``users``, served by a host of role ``server``,
e.g. the ``passive`` scenario).  See docs/lab.md.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from ..hostspec import MAX_USERS, Host
from ..links import DirectionSpec, LinkSpec, format_rate, parse_rate

__all__ = ["Scenario", "ScenarioError", "load_scenario", "scenario_names", "FIGURE5_BUCKETS", "bucket_of"]

#: Upper edges of the buckets of the IW10 paper's Figure 5 (the last bucket is "above").
FIGURE5_BUCKETS: dict[str, list[float]] = {
    "rtt_ms": [20, 50, 100, 200, 500, 1000, 3000],
    "rate_kbps": [56, 256, 512, 1000, 3000, 5000, 10000],
    "bdp_bytes": [1000, 5000, 10000, 50000, 100000],
}


def bucket_of(value: float, edges: list[float]) -> int:
    """Index of the Figure-5 bucket holding ``value`` (``len(edges)`` = above the last edge)."""
    for index, edge in enumerate(edges):
        if value <= edge:
            return index
    return len(edges)


class ScenarioError(ValueError):
    """A scenario file is missing or does not match the schema; the message names the field."""


Rate = str | float | int | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DirectionModel(_Strict):
    rate: Rate = None
    delay_ms: float | None = Field(default=None, ge=0)
    loss: float | None = Field(default=None, ge=0, le=1)
    loss_model: Literal["bernoulli", "gilbert"] | None = None
    buffer_bytes: int | None = Field(default=None, ge=1)
    buffer_packets: int | None = Field(default=None, ge=1)
    jitter_ms: float | None = Field(default=None, ge=0)
    ge_p: float | None = Field(default=None, ge=0, le=1)
    ge_r: float | None = Field(default=None, ge=0, le=1)
    ge_loss_good: float | None = Field(default=None, ge=0, le=1)
    ge_loss_bad: float | None = Field(default=None, ge=0, le=1)
    ge_burst_packets: float | None = Field(default=None, ge=1)

    @field_validator("rate")
    @classmethod
    def _rate(cls, value: Rate) -> Rate:
        parse_rate(value)
        return value


class LinkModel(DirectionModel):
    rtt_ms: float = Field(default=0.0, ge=0)
    down: DirectionModel | None = None
    up: DirectionModel | None = None

    @model_validator(mode="after")
    def _no_delay_at_top(self) -> LinkModel:
        if self.delay_ms is not None:
            raise ValueError("use rtt_ms for a symmetric link, or delay_ms inside down/up")
        return self

    def to_spec(self) -> LinkSpec:
        base: dict[str, Any] = {"rate_bps": parse_rate(self.rate), "delay_ms": self.rtt_ms / 2.0}
        for name in (
            "loss",
            "loss_model",
            "buffer_bytes",
            "buffer_packets",
            "jitter_ms",
            "ge_p",
            "ge_r",
            "ge_loss_good",
            "ge_loss_bad",
            "ge_burst_packets",
        ):
            value = getattr(self, name)
            if value is not None:
                base[name] = value
        directions = []
        for override in (self.down, self.up):
            values = dict(base)
            if override is not None:
                for name, value in override.model_dump(exclude_none=True).items():
                    values["rate_bps" if name == "rate" else name] = parse_rate(value) if name == "rate" else value
            directions.append(DirectionSpec(**values))
        return LinkSpec(down=directions[0], up=directions[1])


class HostModel(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,30}$")
    #: ``origin`` / ``probe``: an iwprobe campaign; ``server`` / ``users``: an unmodified web
    #: server and hosts of emulated users (webserver.py, users.py).
    role: Literal["origin", "probe", "server", "users"] = "probe"
    region: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    link: LinkModel = Field(default_factory=LinkModel)
    #: Extra client addresses behind the host's link, one /24 each (topology.py).
    users: int = Field(default=0, ge=0, le=MAX_USERS)


class SweepModel(_Strict):
    parameter: Literal["rtt_ms", "rate"]
    values: list[float | str] = Field(min_length=1)
    #: Host name per value, ``{value}`` replaced by the value as written (lower case).
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.{}-]{0,30}$")
    region: str | None = None
    base: LinkModel

    @model_validator(mode="after")
    def _values(self) -> SweepModel:
        if "{value}" not in self.name:
            raise ValueError("name must contain {value}")
        for value in self.values:
            if self.parameter == "rate":
                parse_rate(value)
            elif not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"rtt_ms value {value!r} must be a number >= 0")
        return self


class ScenarioModel(_Strict):
    name: str
    description: str = ""
    #: Every host also gets an IPv6 address and route (:class:`~iwscope_lab.topology.Topology`).
    dual_stack: bool = False
    hosts: list[HostModel] = Field(default_factory=list)
    sweep: SweepModel | None = None

    @model_validator(mode="after")
    def _hosts(self) -> ScenarioModel:
        names = [host.name for host in self.hosts]
        if self.sweep is not None:
            names += [self.sweep.name.replace("{value}", str(value).lower()) for value in self.sweep.values]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate host names: {', '.join(duplicates)}")
        if not any(host.role in ("origin", "server") for host in self.hosts):
            raise ValueError("a scenario needs at least one host with role: origin (or server)")
        if len(names) < 2:
            raise ValueError("a scenario needs an origin and at least one probe")
        return self


class Scenario:
    """A loaded, checked scenario."""

    def __init__(self, model: ScenarioModel, source: str) -> None:
        self.model = model
        self.name = model.name
        self.description = model.description
        self.dual_stack = model.dual_stack
        self.source = source

    def hosts(self) -> list[Host]:
        """The declared hosts (specs: a :class:`~iwscope_lab.topology.Topology` places them)."""
        hosts = [
            Host(h.name, role=h.role, region=h.region, link=h.link.to_spec(), labels=dict(h.labels), users=h.users)
            for h in self.model.hosts
        ]
        sweep = self.model.sweep
        if sweep is not None:
            for value in sweep.values:
                base = sweep.base.model_copy(update={sweep.parameter: value})
                hosts.append(
                    Host(
                        sweep.name.replace("{value}", str(value).lower()),
                        role="probe",
                        region=sweep.region,
                        link=base.to_spec(),
                        labels={"sweep": sweep.parameter, "value": str(value)},
                    )
                )
        return hosts

    def path_summary(self) -> list[dict[str, Any]]:
        """Every probe's (and users host's) path to the first origin (or, without one, the first
        server): RTT, downlink rate, BDP, loss, Figure-5 buckets; ``users`` for hosts with users."""
        hosts = self.hosts()
        origin = next((host for host in hosts if host.role == "origin"), None)
        origin = origin or next(host for host in hosts if host.role == "server")
        rows = []
        for host in hosts:
            if host.role not in ("probe", "users"):
                continue
            rtt_ms = host.link.rtt_ms + origin.link.rtt_ms
            rates = [r for r in (host.link.down.rate_bps, origin.link.up.rate_bps) if r]
            rate = min(rates) if rates else math.inf
            bdp = rate / 8 * rtt_ms / 1000
            rows.append(
                {
                    "host": host.name,
                    "region": host.region,
                    "rtt_ms": rtt_ms,
                    "rate_bps": rate,
                    "rate": format_rate(rate if rates else None),
                    "bdp_bytes": bdp,
                    "loss_down": host.link.down.loss,
                    "buckets": {
                        "rtt_ms": bucket_of(rtt_ms, FIGURE5_BUCKETS["rtt_ms"]),
                        "rate_kbps": bucket_of(rate / 1000, FIGURE5_BUCKETS["rate_kbps"]),
                        "bdp_bytes": bucket_of(bdp, FIGURE5_BUCKETS["bdp_bytes"]),
                    },
                }
                | ({"users": host.users} if host.users else {})
            )
        return rows


def _directory() -> Path:
    return Path(str(resources.files(__package__)))


def scenario_names() -> list[str]:
    """Names of the scenarios shipped with the lab."""
    return sorted(path.stem for path in _directory().glob("*.yaml"))


def _format_error(error: ErrorDetails) -> str:
    location = ".".join(str(part) for part in error["loc"]) or "(top level)"
    return f"{location}: {error['msg']}"


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load and check a scenario by name (shipped) or path; ScenarioError names every bad field."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        path = candidate
    else:
        path = _directory() / f"{name_or_path}.yaml"
        if not path.exists():
            raise ScenarioError(f"no scenario {name_or_path!r}; known: {', '.join(scenario_names())}")
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"scenario file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario {path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {path}: expected a mapping at the top level")
    try:
        model = ScenarioModel.model_validate(data)
    except ValidationError as exc:
        details = "; ".join(_format_error(error) for error in exc.errors())
        raise ScenarioError(f"scenario {path}: {details}") from None
    try:
        scenario = Scenario(model, str(path))
        scenario.hosts()
    except ValueError as exc:
        raise ScenarioError(f"scenario {path}: {exc}") from None
    return scenario
