"""The deploy tests reuse the chart renderer of tests/helm (one parser of the chart)."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "helm"))
