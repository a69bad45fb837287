"""Lab-twin predictions through the collector: ``POST /api/v1/campaigns/{id}/twin-predictions``
(admin; all or nothing; the same result again a duplicate) and ``GET
/api/v1/analysis/twin-predictions`` (every read says ``prediction``).  The API and PostgreSQL
are the session's real ones (tests/conftest.py); the lab's own result passing this check is
``tests/lab/test_lab_twin_fit.py``."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.engine import Engine
from study_seed import PATHS
from study_seed import twin_document as seeded_twin_document
from testkit import Enrolled, bearer, create_campaign

from iwscope.predictions.schemas import TwinResultIn


def twin_document(campaign_id: int) -> dict[str, Any]:
    """The seeded study's twin document (eight paths in five RTT buckets; IW10 fit, IW16 held out,
    IW32 predicted) for ``campaign_id``, with probes and an origin this collector need not have."""
    return seeded_twin_document(campaign_id, {path.name: uuid.uuid4() for path in PATHS}, uuid.uuid4())


def _rows(engine: Engine, campaign_id: int) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM twin_predictions WHERE campaign_id = :c"), {"c": campaign_id}
            ).scalar_one()
        )


def test_a_twin_result_is_stored_once_and_read_as_a_prediction(
    client: httpx.Client, admin_token: str, origin: Enrolled, db_engine: Engine
) -> None:
    campaign_id = int(create_campaign(client, admin_token, str(origin.id), name="twin", sizes=[20_000])["id"])
    path = f"/api/v1/campaigns/{campaign_id}/twin-predictions"
    document = twin_document(campaign_id)
    document["buckets"][0]["predicted"]["16"] |= {"ms": None, "ci_ms": None}  # n too small
    first = client.post(path, json=document, headers=bearer(admin_token))
    assert first.status_code == 201, first.text
    again = client.post(path, json=document, headers=bearer(admin_token))
    assert again.status_code == 200 and again.json() == {"id": first.json()["id"], "duplicate": True}
    assert _rows(db_engine, campaign_id) == 1
    read = client.get("/api/v1/analysis/twin-predictions", params={"campaign": campaign_id})
    assert read.status_code == 200
    (stored,) = read.json()["data"]
    assert (stored["id"], stored["kind"], stored["source"]) == (first.json()["id"], "prediction", "iwscope lab twin")
    assert (stored["paths"], stored["fit_judged"], stored["fit_overlapping"]) == (8, 8, 8)
    result = stored["result"]
    assert result == TwinResultIn.model_validate(document).model_dump(mode="json")  # read back whole
    assert result["paths"][0]["predicted"]["32"]["prediction"] is True
    assert result["buckets"][0]["predicted"]["16"]["ms"] is None  # n too small stays so
    # a second, different result of the same campaign: newest first
    second = copy.deepcopy(document)
    second["twin_campaign_id"] = 5
    assert client.post(path, json=second, headers=bearer(admin_token)).status_code == 201
    listed = client.get("/api/v1/analysis/twin-predictions", params={"campaign": campaign_id}).json()["data"]
    assert [entry["result"]["twin_campaign_id"] for entry in listed] == [5, document["twin_campaign_id"]]


def test_a_bad_twin_result_is_refused_whole_and_says_why(
    client: httpx.Client, admin_token: str, origin: Enrolled, db_engine: Engine
) -> None:
    campaign_id = int(create_campaign(client, admin_token, str(origin.id), name="twin", sizes=[20_000])["id"])
    path = f"/api/v1/campaigns/{campaign_id}/twin-predictions"

    def broken(change: Any) -> dict[str, Any]:
        document = twin_document(campaign_id)
        change(document)
        return document

    cases = {
        "prediction": broken(lambda d: d["paths"][0]["predicted"]["32"].pop("prediction")),
        "outside its interval": broken(lambda d: d["buckets"][0]["fit"]["measured"].update(ms=1e6)),
        "low above high": broken(lambda d: d["paths"][0]["fit"]["measured"].update(ci_ms=[70.0, 50.0])),
        "are not what_if": broken(lambda d: d["buckets"][0]["predicted"].pop("16")),
        "held_out": broken(lambda d: d.update(compare_arm=None)),
        "same arm": broken(lambda d: d.update(treatment_iw=3)),
        "extra": broken(lambda d: d["paths"][0]["path"].update(client_address="192.0.2.7")),
        f"not {campaign_id}": broken(lambda d: d.update(campaign_id=campaign_id + 1)),
    }
    for reason, document in cases.items():
        response = client.post(path, json=document, headers=bearer(admin_token))
        assert response.status_code == 422, (reason, response.text)
        assert reason in response.text, (reason, response.text)
    assert _rows(db_engine, campaign_id) == 0
    assert client.post(path, json=twin_document(campaign_id)).status_code == 401
    assert client.post(path, json=twin_document(campaign_id), headers=bearer("not-a-token")).status_code == 401
    unknown = 2**62
    assert (
        client.post(
            f"/api/v1/campaigns/{unknown}/twin-predictions", json=twin_document(unknown), headers=bearer(admin_token)
        ).status_code
        == 404
    )
    assert client.get("/api/v1/analysis/twin-predictions", params={"campaign": unknown}).json() == {"data": []}
    assert client.get("/api/v1/analysis/twin-predictions", params={"campaign": 0}).status_code == 422
