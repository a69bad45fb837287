"""Fixtures for the lab's tests: two-host topologies with real kernel sockets in namespaces.

Every namespace and device carries a test run id ``iwt<random>`` and is removed by the
fixture, also when the test fails.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest

from iwscope_lab.topology import Host, LinkSpec, Topology


@pytest.fixture
def run_id() -> str:
    return f"iwt{secrets.token_hex(3)}"


TwoHosts = Callable[[LinkSpec], Topology]


@pytest.fixture
def two_hosts(run_id: str) -> Iterator[TwoHosts]:
    """Factory: ``origin`` behind an unlimited zero-delay link, ``probe`` behind ``link``."""
    built: list[Topology] = []

    def build(link: LinkSpec, **kwargs: object) -> Topology:
        topo = Topology(
            f"{run_id}{len(built)}" if built else run_id,
            [Host("origin", role="origin", link=LinkSpec.symmetric()), Host("probe", role="probe", region="test", link=link)],
            **kwargs,
        )  # type: ignore[arg-type]
        built.append(topo)
        return topo.up()

    yield build
    for topo in built:
        topo.down()
