"""Both images built by a real engine (podman) and run the way the chart runs them.

From a base made here (``scripts/image-base.sh``: Debian 12 by debootstrap, with python3 and
pip; no image registry is reachable), ``podman build`` of docker/collector.Dockerfile and
docker/probe.Dockerfile; then, with the chart's security context (read-only root filesystem,
UID 10001, every capability dropped, no new privileges, a /tmp tmpfs): ``pip freeze`` in each
equals requirements.lock (no package at another version, none the lock lacks), the collector
serves ``/healthz`` and ``/readyz`` against this session's PostgreSQL and Redis, and the probe
image runs ``iwprobe``.  Build times and sizes go to artifacts/deploy-images.json.

Minutes long (the first run debootstraps the base): marked ``deploy``, run by hand with
``make deploy-check`` (docs/deployment.md), not in ``make test`` or CI.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import yaml
from chartrender import CHART
from conftest import Built, differing_from_lock, own_versions
from kubeplay import podman
from testkit import free_port, wait_for

pytestmark = pytest.mark.deploy


def _chart_security() -> list[str]:
    """``podman run`` options equal to the chart's container security context."""
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    context = values["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["capabilities"]["drop"] == ["ALL"]
    assert context["allowPrivilegeEscalation"] is False
    user = f"{context['runAsUser']}:{context['runAsGroup']}"
    return ["--read-only", "--user", user, "--cap-drop=ALL", "--security-opt=no-new-privileges", "--tmpfs", "/tmp:rw,size=64m"]


@pytest.mark.parametrize("name", ["collector", "probe"])
def test_every_installed_package_is_the_locked_one(built_images: dict[str, Built], name: str) -> None:
    freeze = podman("run", "--rm", *_chart_security(), "--entrypoint", "pip", built_images[name].image, "freeze")
    assert freeze.returncode == 0, freeze.stderr
    lines = freeze.stdout.splitlines()
    assert differing_from_lock(freeze.stdout) == []
    assert "iwprobe==" + own_versions()["iwprobe"] in lines
    if name == "collector":
        assert len(lines) > 50  # the collector's dependencies, not an empty environment


@pytest.fixture
def collector_container(built_images: dict[str, Built], service_env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    name = f"iwscope-check-{port}"
    started = podman(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "host",
        *_chart_security(),
        "-e",
        f"DATABASE_URL={service_env['DATABASE_URL']}",
        "-e",
        f"REDIS_URL={service_env['REDIS_URL']}",
        "-e",
        f"IWSCOPE_CELERY_QUEUE={service_env['IWSCOPE_CELERY_QUEUE']}",
        built_images["collector"].image,
        "iwscope",
        "api",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    )
    assert started.returncode == 0, started.stderr
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        logs = podman("logs", name)
        podman("rm", "-f", name)
        print(logs.stdout[-2000:], logs.stderr[-2000:])


def test_the_collector_serves_under_the_charts_security_context(collector_container: str) -> None:
    def ready() -> httpx.Response | None:
        try:
            answer = httpx.get(f"{collector_container}/readyz", timeout=2.0)
        except httpx.TransportError:
            return None
        return answer if answer.status_code == 200 else None

    answer = wait_for(ready, timeout=60, what="the container's /readyz")
    assert answer.json()["status"] == "ready"
    assert httpx.get(f"{collector_container}/healthz", timeout=2.0).status_code == 200


def test_the_probe_image_runs_under_the_charts_security_context(built_images: dict[str, Built]) -> None:
    version = podman("run", "--rm", *_chart_security(), built_images["probe"].image, "version")
    assert version.returncode == 0, version.stderr
    assert own_versions()["iwprobe"] in version.stdout
