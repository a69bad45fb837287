"""Data for researchers (docs/data.md): the tables as Parquet (API and ``iwscope export``) equal
their CSV, bundles hold a study and say how it was made, and the example notebook redraws
Figure 5 from a bundle and from the API with the analysis module's own point estimates."""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import httpx
import nbformat
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session
from study_seed import SeededDatabase

from iwprobe import wire
from iwscope.analysis import Filters, compare_by
from iwscope.exports.bundle import verify, write_bundle
from iwscope.exports.columnar import TABLES, csv_mismatches

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "figure5.ipynb"


@pytest.fixture
def study_api(api_server_factory: Any, study_db: SeededDatabase) -> Any:
    """An API process on the seeded study's database."""
    return api_server_factory(DATABASE_URL=study_db.url)


def test_trials_parquet_rows_equal_the_csv_rows(study_api: Any, study_db: SeededDatabase) -> None:
    campaign = study_db.summary.campaign_ids["pilot"]
    with httpx.Client(base_url=study_api.url, timeout=120) as client:
        for query in (f"?campaign_id={campaign}", ""):
            parquet = client.get(f"/api/v1/trials.parquet{query}")
            assert parquet.status_code == 200, parquet.text
            assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
            table = pq.read_table(io.BytesIO(parquet.content))
            assert table.num_rows == (study_db.summary.n_trials_by_campaign["pilot"] if query else study_db.summary.n_trials)
            csv_text = client.get(f"/api/v1/trials.csv{query}").text
            assert csv_mismatches(table, csv_text) == []
        # the comparison sees a changed value, a changed timestamp, a missing row
        first_id = table.column("trial_id")[0].as_py()
        assert csv_mismatches(table, csv_text.replace(first_id, first_id[:-1] + "0", 1)) != [] or first_id.endswith("0")
        stamp = wire.utc_timestamp(table.column("started_at")[0].as_py())
        assert csv_mismatches(table, csv_text.replace(stamp, stamp.replace("Z", "1Z"), 1)) != []
        assert csv_mismatches(table, csv_text.rsplit("\n", 2)[0] + "\n") != []
        metadata = json.loads(pq.read_schema(io.BytesIO(parquet.content)).metadata[b"iwscope"])
        assert metadata["table"] == "trials" and metadata["wire_version"] == wire.WIRE_VERSION
        # types a reader gets without guessing
        types = {field.name: str(field.type) for field in table.schema}
        assert types["started_at"] == "timestamp[us, tz=UTC]" and types["total_us"] == "int64"
        assert types["client_iw_segments"] == "int16" and types["cwnd_mismatch"] == "bool"


def test_every_table_exports_and_refuses_filters_it_does_not_have(
    study_api: Any, study_db: SeededDatabase, study_session: Session
) -> None:
    campaign = study_db.summary.campaign_ids["higher-iw"]
    counts = {
        "trials": "SELECT count(*) FROM trials WHERE campaign_id = :c",
        "path_estimates": "SELECT count(*) FROM path_estimates e WHERE EXISTS (SELECT 1 FROM trials t "
        "WHERE t.probe_id = e.probe_id AND t.origin_id = e.origin_id AND t.campaign_id = :c)",
        "campaigns": "SELECT count(*) FROM campaigns WHERE id = :c",
        "observations": "SELECT count(*) FROM origin_observations o WHERE EXISTS (SELECT 1 FROM trials t "
        "WHERE t.trial_id = o.trial_id AND t.campaign_id = :c)",
        "census": "SELECT count(*) FROM census_records WHERE campaign_id = :c",
    }
    with httpx.Client(base_url=study_api.url, timeout=120) as client:
        for table, sql in counts.items():
            answer = client.get(f"/api/v1/{table}.parquet?campaign_id={campaign}")
            assert answer.status_code == 200, (table, answer.text)
            expected = study_session.execute(text(sql), {"c": campaign}).scalar_one()
            assert pq.read_table(io.BytesIO(answer.content)).num_rows == expected, table
        assert (
            pq.read_table(io.BytesIO(client.get("/api/v1/census.parquet").content)).num_rows
            == study_session.execute(text("SELECT count(*) FROM census_records")).scalar_one()
            > 0
        )
        # the window is inclusive at both ends, as trials.csv's
        first = study_session.execute(text("SELECT min(started_at) FROM trials")).scalar_one()
        window = client.get("/api/v1/trials.parquet", params={"until": first.isoformat()})
        assert pq.read_table(io.BytesIO(window.content)).num_rows >= 1
        for bad in (
            "/api/v1/trials.parquet?origin_id=0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11",
            "/api/v1/campaigns.parquet?since=2026-01-01T00:00:00Z",
            "/api/v1/trials.parquet?campaign_id=0",
            "/api/v1/trials.parquet?since=yesterday",
        ):
            refused = client.get(bad)
            assert refused.status_code == 422, (bad, refused.text)
        assert client.get("/api/v1/secrets.parquet").status_code == 422  # not a table


def test_export_command_writes_parquet_and_csv_that_agree(
    study_db: SeededDatabase, service_env: dict[str, str], tmp_path: pathlib.Path
) -> None:
    campaign = study_db.summary.campaign_ids["pilot"]
    env = {**service_env, "DATABASE_URL": study_db.url}
    for file_format in ("parquet", "csv"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "iwscope.cli",
                "export",
                "--format",
                file_format,
                "--out",
                str(tmp_path / file_format),
                "--campaign",
                str(campaign),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        # the trial traces (list columns) only as Parquet
        expected = set(TABLES) | ({"traces"} if file_format == "parquet" else set())
        assert {line.split("\t")[0] for line in done.stdout.splitlines()} == expected
    for name in TABLES:
        table = pq.read_table(tmp_path / "parquet" / f"{name}.parquet")
        with open(tmp_path / "csv" / f"{name}.csv", newline="") as handle:
            rows = list(csv.reader(handle))
        assert table.column_names == rows[0] and table.num_rows == len(rows) - 1, name
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "iwscope.cli",
            "export",
            "--out",
            str(tmp_path / "x"),
            "--tables",
            "campaigns",
            "--probe",
            "0b0e4a36-8d0e-4c3d-9a55-3a1c3b7f0c11",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "no probe_id filter" in refused.stderr


#: Executes the notebook with nbclient in a process of its own (its kernel's ZeroMQ sockets
#: and IPC files end with it), kernel over IPC in a directory of the test: no TCP port.
_EXECUTE = """
import sys
import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

notebook = nbformat.read(sys.argv[1], as_version=4)
manager = KernelManager(kernel_name="python3", transport="ipc", ip=sys.argv[2])
NotebookClient(notebook, km=manager, timeout=300, resources={"metadata": {"path": sys.argv[3]}}).execute()
nbformat.write(notebook, sys.argv[4])
"""


def _run_notebook(tmp_path: pathlib.Path, **env: str) -> list[dict[str, Any]]:
    """Execute examples/figure5.ipynb with ``env``; the table it wrote (``IWSCOPE_FIGURE5_OUT``)."""
    run = len(list(tmp_path.glob("figure5-*.json")))
    out, executed = tmp_path / f"figure5-{run}.json", tmp_path / f"figure5-{run}.ipynb"
    done = subprocess.run(
        [sys.executable, "-c", _EXECUTE, str(NOTEBOOK), str(tmp_path / f"kernel-{run}"), str(tmp_path), str(executed)],
        env={**os.environ, **env, "IWSCOPE_FIGURE5_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = [output for cell in nbformat.read(executed, as_version=4).cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.get("output_type") == "error"]
    assert any("application/vnd.plotly.v1+json" in output.get("data", {}) for output in outputs)  # the figure
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


def test_a_bundle_holds_the_study_and_the_notebook_redraws_figure_5(
    study_db: SeededDatabase, study_session: Session, study_api: Any, tmp_path: pathlib.Path
) -> None:
    campaign = study_db.summary.campaign_ids["pilot"]
    bundle = tmp_path / "bundle"
    manifest = write_bundle(study_session, [campaign], bundle)
    assert manifest["rows"]["trials"] == study_db.summary.n_trials_by_campaign["pilot"]
    versions = json.loads((bundle / "versions.json").read_text())
    assert versions["wire_version"] == wire.WIRE_VERSION and versions["kernel"] and versions["postgresql"]
    assert len(versions["git_commit"] or "") == 40 and "pyarrow" in versions["packages"]
    assert json.loads((bundle / "campaigns.json").read_text())[0]["id"] == campaign
    assert verify(bundle) == []
    figure_from_bundle = _run_notebook(tmp_path, IWSCOPE_BUNDLE=str(bundle))
    figure_from_api = _run_notebook(tmp_path, IWSCOPE_API=study_api.url, IWSCOPE_CAMPAIGN=str(campaign))
    expected = {row.bucket: row for row in compare_by(study_session, Filters(campaign_ids=(campaign,)), "rtt")}
    assert [row["bucket"] for row in figure_from_bundle] == list(expected)
    for drawn, by_api in zip(figure_from_bundle, figure_from_api, strict=True):
        reference = expected[drawn["bucket"]]
        assert (drawn["n_pairs"], drawn["n_paths"]) == (reference.n_pairs, reference.n_paths), drawn
        # The same numbers whether read from the bundle or the API: equal but for the last bits
        # of a float (DuckDB's parallel sums add in no fixed order).
        assert drawn.keys() == by_api.keys(), by_api
        for key, value in drawn.items():
            same = value == pytest.approx(by_api[key], rel=1e-12, abs=1e-12) if isinstance(value, float) else value == by_api[key]
            assert same, (key, value, by_api[key])
        if reference.too_small:
            assert drawn["abs_ms"] is None and drawn["note"] == "n too small"
            continue
        assert drawn["abs_ms"] == pytest.approx(reference.abs_ms, rel=1e-9), drawn
        assert drawn["pct"] == pytest.approx(reference.pct, rel=1e-9), drawn
    # a changed byte is found
    trials = bundle / "data" / "trials.parquet"
    data = bytearray(trials.read_bytes())
    data[len(data) // 2] ^= 0xFF
    trials.write_bytes(bytes(data))
    assert verify(bundle) == ["data/trials.parquet"]
