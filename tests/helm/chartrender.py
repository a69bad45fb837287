"""Render the Helm chart with a real helm binary and hand back the objects (shared by
tests/helm and tests/deploy, so the chart's commands are parsed, never copied)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "iwscope"
ENSURE_HELM = REPO / "scripts" / "ensure-helm.sh"
#: The value sets CI renders (helm/iwscope/ci/*.yaml), by file stem.
CI_VALUE_SETS: dict[str, pathlib.Path] = {path.stem: path for path in sorted((CHART / "ci").glob("*.yaml"))}
RELEASE = "iwt"
NAMESPACE = "iwscope-test"
#: Building helm with `go install` takes about 2 minutes on first use; afterwards it is cached.
ENSURE_HELM_TIMEOUT_S = 900

Manifest = dict[str, Any]


class HelmFailed(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def ensure_helm() -> pathlib.Path:
    """The cached helm binary (built by scripts/ensure-helm.sh when missing)."""
    result = subprocess.run([str(ENSURE_HELM)], capture_output=True, text=True, check=False, timeout=ENSURE_HELM_TIMEOUT_S)
    if result.returncode != 0:
        raise HelmFailed(f"scripts/ensure-helm.sh failed ({result.returncode}):\n{result.stderr}")
    return pathlib.Path(result.stdout.strip().splitlines()[-1])


def run_helm(helm: pathlib.Path, arguments: Iterable[str], timeout: float = 120) -> str:
    result = subprocess.run(
        [str(helm), *arguments],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir()},
    )
    if result.returncode != 0:
        raise HelmFailed(result.stderr.strip() or result.stdout.strip())
    return result.stdout


def _values_arguments(
    values_files: Iterable[pathlib.Path], overrides: Mapping[str, Any] | None, scratch: pathlib.Path
) -> list[str]:
    arguments: list[str] = []
    for path in values_files:
        arguments += ["--values", str(path)]
    if overrides:
        # A values file rather than --set: no escaping rules, types preserved.
        override_file = scratch / "overrides.yaml"
        override_file.write_text(yaml.safe_dump(dict(overrides)), encoding="utf-8")
        arguments += ["--values", str(override_file)]
    return arguments


def helm_template(
    helm: pathlib.Path,
    values_files: Iterable[pathlib.Path] = (),
    overrides: Mapping[str, Any] | None = None,
    chart: pathlib.Path = CHART,
) -> list[Manifest]:
    """`helm template` of the chart; every rendered Kubernetes object, hooks included."""
    with tempfile.TemporaryDirectory(prefix="iwt-helm-") as scratch:
        output = run_helm(
            helm,
            [
                "template",
                RELEASE,
                str(chart),
                "--namespace",
                NAMESPACE,
                *_values_arguments(values_files, overrides, pathlib.Path(scratch)),
            ],
        )
    return [document for document in yaml.safe_load_all(output) if document]


def helm_lint(helm: pathlib.Path, values_files: Iterable[pathlib.Path] = ()) -> str:
    with tempfile.TemporaryDirectory(prefix="iwt-helm-") as scratch:
        return run_helm(
            helm,
            [
                "lint",
                "--strict",
                str(CHART),
                "--namespace",
                NAMESPACE,
                *_values_arguments(values_files, None, pathlib.Path(scratch)),
            ],
        )


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def find(objects: Iterable[Manifest], kind: str, name: str) -> Manifest:
    """The object of ``kind`` whose name is ``name`` or ends with ``-name``."""
    matches = [
        obj
        for obj in objects
        if obj["kind"] == kind and (obj["metadata"]["name"] == name or obj["metadata"]["name"].endswith(f"-{name}"))
    ]
    if len(matches) != 1:
        names = sorted(f"{obj['kind']}/{obj['metadata']['name']}" for obj in objects)
        raise LookupError(f"expected one {kind} named *{name}, found {len(matches)} among {names}")
    return matches[0]


def of_kind(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj["kind"] == kind]


def pod_spec(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def workloads(objects: Iterable[Manifest]) -> Iterator[Manifest]:
    """Every object with a pod template (Deployment, StatefulSet, Job)."""
    return (obj for obj in objects if obj["kind"] in ("Deployment", "StatefulSet", "Job"))


def containers(workload: Manifest, init: bool = True) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*(spec.get("initContainers") or [] if init else []), *spec["containers"]]
