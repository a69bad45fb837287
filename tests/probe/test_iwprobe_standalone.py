"""The agent needs nothing but the standard library: zipapp in a bare venv, ``python -I``."""

from __future__ import annotations

import ast
import json
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from iwprobe_testkit import NetnsPair, wait_for_port

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "probe" / "src" / "iwprobe"


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """A fresh virtualenv without pip or any package, and the freshly built iwprobe.pyz."""
    root = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    pyz = root / "iwprobe.pyz"
    build = subprocess.run(
        ["sh", str(REPO / "probe" / "deploy" / "build-pyz.sh"), str(pyz)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
    )
    assert build.returncode == 0, build.stderr
    yield python, pyz


@pytest.mark.unit
def test_sources_are_python_3_9_syntax() -> None:
    for source in PACKAGE.glob("*.py"):
        ast.parse(source.read_text(encoding="utf-8"), filename=str(source), feature_version=(3, 9))


def test_only_the_standard_library_is_imported(bare_env: tuple) -> None:
    python, pyz = bare_env
    site = subprocess.run(
        [str(python), "-I", "-c", "import sys; print([p for p in sys.path if 'site-packages' in p])"],
        capture_output=True,
        text=True,
        check=True,
    )
    script = (
        "import sys, sysconfig\n"
        f"sys.path.insert(0, {str(pyz)!r})\n"
        "import iwprobe.__main__, iwprobe._agent, iwprobe._origin, iwprobe._fetch\n"
        "import iwprobe._spool, iwprobe._upload, iwprobe.sizes, iwprobe._census\n"
        "import iwprobe._quic  # the quic extra's module imports without it and says so\n"
        "assert not iwprobe._quic.quic_available()[0]\n"
        "stdlib = sysconfig.get_paths()['stdlib']\n"
        "bad = []\n"
        "for name, module in list(sys.modules.items()):\n"
        "    path = getattr(module, '__file__', None) or ''\n"
        "    if path and not (path.startswith(stdlib) or path.startswith(" + repr(str(pyz)) + ")):\n"
        "        bad.append((name, path))\n"
        "print(bad)\n"
    )
    outcome = subprocess.run([str(python), "-I", "-c", script], capture_output=True, text=True)
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.strip() == "[]", f"non-stdlib modules imported: {outcome.stdout}; site dirs {site.stdout}"
    listing = subprocess.run(
        [str(python), "-I", "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert listing.stdout.strip() == "[]"  # nothing installed in this venv at all
    quic = subprocess.run(
        [str(python), "-I", str(pyz), "fetch", "--quic", "https://127.0.0.1:1/obj/1"], capture_output=True, text=True
    )
    assert quic.returncode == 2 and "pip install 'iwprobe[quic]'" in quic.stderr, quic.stderr


def test_zipapp_fetches_from_a_zipapp_origin(bare_env: tuple, netns_pair: NetnsPair) -> None:
    python, pyz = bare_env
    origin = netns_pair.popen(
        netns_pair.origin_ns,
        [
            str(python),
            "-I",
            str(pyz),
            "origin",
            "--no-upload",
            "--setup-routes",
            "--arms",
            "3,10",
            "--base-port",
            "8200",
            "--bind",
            netns_pair.origin_address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(netns_pair, netns_pair.probe_ns, netns_pair.origin_address, 8210)
        fetched = netns_pair.run(
            netns_pair.probe_ns,
            [
                str(python),
                "-I",
                str(pyz),
                "fetch",
                "--arm",
                "10",
                f"http://{netns_pair.origin_address}/obj/20000",
                "--base-port",
                "8200",
                "--json",
            ],
        )
        assert fetched.returncode == 0, fetched.stderr
        trial = json.loads(fetched.stdout)
        assert trial["http_status"] == 200 and trial["error_kind"] is None
        assert trial["bytes_received"] > 20000 and trial["total_us"] > 0 and trial["tcp_info"]["rcv_mss"] > 500
        human = netns_pair.run(
            netns_pair.probe_ns, [str(python), "-I", str(pyz), "fetch", f"http://{netns_pair.origin_address}:8203/obj/100"]
        )
        assert "http_status:    200" in human.stdout and "time_total:" in human.stdout
        assert origin.stdout is not None
        observation = json.loads(origin.stdout.readline())
        assert observation["trial_id"] == trial["trial_id"] and observation["snd_cwnd_at_accept"] == 10
    finally:
        origin.terminate()
        origin.wait(timeout=10)
        for stream in (origin.stdout, origin.stderr):
            if stream is not None:
                stream.close()
