"""FastAPI dependencies: who is calling (probe, origin, server, admin, reader, enrollment token).

Authentication yields a plain value (an :class:`Identity`, the token kind), never an ORM object
bound to a session: no connection is held while the route reads its body, waits for a thread or
sends its answer.

A probe, origin or server credential that was verified is remembered (:class:`CredentialCache`, per
process): for ``IWSCOPE_CREDENTIAL_CACHE_NOTIFIED_S`` while the process hears PostgreSQL's
notifications of credential changes, which empty the cache (:mod:`iwscope.auth.invalidation`),
else for ``IWSCOPE_CREDENTIAL_CACHE_S``.  Only successes are kept, keyed by a hash of the whole
credential, so a wrong secret is never answered from memory; a revoked probe, origin or server is
refused at once (notified) or at most ``IWSCOPE_CREDENTIAL_CACHE_S`` later.  A credential the cache
does not hold is checked against the process's copy of the stored rows while it is notified
(:mod:`iwscope.auth.directory`), else looked up in its own short database use (:func:`run_db`: a
slot, a thread, a connection returned before the thread ends).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from iwscope.auth.directory import DIRECTORY, MODELS, IdentityKind
from iwscope.auth.invalidation import CredentialListener
from iwscope.auth.services import api_token_kind, api_token_valid, parse_credential, secret_matches
from iwscope.config import Settings, get_settings
from iwscope.db import get_engine, get_sessionmaker
from iwscope.dbslots import run_db
from iwscope.types import utcnow

#: The one body of every failed authentication (unknown id, wrong secret, revoked).
INVALID_CREDENTIALS = "invalid credentials"

_bearer = HTTPBearer(auto_error=False)


SettingsDep = Annotated[Settings, Depends(get_settings)]
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


@dataclass(frozen=True)
class Identity:
    """An authenticated probe, origin or server (``kind``): plain values, valid after the lookup's
    connection was returned."""

    kind: IdentityKind
    id: uuid.UUID
    name: str
    region: str


class CredentialCache:
    """Verified credentials of one kind, at most ``max_entries`` (then expired entries go, or
    all of them).  An entry lives ``notified_ttl_s`` when ``notified()`` says changes are heard
    (:meth:`clear` is then called on each), else ``ttl_s``; 0 = not kept.

    A lookup notes :attr:`generation` before reading the database and :meth:`put` keeps its
    answer only if no :meth:`clear` came in between: a revocation notified while the lookup
    ran must not be undone by the old row it read."""

    def __init__(
        self, ttl_s: float, max_entries: int = 100_000, notified_ttl_s: float = 0.0, notified: Callable[[], bool] = lambda: False
    ) -> None:
        self.ttl_s = ttl_s
        self.notified_ttl_s = notified_ttl_s
        self.max_entries = max_entries
        self.generation = 0
        self._notified = notified
        self._lock = threading.Lock()  # clear() runs on the listener's thread
        self._entries: dict[bytes, tuple[float, Identity]] = {}

    @staticmethod
    def _key(credential: str) -> bytes:
        return hashlib.sha256(credential.encode("utf-8")).digest()

    def get(self, credential: str) -> Identity | None:
        key = self._key(credential)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= time.monotonic():
            self._entries.pop(key, None)
            return None
        return entry[1]

    def put(self, credential: str, identity: Identity, generation: int) -> None:
        ttl_s = self.notified_ttl_s if self._notified() else self.ttl_s
        if ttl_s <= 0:
            return
        now = time.monotonic()
        with self._lock:
            if generation != self.generation:
                return
            if len(self._entries) >= self.max_entries:
                self._entries = {key: entry for key, entry in self._entries.items() if entry[0] > now}
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
            self._entries[self._key(credential)] = (now + ttl_s, identity)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries = {}


_caches: dict[IdentityKind, CredentialCache] = {}
#: This process's listener to credential changes (started by the API's lifespan), if any.
_listener: CredentialListener | None = None


def _cache(kind: IdentityKind) -> CredentialCache:
    """This process's cache of ``kind`` (``probe`` / ``origin`` / ``server``), sized by the settings."""
    cache = _caches.get(kind)
    if cache is None:
        settings = get_settings()
        cache = _caches[kind] = CredentialCache(
            settings.credential_cache_s,
            notified_ttl_s=settings.credential_cache_notified_s,
            notified=lambda: _listener is not None and _listener.listening,
        )
    return cache


def clear_credential_caches() -> None:
    for kind in MODELS:
        _cache(kind).clear()


def _trusted_for_s() -> float:
    """How long this process may check credentials against its copy of the stored rows
    (:mod:`iwscope.auth.directory`): as long as the long cache, while it is notified; else never."""
    return get_settings().credential_cache_notified_s if _listener is not None and _listener.listening else 0.0


def _credentials_changed(payload: str | None) -> None:
    """The listener heard a change (``payload``: ``<table>:<id>``), or started or stopped (``None``)."""
    clear_credential_caches()
    DIRECTORY.notified(payload)


def start_credential_listener() -> CredentialListener:
    """Listen to credential changes in this process (the API's lifespan; stop it on shutdown)."""
    global _listener
    _listener = CredentialListener(get_engine(), _credentials_changed)
    _listener.start()
    return _listener


def stop_credential_listener() -> None:
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None
    clear_credential_caches()
    DIRECTORY.drop_all()


def unauthorized(detail: str = INVALID_CREDENTIALS) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def _bearer_text(bearer: HTTPAuthorizationCredentials | None) -> str:
    if bearer is None or not bearer.credentials:
        raise unauthorized("missing credentials")
    return bearer.credentials


def bearer_credential(authorization: str | None) -> HTTPAuthorizationCredentials | None:
    """An ``Authorization`` header read as FastAPI's ``HTTPBearer(auto_error=False)`` reads it
    (``None`` when absent, empty or of another scheme), for the routes answered without
    FastAPI's dependencies (:mod:`iwscope.trials.ingest`)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if not (authorization and scheme and credentials) or scheme.lower() != "bearer":
        return None
    # Two strings just read from the header: built without pydantic's validation (a model
    # validated per upload was 0.8 % of the API's time in a profile of the fleet's steady stage).
    return HTTPAuthorizationCredentials.model_construct(scheme=scheme, credentials=credentials)


async def authenticate(kinds: tuple[IdentityKind, ...], bearer: HTTPAuthorizationCredentials | None) -> Identity:
    """The identity of a valid ``<id>.<secret>`` credential of one of ``kinds`` (probe, origin,
    server), from this process's caches or the database (one lookup for all the kinds); one 401
    for every failure."""
    text = _bearer_text(bearer)
    for kind in kinds:
        remembered = _cache(kind).get(text)
        if remembered is not None:
            return remembered
    generations = {kind: _cache(kind).generation for kind in kinds}
    credential = parse_credential(text)
    found = await DIRECTORY.find(kinds, credential.identity, _trusted_for_s()) if credential else None
    stored_hash = found[1].secret_hash if found is not None else None
    # The comparison runs for unknown identities too (against a dummy hash): same path, same time.
    secret_ok = secret_matches(credential.secret if credential else "", stored_hash)
    if found is None or not secret_ok:
        raise unauthorized()
    kind, stored = found
    identity = Identity(kind, stored.id, stored.name, stored.region)
    _cache(kind).put(text, identity, generations[kind])
    return identity


IdentityDependency = Callable[[HTTPAuthorizationCredentials | None], Coroutine[Any, Any, Identity]]


def _identity_dependency(*kinds: IdentityKind) -> IdentityDependency:
    """The dependency that authenticates a credential of any of ``kinds`` (probe, origin, server)."""

    async def authenticated(bearer: BearerDep) -> Identity:
        """The probe, origin or server of a valid ``<id>.<secret>`` credential; one 401 for every failure."""
        return await authenticate(kinds, bearer)

    authenticated.__name__ = authenticated.__qualname__ = f"authenticated_{'_or_'.join(kinds)}"
    return authenticated


authenticated_probe = _identity_dependency("probe")
authenticated_origin = _identity_dependency("origin")
authenticated_server = _identity_dependency("server")
#: Trace uploads (wire v7): either end of a trial's connection -- the probe that received it or
#: the origin that sent it; the route tells them apart by :attr:`Identity.kind`.
authenticated_probe_or_origin = _identity_dependency("probe", "origin")

TokenDependency = Callable[[Settings, HTTPAuthorizationCredentials | None], Coroutine[Any, Any, str]]


def _token_dependency(kind: str) -> TokenDependency:
    """The dependency that checks an API token of ``kind`` (admin, enroll, origin, server) and returns the kind."""

    def valid(settings: Settings, token: str) -> bool:
        with get_sessionmaker()() as session:  # closed (connection returned) in this thread
            return api_token_valid(session, settings, kind, token)

    async def check(settings: SettingsDep, bearer: BearerDep) -> str:
        token = _bearer_text(bearer)
        if not await run_db(valid, settings, token):
            raise unauthorized()
        return kind

    check.__name__ = f"require_{kind}_token"
    return check


#: Token kinds that read the passive, real-user data (``iwscope.passive``): what the servers
#: of operators measured of their users is not public like the probes' measurements.
READER_KINDS = ("read", "admin")


async def require_reader(settings: SettingsDep, bearer: BearerDep) -> str:
    """A ``read`` or ``admin`` token (its kind); anything else -- a probe's or server's
    credential, a token of another kind, revoked or unknown -- the one 401 body."""

    def kind_of(token: str) -> str | None:
        with get_sessionmaker()() as session:  # closed (connection returned) in this thread
            return api_token_kind(session, settings, READER_KINDS, token)

    token = _bearer_text(bearer)
    kind = await run_db(kind_of, token)
    if kind is None:
        raise unauthorized()
    return kind


ProbeDep = Annotated[Identity, Depends(authenticated_probe)]
OriginDep = Annotated[Identity, Depends(authenticated_origin)]
ServerDep = Annotated[Identity, Depends(authenticated_server)]
ProbeOrOriginDep = Annotated[Identity, Depends(authenticated_probe_or_origin)]
AdminDep = Annotated[str, Depends(_token_dependency("admin"))]
EnrollTokenDep = Annotated[str, Depends(_token_dependency("enroll"))]
OriginTokenDep = Annotated[str, Depends(_token_dependency("origin"))]
ServerTokenDep = Annotated[str, Depends(_token_dependency("server"))]
ReaderDep = Annotated[str, Depends(require_reader)]


def forbid_other_identity(own_id: object, claimed_id: object) -> None:
    """403 when a valid credential acts on another probe's, origin's or server's id."""
    if str(own_id) != str(claimed_id):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="credential does not belong to this id")


__all__ = [
    "AdminDep",
    "EnrollTokenDep",
    "INVALID_CREDENTIALS",
    "Identity",
    "IdentityKind",
    "OriginDep",
    "OriginTokenDep",
    "ProbeDep",
    "ProbeOrOriginDep",
    "READER_KINDS",
    "ReaderDep",
    "ServerDep",
    "ServerTokenDep",
    "SettingsDep",
    "authenticate",
    "bearer_credential",
    "forbid_other_identity",
    "unauthorized",
    "utcnow",
]
