"""Secrets: stored only as hashes, compared in constant time, rotatable and revocable from the CLI;
a revoked token, probe or origin is refused at once with the body of a wrong secret."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from testkit import Enrolled, bearer, enroll_origin, enroll_probe

from iwprobe import wire
from iwscope.auth import services as auth_services
from iwscope.config import Settings

REPO = Path(__file__).resolve().parents[2]
IWSCOPE = [sys.executable, "-m", "iwscope.cli"]
HEARTBEAT = {"version": "1", "spool_backlog": 0, "spool_bytes": 0, "uptime_s": 1, "trials_measured": 0}


def iwscope(service_env: dict[str, str], *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [*IWSCOPE, *args], env={**service_env, **(env or {})}, capture_output=True, text=True, cwd=REPO, timeout=60
    )
    return completed


def all_rows_as_text(engine: Engine) -> str:
    """Every row of every table of the session database as text (to search for leaked secrets)."""
    with engine.connect() as connection:
        tables = (
            connection.execute(
                text(
                    "SELECT quote_ident(relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
                )
            )
            .scalars()
            .all()
        )
        return "\n".join(row for table in tables for row in connection.execute(text(f"SELECT t::text FROM {table} t")).scalars())


def test_secrets_and_tokens_stored_only_as_hashes(
    client: httpx.Client,
    probe: Enrolled,
    origin: Enrolled,
    admin_token: str,
    enroll_token: str,
    origin_token: str,
    db_engine: Engine,
) -> None:
    probe_secret = probe.credential.split(wire.CREDENTIAL_SEPARATOR, 1)[1]
    origin_secret = origin.credential.split(wire.CREDENTIAL_SEPARATOR, 1)[1]
    with db_engine.connect() as connection:
        probe_hash = connection.execute(text("SELECT secret_hash FROM probes WHERE id = :i"), {"i": probe.id}).scalar_one()
        origin_hash = connection.execute(text("SELECT secret_hash FROM origins WHERE id = :i"), {"i": origin.id}).scalar_one()
        token_hashes = set(connection.execute(text("SELECT token_hash FROM api_tokens")).scalars())
    assert probe_hash == hashlib.sha256(probe_secret.encode()).hexdigest()
    assert origin_hash == hashlib.sha256(origin_secret.encode()).hexdigest()
    for token in (admin_token, enroll_token, origin_token):
        assert hashlib.sha256(token.encode()).hexdigest() in token_hashes
    everything = all_rows_as_text(db_engine)
    for secret in (probe_secret, origin_secret, admin_token, enroll_token, origin_token):
        assert len(secret) >= 40 and secret not in everything


def test_comparisons_go_through_compare_digest(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every secret and token check of the request path ends in ``hmac.compare_digest``."""
    calls: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_services.hmac, "compare_digest", counting)
    token = auth_services.create_api_token(db_session, "admin", "compare-digest")
    settings = Settings(IWSCOPE_ADMIN_TOKEN="iws_bootstrap_" + "x" * 40)  # type: ignore[call-arg]
    assert auth_services.api_token_valid(db_session, settings, "admin", token)
    assert not auth_services.api_token_valid(db_session, settings, "admin", token + "x")
    assert auth_services.api_token_valid(db_session, settings, "admin", settings.admin_token)
    assert not auth_services.secret_matches("wrong", auth_services.hash_secret("right"))
    assert not auth_services.secret_matches("anything", None)  # unknown identity: same comparison
    assert len(calls) >= 5
    # The dependencies of every authenticated route use these functions (no other comparison).
    import inspect

    from iwscope.auth import dependencies

    source = inspect.getsource(dependencies.authenticate)
    assert "secret_matches(" in source and "==" not in source
    for function in (dependencies.authenticated_probe, dependencies.authenticated_origin):
        assert "authenticate(" in inspect.getsource(function)
    # ... and so do the hot paths answered without FastAPI's dependencies.
    from iwscope.probes import hotpath
    from iwscope.trials import ingest

    assert "authenticate(" in inspect.getsource(ingest.answer_upload)
    assert "authenticate(" in inspect.getsource(hotpath.answer_if_unchanged)
    # The credential cache is keyed by a digest of the whole credential: a lookup compares
    # digests, never the secret, and only verified credentials are ever put in it.
    assert "hashlib.sha256" in inspect.getsource(dependencies.CredentialCache._key)
    assert "api_token_valid(" in inspect.getsource(dependencies._token_dependency)


def _token_id(service_env: dict[str, str], label: str) -> int:
    listing = iwscope(service_env, "token", "list")
    assert listing.returncode == 0, listing.stderr
    ids = [int(line.split("\t")[0]) for line in listing.stdout.splitlines() if line.split("\t")[2] == label]
    assert len(ids) == 1, listing.stdout
    return ids[0]


def test_admin_and_enrollment_tokens_rotate_and_revoke(
    client: httpx.Client, service_env: dict[str, str], probe: Enrolled
) -> None:
    label = f"rotate-{uuid.uuid4().hex[:8]}"
    created = iwscope(service_env, "token", "create", "--kind", "admin", "--label", label)
    admin = created.stdout.strip()
    assert client.get("/api/v1/probes", headers=bearer(admin)).status_code == 200
    assert admin not in iwscope(service_env, "token", "list", "--all").stdout  # listings never show tokens
    wrong = client.get("/api/v1/probes", headers=bearer(admin + "x"))
    assert wrong.status_code == 401
    # Rotate: the successor works at once, the old token is refused at once with the same body.
    rotated = iwscope(service_env, "token", "rotate", "--id", str(_token_id(service_env, label)))
    assert rotated.returncode == 0, rotated.stderr
    successor = rotated.stdout.strip()
    assert successor.startswith("iws_admin_") and successor != admin
    old = client.get("/api/v1/probes", headers=bearer(admin))
    assert (old.status_code, old.json()) == (401, wrong.json()) == (401, {"detail": "invalid credentials"})
    assert client.get("/api/v1/probes", headers=bearer(successor)).status_code == 200
    # Revoke by value (through the environment, not argv): refused from the next request on.
    revoked = iwscope(service_env, "token", "revoke", env={"IWSCOPE_REVOKE_TOKEN": successor})
    assert revoked.returncode == 0, revoked.stderr
    refused = client.get("/api/v1/probes", headers=bearer(successor))
    assert (refused.status_code, refused.json()) == (401, wrong.json())
    again = iwscope(service_env, "token", "revoke", "--token", successor)
    assert again.returncode != 0 and "no such unrevoked token" in again.stderr
    # An enrollment token: enrolls until revoked by id.
    enroll_label = f"enroll-{uuid.uuid4().hex[:8]}"
    enroll = iwscope(service_env, "token", "create", "--kind", "enroll", "--label", enroll_label).stdout.strip()
    enroll_probe(client, enroll)
    assert iwscope(service_env, "token", "revoke", "--id", str(_token_id(service_env, enroll_label))).returncode == 0
    response = client.post(
        wire.PROBE_ENROLL_PATH,
        headers=bearer(enroll),
        json={"name": "after-revoke", "region": "sec-test", "labels": {}, "version": "0.1.0"},
    )
    assert (response.status_code, response.json()) == (401, wrong.json())
    usage = iwscope(service_env, "token", "revoke")
    assert usage.returncode == 2 and "exactly one of --id or --token" in usage.stderr


def _refused_within_cache_time(send: Callable[[], httpx.Response]) -> httpx.Response:
    """The first answer to ``send()`` that is not a success, trying for the API's credential
    cache time (5 s by default) plus slack for a loaded box."""
    deadline = time.monotonic() + Settings().credential_cache_s + 10  # type: ignore[call-arg]
    while True:
        answer = send()
        if answer.status_code >= 300 or time.monotonic() > deadline:
            return answer
        time.sleep(0.25)


def test_revoked_probe_and_origin_are_refused_within_the_credential_cache_time(
    client: httpx.Client, service_env: dict[str, str], enroll_token: str, origin_token: str
) -> None:
    probe = enroll_probe(client, enroll_token)
    path = wire.PROBE_HEARTBEAT_PATH.format(probe_id=probe.id)
    assert client.post(path, json=HEARTBEAT, headers=probe.headers).status_code == 204
    wrong_secret = client.post(path, json=HEARTBEAT, headers=bearer(f"{probe.id}.wrong-secret"))
    assert wrong_secret.status_code == 401
    revoked = iwscope(service_env, "probes", "revoke", probe.id)
    assert revoked.returncode == 0, revoked.stderr
    refused = _refused_within_cache_time(lambda: client.post(path, json=HEARTBEAT, headers=probe.headers))
    assert (refused.status_code, refused.json()) == (401, wrong_secret.json())
    schedule = client.get(wire.PROBE_SCHEDULE_PATH.format(probe_id=probe.id), headers=probe.headers)
    assert (schedule.status_code, schedule.json()) == (401, wrong_secret.json())
    assert iwscope(service_env, "probes", "revoke", probe.id).returncode == 1  # already revoked: said so
    assert iwscope(service_env, "probes", "revoke", "not-a-uuid").returncode == 1

    origin = enroll_origin(client, origin_token)
    batch = {
        "wire_version": 1,
        "batch_id": wire.new_id(),
        "origin_id": origin.id,
        "sent_at": wire.utc_timestamp(),
        "observations": [],
    }
    assert client.post(wire.OBSERVATIONS_BATCH_PATH, json=batch, headers=origin.headers).status_code == 200
    assert iwscope(service_env, "origins", "revoke", origin.id).returncode == 0
    refused = _refused_within_cache_time(lambda: client.post(wire.OBSERVATIONS_BATCH_PATH, json=batch, headers=origin.headers))
    assert (refused.status_code, refused.json()) == (401, wrong_secret.json())
