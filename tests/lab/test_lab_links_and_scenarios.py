"""Link parameters, scenario files and the loss statistics (no namespaces needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from iwscope_lab.links import DirectionSpec, LinkSpec, parse_rate
from iwscope_lab.scenarios import FIGURE5_BUCKETS, ScenarioError, load_scenario, scenario_names
from iwscope_lab.selftest import binomial_interval

REQUIRED_SCENARIOS = {
    "avgdc",
    "slowdc",
    "africa",
    "south-america",
    "europe",
    "north-america",
    "asia",
    "satellite",
    "mobile-3g",
    "lan",
    "world",
    "demo",
    "sweep-rtt",
    "sweep-bandwidth",
}


@pytest.mark.parametrize(
    ("text", "expected"), [("56k", 56_000), ("1.2M", 1_200_000), ("1G", 1e9), ("100Mbit/s", 1e8), (512000, 512_000)]
)
def test_parse_rate(text: str | int, expected: float) -> None:
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["fast", "-1M", "0", "1.2X"])
def test_parse_rate_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(bad)


def test_direction_validation_names_every_bad_field() -> None:
    with pytest.raises(ValueError) as info:
        DirectionSpec(rate_bps=-5, delay_ms=-1, loss=1.5, buffer_packets=0)
    message = str(info.value)
    for field in ("rate_bps", "delay_ms", "loss", "buffer_packets"):
        assert field in message


def test_symmetric_splits_rtt_and_gilbert_is_derived_from_loss() -> None:
    spec = LinkSpec.symmetric(rate_bps=1e6, rtt_ms=70, loss=0.02, loss_model="gilbert")
    assert spec.down.delay_ms == spec.up.delay_ms == 35
    assert spec.rtt_ms == 70
    p, r, good, bad = spec.down.gilbert_parameters()
    assert p / (p + r) * bad + r / (p + r) * good == pytest.approx(0.02)
    settings = spec.emulator_settings()
    assert "down.loss_model=gilbert" in settings and "up.delay_ms=35.0" in settings


def test_binomial_interval_matches_normal_approximation() -> None:
    low, high = binomial_interval(20000, 0.01)
    mean, sd = 200, math.sqrt(20000 * 0.01 * 0.99)
    assert abs(low - (mean - 2.576 * sd)) <= 2 and abs(high - (mean + 2.576 * sd)) <= 2
    assert binomial_interval(1000, 0.0) == (0, 0)


def test_all_required_scenarios_load() -> None:
    assert set(scenario_names()) >= REQUIRED_SCENARIOS
    for name in REQUIRED_SCENARIOS:
        scenario = load_scenario(name)
        assert any(host.role == "origin" for host in scenario.hosts())
        assert any(host.role == "probe" for host in scenario.hosts())


def test_scenarios_say_what_the_issue_asks() -> None:
    paths = {row["host"]: row for row in load_scenario("avgdc").path_summary()}
    assert paths["probe1"]["rtt_ms"] == 70 and paths["probe1"]["rate_bps"] == 1.2e6
    africa = load_scenario("africa").path_summary()
    assert len(africa) >= 3
    assert all(
        300 <= row["rtt_ms"] <= 600 and 0.5e6 <= row["rate_bps"] <= 2e6 and 0.02 <= row["loss_down"] <= 0.05 for row in africa
    )
    assert [row["rtt_ms"] for row in load_scenario("sweep-rtt").path_summary()] == [20, 50, 100, 200, 500, 1000, 3000]
    bandwidths = [row["rate_bps"] for row in load_scenario("sweep-bandwidth").path_summary()]
    assert bandwidths == [56e3, 256e3, 512e3, 1e6, 3e6, 5e6, 10e6, 100e6]
    mobile = load_scenario("mobile-3g").hosts()[1]
    assert mobile.link.rtt_ms == 255 and mobile.link.down.jitter_ms > 0
    assert load_scenario("satellite").path_summary()[0]["rtt_ms"] == 600


def test_demo_covers_figure5_up_to_3_s_with_buffers_that_hold_an_iw16_burst() -> None:
    """The main job's scenario: every Figure 5 bucket except RTT > 3 s (its time box cannot fit it),
    two paths in the 1-3 s bucket, and no drop-tail buffer an IW16 burst overflows (that harm is
    a cost result; `world` keeps its 8 KB modem buffers)."""
    scenario = load_scenario("demo")
    demo = scenario.path_summary()
    assert max(row["rtt_ms"] for row in demo) <= 3000
    for quantity, edges in FIGURE5_BUCKETS.items():
        covered = {row["buckets"][quantity] for row in demo}
        missing = set(range(len(edges) + 1)) - covered
        assert missing == ({len(edges)} if quantity == "rtt_ms" else set()), (quantity, missing)
    slowest = len(FIGURE5_BUCKETS["rtt_ms"]) - 1
    assert sum(row["buckets"]["rtt_ms"] == slowest for row in demo) >= 2
    burst_bytes = 16 * 1500
    probes = [host for host in scenario.hosts() if host.role == "probe"]
    buffers = {host.name: (host.link.down.buffer_bytes, host.link.down.buffer_packets) for host in probes}
    assert all(
        (size is None or size >= burst_bytes) and (packets is None or packets >= 16) for size, packets in buffers.values()
    ), buffers
    world = {host.name: host.link.down.buffer_bytes for host in load_scenario("world").hosts()}
    assert world["na-dialup"] is not None and world["na-dialup"] < burst_bytes


def test_world_fills_every_figure5_bucket() -> None:
    rows = load_scenario("world").path_summary()
    for quantity, edges in FIGURE5_BUCKETS.items():
        covered = {row["buckets"][quantity] for row in rows}
        assert covered == set(range(len(edges) + 1)), quantity


def test_bad_scenario_error_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nhosts:\n  - {name: o, role: origin}\n  - {name: p, link: {rate: fast, rtt_ms: -3, colour: red}}\n"
    )
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "hosts.1.link.rate" in message and "hosts.1.link.rtt_ms" in message
    assert "hosts.1.link.colour" in message


def test_unknown_scenario_lists_known_ones() -> None:
    with pytest.raises(ScenarioError, match="avgdc"):
        load_scenario("atlantis")
