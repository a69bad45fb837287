"""Fixtures of the deploy tests; they reuse the chart renderer of tests/helm (one parser of the chart)."""

from __future__ import annotations

import json
import pathlib
import secrets
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "helm"))
# The images' lock reader (docker/lock_subset.py), one parser of requirements.lock for the image and its checks.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "docker"))

from chartrender import REPO
from kubeplay import podman
from lock_subset import canonical, read_lock
from testenv import temporary_database

#: The project's own distributions and their directories.
OWN_DISTRIBUTIONS = {"iwprobe": "probe", "iwscope-collector": "collector", "iwscope-dashboard": "dashboard"}
#: Build times and sizes of the images, for docs/deployment.md and the closing note.
IMAGES_ARTIFACT = REPO / "artifacts" / "deploy-images.json"


def own_versions() -> dict[str, str]:
    """The version of each of the project's distributions (its pyproject.toml)."""
    versions = {}
    for name, directory in OWN_DISTRIBUTIONS.items():
        with open(REPO / directory / "pyproject.toml", "rb") as handle:
            versions[name] = str(tomllib.load(handle)["project"]["version"])
    return versions


def differing_from_lock(freeze: str) -> list[str]:
    """The ``pip freeze`` lines that are not what requirements.lock (or, for the project's own
    distributions, their pyproject.toml) says."""
    expected = {**{name: version for name, (version, _) in read_lock(REPO / "requirements.lock").items()}, **own_versions()}
    differ = []
    for line in freeze.splitlines():
        name, _, version = line.partition("==")
        if not version:
            differ.append(f"{line} (not a pinned install)")
        elif expected.get(canonical(name)) != version:
            differ.append(f"{line} (lock: {expected.get(canonical(name), 'absent')})")
    return differ


@pytest.fixture(scope="module")
def empty_database_url() -> Iterator[str]:
    """A new, empty database (no schema) of the test server, dropped at the end."""
    with temporary_database(f"iwscope_deploy_{secrets.token_hex(4)}") as url:
        yield url


@dataclass
class Built:
    """An image built by podman: its tag, build time and size."""

    image: str
    build_s: float
    size_bytes: int


@pytest.fixture(scope="session")
def built_images() -> dict[str, Built]:
    """Both images, built by podman from the base ``scripts/image-base.sh`` makes (marker ``deploy``)."""
    base = subprocess.run([str(REPO / "scripts" / "image-base.sh")], capture_output=True, text=True, timeout=1800, check=False)
    assert base.returncode == 0, base.stderr[-3000:]
    base_image = base.stdout.strip().splitlines()[-1]
    built: dict[str, Built] = {}
    for name in ("collector", "probe"):
        tag = f"localhost/iwscope-{name}:check"
        started = time.monotonic()
        build = podman(
            "build",
            "--pull=never",
            "--layers=false",
            "-f",
            str(REPO / "docker" / f"{name}.Dockerfile"),
            "--ignorefile",
            str(REPO / "docker" / f"{name}.Dockerfile.dockerignore"),
            "--build-arg",
            f"PYTHON_IMAGE={base_image}",
            "-t",
            tag,
            str(REPO),
            timeout=1800,
        )
        assert build.returncode == 0, (build.stdout + build.stderr)[-5000:]
        seconds = time.monotonic() - started
        size = podman("image", "inspect", "--format", "{{.Size}}", tag)
        built[name] = Built(tag, round(seconds, 1), int(size.stdout.strip()))
    IMAGES_ARTIFACT.parent.mkdir(exist_ok=True)
    IMAGES_ARTIFACT.write_text(json.dumps({name: asdict(item) for name, item in built.items()}, indent=2) + "\n")
    return built
