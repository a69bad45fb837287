"""A reproducibility bundle: one directory that holds a study's data and says how it was made.

``iwscope campaigns bundle N --out DIR`` (and ``iwscope lab reproduce``, for the campaigns it
ran) writes::

    DIR/data/<table>.parquet   trials, observations, path_estimates, campaigns, census, traces of the campaigns
    DIR/campaigns.json         each campaign's configuration as the API shows it (CampaignOut)
    DIR/versions.json          iwscope and wire versions, git commit, kernel, Python, packages, PostgreSQL
    DIR/manifest.json          every file's bytes and SHA-256, and each table's row count

A reader needs nothing of iwscope: pandas (``pd.read_parquet``), DuckDB
(``SELECT * FROM 'DIR/data/trials.parquet'``) or R (``arrow::read_parquet``) open the tables;
``examples/figure5.ipynb`` redraws Figure 5 from one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import pyarrow.parquet as pq
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from iwprobe import wire
from iwscope import __version__
from iwscope.campaigns.models import Campaign
from iwscope.campaigns.schemas import CampaignOut
from iwscope.exports.columnar import TABLES, ExportFilters, write_parquet
from iwscope.exports.traces import TRACES, write_traces_parquet

#: Distributions whose versions a bundle records (what computed or may read its numbers).
PACKAGES = (
    "iwprobe",
    "iwscope-collector",
    "iwscope-lab",
    "iwscope-dashboard",
    "numpy",
    "duckdb",
    "pyarrow",
    "sqlalchemy",
    "psycopg",
    "fastapi",
    "pydantic",
    "plotly",
)
#: The bundle's own files (beside ``data/``).
MANIFEST, VERSIONS, CAMPAIGNS = "manifest.json", "versions.json", "campaigns.json"


class BundleError(ValueError):
    """The bundle cannot be written as asked (e.g. an unknown campaign)."""


def versions(session: Session | None = None, repository: pathlib.Path | None = None) -> dict[str, Any]:
    """What made the data: software versions, the host's kernel, the checkout's commit."""
    found: dict[str, Any] = {
        "iwscope": __version__,
        "wire_version": wire.WIRE_VERSION,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "packages": {},
    }
    for name in PACKAGES:
        try:
            found["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    root = repository or pathlib.Path(__file__).resolve().parents[4]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        found["git_commit"], found["git_dirty"] = commit, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        found["git_commit"], found["git_dirty"] = None, None
    if session is not None:
        found["postgresql"] = session.execute(text("SHOW server_version")).scalar_one()
    return found


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_bundle(
    session: Session, campaign_ids: Sequence[int], out_dir: pathlib.Path, extra_files: Sequence[str] = ()
) -> dict[str, Any]:
    """Write the bundle of ``campaign_ids`` into ``out_dir`` (see the module); the manifest.
    ``extra_files`` (paths relative to ``out_dir``, written by the caller: a report, a
    scenario, a self-test) are listed and hashed too."""
    if not campaign_ids:
        raise BundleError("a bundle needs at least one campaign")
    campaigns = session.scalars(select(Campaign).where(Campaign.id.in_(list(campaign_ids))).order_by(Campaign.id)).all()
    missing = sorted(set(campaign_ids) - {campaign.id for campaign in campaigns})
    if missing:
        raise BundleError(f"unknown campaigns: {', '.join(map(str, missing))}")
    passive = [str(campaign.id) for campaign in campaigns if campaign.server_ids is not None]
    if passive:  # real users' data is not public: GET /api/v1/passive/*.parquet with a read token
        raise BundleError(
            f"campaigns {', '.join(passive)} are passive campaigns: their data is read with the read "
            "credential (GET /api/v1/passive/aggregates.parquet, connections.parquet), not bundled"
        )
    data = out_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows: dict[str, int] = {}
    for name in ("trials", "observations", "path_estimates", "campaigns", "census", TRACES):
        parts = []
        for campaign in campaigns:
            part = data / f".{name}-{campaign.id}.parquet"
            filters = ExportFilters(campaign_id=campaign.id)
            written = (
                write_traces_parquet(session, filters, str(part))
                if name == TRACES
                else write_parquet(session, TABLES[name], filters, str(part))
            )
            rows[name] = rows.get(name, 0) + written
            parts.append(part)
        _concatenate(parts, data / f"{name}.parquet")
    (out_dir / CAMPAIGNS).write_text(
        json.dumps([CampaignOut.model_validate(campaign).model_dump(mode="json") for campaign in campaigns], indent=2) + "\n"
    )
    (out_dir / VERSIONS).write_text(json.dumps(versions(session), indent=2) + "\n")
    files = sorted([f"data/{name}.parquet" for name in rows] + [CAMPAIGNS, VERSIONS, *extra_files])
    manifest = {
        "format": "iwscope-bundle/1",
        "campaign_ids": [campaign.id for campaign in campaigns],
        "rows": rows,
        "files": {name: {"bytes": (out_dir / name).stat().st_size, "sha256": _sha256(out_dir / name)} for name in files},
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _concatenate(parts: Sequence[pathlib.Path], target: pathlib.Path) -> None:
    """One Parquet file of the parts' row groups, in order (the parts are removed)."""
    first = pq.ParquetFile(parts[0])
    with pq.ParquetWriter(target, first.schema_arrow, compression="zstd") as writer:
        for part in parts:
            source = pq.ParquetFile(part)
            for group in range(source.num_row_groups):
                writer.write_table(source.read_row_group(group))
    for part in parts:
        os.remove(part)


def verify(out_dir: pathlib.Path) -> list[str]:
    """The files of a bundle whose bytes or hash no longer match its manifest (empty: intact)."""
    manifest = json.loads((out_dir / MANIFEST).read_text())
    return [
        name
        for name, entry in manifest["files"].items()
        if not (out_dir / name).exists()
        or (out_dir / name).stat().st_size != entry["bytes"]
        or _sha256(out_dir / name) != entry["sha256"]
    ]
