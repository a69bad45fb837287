"""Fixtures of the Helm chart tests: the helm binary (built once, cached) and renders."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from chartrender import CI_VALUE_SETS, Manifest, ensure_helm, helm_template


@pytest.fixture(scope="session")
def helm() -> pathlib.Path:
    """helm v3.16.4 from scripts/ensure-helm.sh (first run builds it, ~2 minutes)."""
    return ensure_helm()


@pytest.fixture(scope="session")
def rendered_sets(helm: pathlib.Path) -> dict[str, list[Manifest]]:
    """`helm template` of every CI value set, by set name (e.g. "external-db-values")."""
    return {name: helm_template(helm, [path]) for name, path in CI_VALUE_SETS.items()}
