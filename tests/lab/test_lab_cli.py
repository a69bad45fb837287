"""``iwscope lab`` end to end: up / status --json / down, bad scenarios, selftest --json; the demo's
page check when the dashboard or Chromium is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import SchedulingNoise

from iwscope_lab.topology import STATE_ROOT

IWSCOPE = str(Path(sys.executable).with_name("iwscope"))


def _lab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IWSCOPE, "lab", *args], capture_output=True, text=True, timeout=timeout)


def test_up_status_down(run_id: str, tmp_path: Path) -> None:
    scenario = tmp_path / "asym.yaml"
    scenario.write_text(
        "name: asym\nhosts:\n  - {name: origin1, role: origin, link: {rate: 1G}}\n"
        "  - {name: probe1, region: test, link: {rate: 2M, rtt_ms: 80, up: {rate: 256k}}}\n"
    )
    try:
        up = _lab("up", str(scenario), "--run-id", run_id, "--json")
        assert up.returncode == 0, up.stderr
        status = _lab("status", "--run-id", run_id, "--json")
        assert status.returncode == 0, status.stderr
        (run,) = json.loads(status.stdout)["runs"]
        hosts = {host["name"]: host for host in run["hosts"]}
        assert hosts["probe1"]["role"] == "probe" and hosts["probe1"]["netns"] == f"{run_id}-probe1"
        assert hosts["probe1"]["address"].startswith("10.")
        assert hosts["probe1"]["link"]["down"]["rate_bps"] == 2e6
        assert hosts["probe1"]["link"]["up"]["rate_bps"] == 256e3
        assert hosts["probe1"]["link"]["up"]["delay_ms"] == 40
        assert "delivered_packets" in hosts["probe1"]["counters"]["down"]
        # The run outlives the `up` process (detached); `cleanup` without --all keeps it.
        assert run_id not in _lab("cleanup").stdout
        down = _lab("down", "--run-id", run_id)
        assert down.returncode == 0, down.stderr
        assert not (STATE_ROOT / run_id).exists()
        namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert run_id not in namespaces
    finally:
        if (STATE_ROOT / run_id).exists():
            _lab("down", "--run-id", run_id)


def test_up_with_bad_scenario_names_the_field(run_id: str, tmp_path: Path) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("name: bad\nhosts:\n  - {name: origin1, role: origin}\n  - {name: probe1, link: {rate: 2M, loss: 1.5}}\n")
    result = _lab("up", str(scenario), "--run-id", run_id)
    assert result.returncode != 0
    assert "hosts.1.link.loss" in result.stderr
    assert not (STATE_ROOT / run_id).exists()


def test_selftest_json_reports_configured_vs_measured() -> None:
    with SchedulingNoise() as noise:
        result = _lab(
            "selftest", "--rtt", "30", "--rate", "10M", "--loss", "0.02", "--duration", "1.5", "--handshakes", "15", "--json"
        )
    report = json.loads(result.stdout)
    # The exit status is the verdict of the accuracy checks, nothing else.  Whether every
    # check passes is a timing target (docs/lab.md, measured by hand): on a shared CI machine
    # one stalled handshake out of 15 can miss the p99 target, so it is not asserted here.
    assert result.returncode == (0 if all(report["checks"].values()) else 1), result.stderr
    assert set(report["checks"]) == {"rtt_p99_error_within_1ms", "rate_within_2pct", "loss_within_99pct_interval"}
    assert report["checks"]["rtt_p99_error_within_1ms"] == (report["rtt"]["p99_error_ms"] <= 1.0)
    assert report["rtt"]["samples"] == 15
    assert report["configured"]["rate_bps"] == 10e6
    # 1 ms, plus twice the p99 wake-up lateness measured meanwhile (a clean-clone CI run: p50
    # 31.021 ms on a box busy with the suite; as in test_lab_emulator_accuracy.py)
    assert abs(report["rtt"]["p50_ms"] - 30) <= 1.0 + 2 * noise.quantile_ms(0.99), (report["rtt"], noise.quantile_ms(0.99))
    assert abs(report["rate"]["emulator_error"]) <= 0.02
    assert report["loss"]["within_interval"]
    assert report["rate"]["emulator_cpu_percent"] > 0


def test_cleanup_removes_a_detached_run_whose_emulator_died(run_id: str) -> None:
    try:
        up = _lab("up", "avgdc", "--run-id", run_id, "--json")
        assert up.returncode == 0, up.stderr
        again = _lab("up", "avgdc", "--run-id", run_id, "--json")  # idempotent: adopts the live run
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["subnet"] == json.loads(up.stdout)["subnet"]
        state = json.loads((STATE_ROOT / run_id / "state.json").read_text())
        emulator_pid = state["emulators"]["probe1"]["pid"]
        os.kill(emulator_pid, signal.SIGKILL)
        status = json.loads(_lab("status", "--run-id", run_id, "--json").stdout)
        assert "broken" in status["runs"][0]
        removed = _lab("cleanup")
        assert run_id in removed.stdout, removed.stdout + removed.stderr
        assert not (STATE_ROOT / run_id).exists()
        assert run_id not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        if (STATE_ROOT / run_id).exists():
            _lab("down", "--run-id", run_id)


def test_iwscope_loads_without_the_dashboard() -> None:
    """The demo's page check imports the dashboard only when it runs."""
    code = "import sys; sys.modules['iwscope_dashboard'] = None; import iwscope_lab.cli, iwscope_lab.cli_campaign"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_demo_page_check_skips_without_the_dashboard_and_fails_in_one_sentence_without_chromium(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from iwscope_dashboard import pagecheck
    from iwscope_lab import cli_campaign

    monkeypatch.setitem(sys.modules, "iwscope_dashboard.pagecheck", None)  # not installed
    assert cli_campaign._check_pages("http://127.0.0.1:9/", None, no_cost=False, no_https=False) is None
    monkeypatch.setitem(sys.modules, "iwscope_dashboard.pagecheck", pagecheck)

    # in a process of its own: the dashboard tests' session-wide Playwright runs an event loop here
    missing = tmp_path / "no-chromium"
    code = (
        "import click, sys\n"
        "from iwscope_dashboard import pagecheck\n"
        "from iwscope_lab import cli_campaign\n"
        f"pagecheck.CHROMIUM = {str(missing)!r}\n"
        "try:\n"
        "    cli_campaign._check_pages('http://127.0.0.1:9/', None, no_cost=False, no_https=False)\n"
        "except click.ClickException as error:\n"
        "    sys.stdout.write(error.message)\n"
        "else:\n"
        "    sys.exit('no ClickException')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    message = done.stdout
    assert message.startswith(f"headless Chromium ({missing}) did not start: ") and "\n" not in message

    asked: list[tuple[frozenset[str], str | None]] = []

    def fake_check_pages(
        url: str, *, read_token: str | None, empty_allowed: frozenset[str], trial: str | None
    ) -> pagecheck.PageReport:
        asked.append((empty_allowed, trial))
        return pagecheck.PageReport(url)

    monkeypatch.setattr(pagecheck, "check_pages", fake_check_pages)
    traced = "0b6f1d38-6c1e-4c83-9f4e-2a1f7b9d0c55"
    assert cli_campaign._check_pages("http://127.0.0.1:9/", None, no_cost=True, no_https=True, trial=traced) is not None
    assert asked == [(pagecheck.DEMO_EMPTY | {"cost-bulk-graph", "tls-improvement-graph", "tls-means-graph"}, traced)]
