"""Wire v8: an origin observation's send path and segmentation offload, stored, checked and read.

How the origin wrote a response (``wire.SEND_PATHS``) and what its device did with large sends
(``wire.SEGMENTATION_OFFLOADS``) travel on the observation, stay on it (the join copies the
server's numbers onto the trial, not how it was sent) and are read back by the trial inspector's
read (``GET /api/v1/trials/{id}/traces``), the trials page (``send_path`` column, ``send=``
filter), its CSV and the observations' Parquet export.  The API, PostgreSQL and credentials are
the session's real ones (tests/conftest.py).
"""

from __future__ import annotations

import csv
import io
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, text
from testkit import Enrolled, make_batch, make_observation, make_observation_batch, make_trial

from iwprobe import wire
from iwscope.analysis import Filters
from iwscope.analysis.filters import trial_where


def observation_batch(origin_id: str, observations: list[dict[str, Any]], version: int = wire.WIRE_VERSION) -> dict[str, Any]:
    return {**make_observation_batch(origin_id, observations), "wire_version": version}


def stored(db_engine: Engine, trial_ids: list[str]) -> dict[str, tuple[str, str]]:
    """``(send_path, segmentation_offload)`` of the stored observations of ``trial_ids``."""
    with db_engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT trial_id::text, send_path, segmentation_offload FROM origin_observations "
                "WHERE trial_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": trial_ids},
        ).all()
    return {row[0]: (row[1], row[2]) for row in rows}


def upload_round(client: httpx.Client, probe: Enrolled, origin: Enrolled, campaign_id: int) -> list[dict[str, Any]]:
    """One round of a campaign over one path: the same object over IW3, IW10 and IW16 (twins)."""
    trials = [make_trial(probe.id, origin.id, campaign_id, arm_iw=iw, round=7) for iw in (3, 10, 16)]
    answer = client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers)
    assert answer.status_code == 200, answer.text
    return trials


def test_send_paths_are_stored_and_served_back(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, campaign: dict[str, Any], db_engine: Engine
) -> None:
    """A v8 observation's values come back from every read; an older origin's (a v7 batch, no
    fields) are stored as "not said" (''), and a trial without an observation has none (null)."""
    iw3, iw10, iw16 = upload_round(client, probe, origin, campaign["id"])
    said = make_observation(iw10, origin.id, send_path="sendfile", segmentation_offload="gso")
    answer = client.post(wire.OBSERVATIONS_BATCH_PATH, json=observation_batch(origin.id, [said]), headers=origin.headers)
    assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
    older = observation_batch(origin.id, [make_observation(iw3, origin.id)], version=7)
    assert "send_path" not in older["observations"][0]
    answer = client.post(wire.OBSERVATIONS_BATCH_PATH, json=older, headers=origin.headers)
    assert answer.status_code == 200 and answer.json()["accepted"] == 1, answer.text
    assert stored(db_engine, [iw3["trial_id"], iw10["trial_id"], iw16["trial_id"]]) == {
        iw10["trial_id"]: ("sendfile", "gso"),
        iw3["trial_id"]: ("", ""),
    }

    # the trial inspector's read: the trial and its twins, each with its observation's values
    traced = client.get(f"/api/v1/trials/{iw10['trial_id']}/traces")
    assert traced.status_code == 200, traced.text
    body = traced.json()
    assert (body["trial"]["send_path"], body["trial"]["segmentation_offload"]) == ("sendfile", "gso")
    twins = {twin["arm_iw"]: (twin["send_path"], twin["segmentation_offload"]) for twin in body["twins"]}
    assert twins == {3: ("", ""), 16: (None, None)}

    # the trials page: a send_path column, and the send= filter keeps the trials sent that way
    page = client.get("/api/v1/analysis/trials", params={"campaign": campaign["id"]})
    assert page.status_code == 200, page.text
    assert {row["arm_iw"]: row["send_path"] for row in page.json()["data"]} == {3: "", 10: "sendfile", 16: None}
    chosen = client.get("/api/v1/analysis/trials", params={"campaign": campaign["id"], "send": "sendfile"}).json()
    assert [row["trial_id"] for row in chosen["data"]] == [iw10["trial_id"]] and chosen["total"] == 1
    assert client.get("/api/v1/analysis/trials", params={"campaign": campaign["id"], "send": "writev"}).json()["total"] == 0
    unknown = client.get("/api/v1/analysis/trials", params={"campaign": campaign["id"], "send": "splice"}).json()
    assert unknown["total"] == 3  # like every filter value the API cannot read: the default, every trial
    rows = list(csv.DictReader(io.StringIO(client.get("/api/v1/analysis/trials.csv", params={"campaign": campaign["id"]}).text)))
    assert {row["trial_id"]: row["send_path"] for row in rows} == {
        iw3["trial_id"]: "",
        iw10["trial_id"]: "sendfile",
        iw16["trial_id"]: "",
    }

    # the observations' Parquet export holds both columns
    exported = client.get("/api/v1/observations.parquet", params={"campaign_id": campaign["id"]})
    assert exported.status_code == 200, exported.text
    table = pq.read_table(io.BytesIO(exported.content))
    columns = table.select(["trial_id", "send_path", "segmentation_offload"]).to_pylist()
    assert {row["trial_id"]: (row["send_path"], row["segmentation_offload"]) for row in columns} == {
        iw10["trial_id"]: ("sendfile", "gso"),
        iw3["trial_id"]: ("", ""),
    }


@pytest.mark.parametrize(("field", "value"), [("send_path", "splice"), ("segmentation_offload", "lro"), ("send_path", None)])
def test_an_unknown_send_path_refuses_the_whole_batch(
    client: httpx.Client, probe: Enrolled, origin: Enrolled, db_engine: Engine, field: str, value: Any
) -> None:
    """Any value outside the wire's is a 422 naming the record and field; nothing of the batch is stored."""
    trials = [make_trial(probe.id, origin.id, arm_iw=10) for _ in range(2)]
    assert client.post(wire.TRIALS_BATCH_PATH, json=make_batch(probe.id, trials), headers=probe.headers).status_code == 200
    good = make_observation(trials[0], origin.id, send_path="writev", segmentation_offload="tso")
    bad = make_observation(trials[1], origin.id, **{field: value})
    refused = client.post(wire.OBSERVATIONS_BATCH_PATH, json=observation_batch(origin.id, [good, bad]), headers=origin.headers)
    assert refused.status_code == 422, refused.text
    errors = refused.json()["detail"]["errors"]
    assert [(error["section"], error["index"], error["field"]) for error in errors] == [("observations", 1, field)]
    assert stored(db_engine, [trial["trial_id"] for trial in trials]) == {}


#: One observation row as SQL, its send path and offload left to the test (a trial id of its own).
_INSERT_OBSERVATION = """
INSERT INTO origin_observations (trial_id, origin_id, arm_iw, port, client_addr, object_size, request_at,
    first_byte_us, snd_cwnd_at_accept, cwnd_mismatch, rwnd_limited, http_status, tcp_info{columns})
VALUES (gen_random_uuid(), gen_random_uuid(), 10, 8010, '10.0.1.2', 1000, now(), 150, 10, false, false, 200, '{{}}'{values})
RETURNING send_path, segmentation_offload
"""


def test_the_database_holds_only_the_wire_values(db_engine: Engine) -> None:
    """NOT NULL DEFAULT '' and a CHECK of the wire's values (the migration's, named as the model's),
    whatever writes the row; every statement here is rolled back."""
    with db_engine.connect() as connection:
        default = connection.execute(text(_INSERT_OBSERVATION.format(columns="", values=""))).one()
        assert tuple(default) == ("", "")
        connection.rollback()
        for send_path in wire.SEND_PATHS:
            for offload in wire.SEGMENTATION_OFFLOADS:
                sql = _INSERT_OBSERVATION.format(columns=", send_path, segmentation_offload", values=", :path, :offload")
                assert tuple(connection.execute(text(sql), {"path": send_path, "offload": offload}).one()) == (send_path, offload)
        connection.rollback()
        for column, value, constraint in (
            ("send_path", "'splice'", "ck_origin_observations_send_path_known"),
            ("segmentation_offload", "'lro'", "ck_origin_observations_segmentation_offload_known"),
            ("send_path", "NULL", "not-null"),
        ):
            with pytest.raises(sqlalchemy.exc.IntegrityError, match=constraint if value != "NULL" else "null value"):
                connection.execute(text(_INSERT_OBSERVATION.format(columns=f", {column}", values=f", {value}")))
            connection.rollback()


def test_the_send_path_filter() -> None:
    """``send=`` takes a named send path (anything else: every trial) and becomes an exact condition
    on the trial's observation in the raw readers' WHERE."""
    assert Filters.from_query({"send": "mss-writes"}).send_path == "mss-writes"
    assert Filters.from_query({"send": "splice"}).send_path == "" and Filters.from_query({"send": ""}).send_path == ""
    assert Filters(send_path="paced").to_query()["send"] == "paced" and "send" not in Filters().to_query()
    where, params = trial_where(Filters(send_path="paced"))
    assert "origin_observations" in where and params == {"send_path": "paced"}
    assert trial_where(Filters()) == ("TRUE", {})
