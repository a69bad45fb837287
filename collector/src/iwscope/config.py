"""Settings of the collector: one pydantic-settings object, created once per process.

Each field of :class:`Settings` reads one environment variable (its ``validation_alias``) and
says what it is in the ``#:`` comment above it; docs/architecture.md "Settings" holds the table
generated from them (``scripts/docs-facts.py``), so a field without such a comment fails the
docs test.  ``IWSCOPE_MIGRATIONS_DIR`` (where Alembic's scripts live, for container images) is
read by :mod:`iwscope.migrate`, not here.

Capacity of one API process (docs/reliability.md "Load"): ``IWSCOPE_DB_POOL_SIZE`` +
``IWSCOPE_DB_MAX_OVERFLOW`` connections, which is also how many requests may use the
database at once; ``IWSCOPE_DB_POOL_TIMEOUT_S``, how long a request waits for one before it is
answered 503 with ``Retry-After: IWSCOPE_RETRY_AFTER_S``; ``IWSCOPE_API_THREADS``, the
thread pool of everything else that blocks (sync routes, serialisation, Celery publishes);
``IWSCOPE_MAX_IN_PROGRESS`` / ``IWSCOPE_MAX_OTHER_IN_PROGRESS``, the requests one process takes
at once (all / not probe traffic) before it answers 503 at the door (:mod:`iwscope.admission`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from functools import lru_cache
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Values that are obviously not real secrets; production refuses them.
PLACEHOLDER_SECRETS = frozenset(
    {
        "",
        "changeme",
        "change-me",
        "secret",
        "password",
        "postgres",
        "admin",
        "token",
        "example",
        "placeholder",
        "xxx",
        "test",
        "iwscope",
        "default",
    }
)
#: Shortest bootstrap token production accepts (they are bearer secrets).
MIN_PRODUCTION_TOKEN_LENGTH = 24
#: Most database connections one process may be configured to hold (pool + overflow).
MAX_DB_CONNECTIONS = 200


class ConfigurationError(ValueError):
    """The settings are unusable (e.g. placeholder secrets in production)."""


#: ``(DATABASE_URL, REDIS_URL)`` for development settings whose environment leaves them unset.
DevelopmentUrls = Callable[[], tuple[str, str]]
_development_urls: DevelopmentUrls | None = None


def use_development_urls(provider: DevelopmentUrls) -> None:
    """Let development settings take unset ``DATABASE_URL`` / ``REDIS_URL`` from ``provider``.

    The development-only :mod:`iwscope.localstack` installs the checkout's local stack here
    when it is imported (the ``iwscope`` command imports it in development, the tests and the
    lab with their stacks); this module never imports it, so production never loads it."""
    global _development_urls
    _development_urls = provider


class Settings(BaseSettings):
    """Everything the collector reads from its environment."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    #: PostgreSQL (``postgresql+psycopg://...``); unset in development: the checkout's local stack
    #: (``iwscope services start``, with its generated passwords; see :func:`use_development_urls`),
    #: while production refuses to start without it.
    database_url: str = Field("", validation_alias=AliasChoices("DATABASE_URL"))
    #: Redis, Celery's broker and result backend (``redis://...``); unset in development: the
    #: checkout's local stack, as for ``DATABASE_URL``.
    redis_url: str = Field("", validation_alias=AliasChoices("REDIS_URL"))
    #: ``production`` refuses unset or default URLs, placeholder database passwords and short or
    #: placeholder bootstrap tokens.
    env: Literal["development", "production"] = Field("development", validation_alias=AliasChoices("IWSCOPE_ENV"))
    #: A bootstrap admin token, accepted besides the stored ones (not stored, so not revocable
    #: from the CLI: unset it and restart the API).
    admin_token: str | None = Field(None, validation_alias=AliasChoices("IWSCOPE_ADMIN_TOKEN"))
    #: A bootstrap enrollment token, likewise.
    enroll_token: str | None = Field(None, validation_alias=AliasChoices("IWSCOPE_ENROLL_TOKEN"))
    #: The Celery queue of this deployment (also in the Redis key of its pending joins); the tests
    #: use one per session, so concurrent sessions do not take each other's tasks.
    celery_queue: str = Field("iwscope", min_length=1, validation_alias=AliasChoices("IWSCOPE_CELERY_QUEUE"))
    #: Log level of the API, the worker and beat.
    log_level: str = Field("INFO", validation_alias=AliasChoices("IWSCOPE_LOG_LEVEL"))
    #: Lame-duck time after SIGTERM: ``/readyz`` answers 503 this long before the API stops.
    drain_seconds: float = Field(2.0, ge=0, validation_alias=AliasChoices("IWSCOPE_DRAIN_SECONDS"))
    #: Seconds a probe waits before asking for its schedule again (and a tap server before it polls
    #: its configuration again: ``poll_after_s``).
    schedule_poll_s: float = Field(60.0, gt=0, validation_alias=AliasChoices("IWSCOPE_SCHEDULE_POLL_S"))
    #: Connections kept open per process (SQLAlchemy ``pool_size``).  All of them by default:
    #: overflow connections are closed when returned to a full pool and opened again at the next
    #: peak, and each opening costs PostgreSQL a backend process (in one profiled 1,000-probe run,
    #: 4 % of the API's samples were connection set-up; docs/reliability.md).
    db_pool_size: int = Field(20, ge=1, le=MAX_DB_CONNECTIONS, validation_alias=AliasChoices("IWSCOPE_DB_POOL_SIZE"))
    #: Extra connections opened under load and closed when idle (``max_overflow``).
    db_max_overflow: int = Field(0, ge=0, le=MAX_DB_CONNECTIONS, validation_alias=AliasChoices("IWSCOPE_DB_MAX_OVERFLOW"))
    #: Longest wait of a request for a database connection (admission and ``pool_timeout``),
    #: then 503 + ``Retry-After``.  Short: an overloaded collector should turn probes away at
    #: once (they keep their spools and come back), not queue them until their own timeout.
    db_pool_timeout_s: float = Field(3.0, gt=0, le=60, validation_alias=AliasChoices("IWSCOPE_DB_POOL_TIMEOUT_S"))
    #: Milliseconds the group commit (``trials/writer.py``) waits for more uploads before storing
    #: a group smaller than :data:`~iwscope.trials.writer.GROUP_UPLOADS` (0: never waits).  Each
    #: group costs a thread hand-off, a round trip and a transaction however many uploads it holds.
    ingest_linger_ms: float = Field(20.0, ge=0, le=1000, validation_alias=AliasChoices("IWSCOPE_INGEST_LINGER_MS"))
    #: Threads of the API process for blocking work that does not hold a database slot
    #: (anyio's default limiter; database work has its own threads, one per connection).
    api_threads: int = Field(40, ge=4, le=1000, validation_alias=AliasChoices("IWSCOPE_API_THREADS"))
    #: Seconds between two checks of adaptive campaigns' precision (``campaigns/precision.py``).
    precision_check_s: float = Field(20.0, ge=1, le=3600, validation_alias=AliasChoices("IWSCOPE_PRECISION_CHECK_S"))
    #: Requests in progress at once in one API process (:mod:`iwscope.admission`); one more is
    #: answered 503 + ``Retry-After`` before its body is read.  Probe traffic may use all of them.
    #: 96: a 10,000-probe fleet on 2 cores was refused 0.6 % with 96, 3 % with 48, its accepted
    #: uploads p99 0.6 s either way (docs/reliability.md "Load").
    max_in_progress: int = Field(96, ge=1, le=10_000, validation_alias=AliasChoices("IWSCOPE_MAX_IN_PROGRESS"))
    #: Of those, at most this many that are not probe traffic (public reads, exports, admin).
    max_other_in_progress: int = Field(16, ge=1, le=10_000, validation_alias=AliasChoices("IWSCOPE_MAX_OTHER_IN_PROGRESS"))
    #: Event-loop lag (seconds, smoothed over about a second) above which one API process refuses
    #: new requests (503 + ``Retry-After``) even with places free: requests then wait in front
    #: of the handlers, where the in-progress count cannot see them.  Readers are refused from
    #: half of it.  0 = never.
    max_loop_lag_s: float = Field(0.25, ge=0, le=60, validation_alias=AliasChoices("IWSCOPE_MAX_LOOP_LAG_S"))
    #: Latency (seconds, the p90 of a second's trial uploads in one API process) above which the
    #: process takes fewer uploads at once, and below which it takes more again, up to
    #: ``IWSCOPE_MAX_IN_PROGRESS`` (``admission.UploadLimit``); the uploads past that limit are
    #: answered 503 + ``Retry-After`` at once instead of queueing for the database.  0 = never.
    #: 1.0: at 4x the probes that saturate a 2-core box, 0.5 kept the API's own p99 within 1 s
    #: in 4 runs of 6 but stored 52-100 % of the run's peak; 1.0 within 2.5 s in 2 of 3 (5 s in
    #: the third), storing 87-100 %; none 2.5-10 s, 89-100 % (docs/ingest-throughput.md, 2026-12-02).
    upload_latency_target_s: float = Field(1.0, ge=0, le=60, validation_alias=AliasChoices("IWSCOPE_UPLOAD_LATENCY_TARGET_S"))
    #: Seconds a verified probe/origin credential is remembered per process (0: never) while the
    #: process is not told of credential changes (its listener is down or starting): a
    #: revocation then takes effect at most this much later.
    credential_cache_s: float = Field(5.0, ge=0, le=300, validation_alias=AliasChoices("IWSCOPE_CREDENTIAL_CACHE_S"))
    #: Seconds a verified credential is remembered while the process listens to PostgreSQL's
    #: notifications of credential changes (``auth.invalidation``): a revocation empties the
    #: cache at once, so this only bounds how long a missed notification could matter.  A probe
    #: cycle (~60 s) is longer than ``credential_cache_s``: without this every request looked up.
    #: Also how long the process's copy of the stored credentials is trusted (``auth.directory``).
    credential_cache_notified_s: float = Field(
        300.0, ge=0, le=3600, validation_alias=AliasChoices("IWSCOPE_CREDENTIAL_CACHE_NOTIFIED_S")
    )
    #: Seconds the schedules' campaigns and origins are kept per process before they are read
    #: again (0: every request reads them); a change made elsewhere shows at most this late.
    schedule_cache_s: float = Field(5.0, ge=0, le=300, validation_alias=AliasChoices("IWSCOPE_SCHEDULE_CACHE_S"))
    #: ``Retry-After`` (seconds) of a 503 answered because the database was busy.
    retry_after_s: int = Field(2, ge=1, le=3600, validation_alias=AliasChoices("IWSCOPE_RETRY_AFTER_S"))
    #: Longest ``Retry-After`` (seconds) the front door answers with while a process refuses more
    #: probe requests than it admits (``admission.RetryAfter``; from ``IWSCOPE_RETRY_AFTER_S`` up).
    #: 60: iwprobe's own longest backoff between upload retries.
    max_retry_after_s: int = Field(60, ge=1, le=3600, validation_alias=AliasChoices("IWSCOPE_MAX_RETRY_AFTER_S"))
    #: Directory of the analysis copy (``analysis/pathcopy/``: the per-path sums as Parquet,
    #: read by DuckDB; written by the worker, read by the API and the dashboard, so all three
    #: must see the same directory).  Unset: the paired figures read PostgreSQL alone.
    analysis_copy_dir: pathlib.Path | None = Field(None, validation_alias=AliasChoices("IWSCOPE_ANALYSIS_COPY_DIR"))
    #: Megabytes of recent roll-up reads an API or dashboard process keeps until the roll-ups
    #: change (``analysis/readcache.py``: the figures of one filter set share their reads); 0: off.
    #: At the fleet shape (10^4 probes) a filter set's reads for every figure came to 32 MB; each process also has
    #: DuckDB's 256 MB (``pathcopy``), within the chart's 512 Mi (API) and 768 Mi (2 dashboard workers).
    analysis_read_cache_mb: float = Field(64.0, ge=0, le=65536, validation_alias=AliasChoices("IWSCOPE_ANALYSIS_READ_CACHE_MB"))

    @property
    def db_connections(self) -> int:
        """Connections one process may hold at most: ``pool_size + max_overflow``."""
        return self.db_pool_size + self.db_max_overflow

    @model_validator(mode="after")
    def _bounded_connections(self) -> Settings:
        if self.db_connections > MAX_DB_CONNECTIONS:
            raise ConfigurationError(
                f"IWSCOPE_DB_POOL_SIZE + IWSCOPE_DB_MAX_OVERFLOW = {self.db_connections} is over "
                f"{MAX_DB_CONNECTIONS} connections per process (PostgreSQL's default max_connections "
                "is 100 for every process together)"
            )
        return self

    @model_validator(mode="after")
    def _admission_limits(self) -> Settings:
        if self.max_other_in_progress > self.max_in_progress:
            raise ConfigurationError(
                f"IWSCOPE_MAX_OTHER_IN_PROGRESS ({self.max_other_in_progress}) is over IWSCOPE_MAX_IN_PROGRESS "
                f"({self.max_in_progress}): readers would be allowed more than the whole process"
            )
        return self

    @model_validator(mode="after")
    def _local_stack_in_development(self) -> Settings:
        if self.env == "development" and (not self.database_url or not self.redis_url) and _development_urls:
            database_url, redis_url = _development_urls()
            self.database_url = self.database_url or database_url
            self.redis_url = self.redis_url or redis_url
        return self

    @model_validator(mode="after")
    def _refuse_placeholders_in_production(self) -> Settings:
        if self.env != "production":
            return self
        problems: list[str] = []
        if not self.database_url:
            problems.append("DATABASE_URL must be set explicitly")
        else:
            password = urlsplit(self.database_url).password
            if password is not None and password.lower() in PLACEHOLDER_SECRETS:
                problems.append("DATABASE_URL has a placeholder password")
        if not self.redis_url:
            problems.append("REDIS_URL must be set explicitly")
        for name, value in (("IWSCOPE_ADMIN_TOKEN", self.admin_token), ("IWSCOPE_ENROLL_TOKEN", self.enroll_token)):
            if value is None:
                continue
            if value.strip().lower() in PLACEHOLDER_SECRETS or len(value) < MIN_PRODUCTION_TOKEN_LENGTH:
                problems.append(f"{name} is empty, a placeholder or shorter than {MIN_PRODUCTION_TOKEN_LENGTH} characters")
        if problems:
            raise ConfigurationError("refusing to run with IWSCOPE_ENV=production: " + "; ".join(problems))
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read from the environment on first use)."""
    return Settings()  # values come from the environment
