"""Readiness (lame duck after SIGTERM), and the production guard of the settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import ValidationError

from iwscope.config import Settings
from iwscope.localstack import default_stack


def test_readyz_reports_draining_after_sigterm(api_server_factory) -> None:
    server = api_server_factory(IWSCOPE_DRAIN_SECONDS="3")
    try:
        assert httpx.get(f"{server.url}/readyz").json()["status"] == "ready"
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        during = httpx.get(f"{server.url}/readyz")
        assert during.status_code == 503 and during.json()["status"] == "draining"
        assert httpx.get(f"{server.url}/healthz").status_code == 200  # still serving while draining
        # uvicorn re-raises the captured SIGTERM after a clean shutdown.
        assert server.process.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        server.stop()


def test_readyz_not_ready_without_redis(api_server_factory, unused_tcp_port: int) -> None:
    server = api_server_factory(REDIS_URL=f"redis://127.0.0.1:{unused_tcp_port}/1")
    try:
        answer = httpx.get(f"{server.url}/readyz", timeout=10)
        assert answer.status_code == 503
        assert answer.json()["checks"]["postgresql"] == "ok"
        assert answer.json()["checks"]["redis"].startswith("error")
    finally:
        server.stop()


def test_production_refuses_placeholder_secrets() -> None:
    with pytest.raises(ValidationError, match="DATABASE_URL must be set"):
        Settings(IWSCOPE_ENV="production", DATABASE_URL="", REDIS_URL="")
    with pytest.raises(ValidationError, match="placeholder password"):
        Settings(IWSCOPE_ENV="production", DATABASE_URL="postgresql+psycopg://u:changeme@db/x", REDIS_URL="redis://r:6379/0")
    with pytest.raises(ValidationError, match="IWSCOPE_ADMIN_TOKEN"):
        Settings(
            IWSCOPE_ENV="production",
            DATABASE_URL="postgresql+psycopg://u:Xk2q9vP0aa@db/x",
            REDIS_URL="redis://r:6379/0",
            IWSCOPE_ADMIN_TOKEN="admin",
        )
    good = Settings(
        IWSCOPE_ENV="production",
        DATABASE_URL="postgresql+psycopg://u:Xk2q9vP0aa@db/x",
        REDIS_URL="redis://r:6379/0",
        IWSCOPE_ADMIN_TOKEN="t" * 40,
    )
    assert good.env == "production"
    # Development falls back to the checkout's local stack (iwscope.localstack, imported above,
    # provides it), password included.
    development = Settings(IWSCOPE_ENV="development", DATABASE_URL="", REDIS_URL="")
    assert development.celery_queue == "iwscope"
    assert urlsplit(development.database_url).password and urlsplit(development.redis_url).password
    assert (development.database_url, development.redis_url) == (default_stack().database_url, default_stack().redis_url)


def test_api_refuses_to_start_in_production_with_placeholders(service_env: dict[str, str]) -> None:
    env = {**service_env, "IWSCOPE_ENV": "production", "IWSCOPE_ADMIN_TOKEN": "changeme"}
    completed = subprocess.run(
        [sys.executable, "-m", "iwscope.cli", "token", "create", "--kind", "admin"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode != 0
    assert "refusing to run with IWSCOPE_ENV=production" in completed.stderr
    assert completed.stdout == ""


def test_bootstrap_admin_token_from_settings(api_server_factory) -> None:
    token = "bootstrap-" + os.urandom(16).hex()
    server = api_server_factory(IWSCOPE_ADMIN_TOKEN=token)
    try:
        assert httpx.get(f"{server.url}/api/v1/campaigns", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert httpx.get(f"{server.url}/api/v1/campaigns", headers={"Authorization": f"Bearer {token}x"}).status_code == 401
    finally:
        server.stop()


def test_fastapis_native_telemetry_is_off_even_with_a_configured_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    """iwscope exports Prometheus metrics, no OpenTelemetry: FastAPI's native telemetry would
    check the global providers on every request (3-6 % of the API's CPU under upload load,
    docs/ingest-throughput.md) and emit spans once a host configures a tracer.  The app turns
    it off; a plain FastAPI app in the same process would be on."""
    from fastapi import FastAPI
    from fastapi.telemetry import _asgi
    from opentelemetry import trace

    class ConfiguredTracer(trace.TracerProvider):
        def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
            return trace.NoOpTracer()

    monkeypatch.setattr(_asgi.trace, "get_tracer_provider", lambda: ConfiguredTracer())
    assert FastAPI()._native_telemetry.enabled()
    from iwscope.api import create_app

    assert not create_app().fastapi._native_telemetry.enabled()
