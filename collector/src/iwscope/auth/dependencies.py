"""FastAPI dependencies: who is calling (probe, origin, admin, enrollment token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from iwscope.auth.services import api_token_valid, parse_credential, secret_matches
from iwscope.config import Settings, get_settings
from iwscope.db import get_sessionmaker
from iwscope.origins.models import Origin
from iwscope.probes.models import Probe
from iwscope.types import utcnow

#: The one body of every failed authentication (unknown id, wrong secret, revoked).
INVALID_CREDENTIALS = "invalid credentials"

_bearer = HTTPBearer(auto_error=False)


def get_session(request: Request):  # noqa: ANN201 (generator dependency)
    """A session per request, committed by the route when it writes."""
    session: Session = get_sessionmaker()()
    try:
        yield session
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def unauthorized(detail: str = INVALID_CREDENTIALS) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail,
                         headers={"WWW-Authenticate": "Bearer"})


def _bearer_text(bearer: HTTPAuthorizationCredentials | None) -> str:
    if bearer is None or not bearer.credentials:
        raise unauthorized("missing credentials")
    return bearer.credentials


def authenticated_probe(session: SessionDep, bearer: BearerDep) -> Probe:
    """The probe of a valid ``<probe id>.<secret>`` credential; one 401 for every failure."""
    credential = parse_credential(_bearer_text(bearer))
    probe = session.get(Probe, credential.identity) if credential else None
    stored_hash = probe.secret_hash if probe is not None and probe.revoked_at is None else None
    # The comparison runs for unknown probes too (against a dummy hash): same path, same time.
    secret_ok = secret_matches(credential.secret if credential else "", stored_hash)
    if probe is None or not secret_ok:
        raise unauthorized()
    return probe


def authenticated_origin(session: SessionDep, bearer: BearerDep) -> Origin:
    """The origin of a valid ``<origin id>.<secret>`` credential; one 401 for every failure."""
    credential = parse_credential(_bearer_text(bearer))
    origin = session.get(Origin, credential.identity) if credential else None
    stored_hash = origin.secret_hash if origin is not None and origin.revoked_at is None else None
    secret_ok = secret_matches(credential.secret if credential else "", stored_hash)
    if origin is None or not secret_ok:
        raise unauthorized()
    return origin


def _token_dependency(kind: str):  # noqa: ANN202
    def check(session: SessionDep, settings: SettingsDep, bearer: BearerDep) -> str:
        token = _bearer_text(bearer)
        if not api_token_valid(session, settings, kind, token):
            raise unauthorized()
        return kind
    check.__name__ = f"require_{kind}_token"
    return check


ProbeDep = Annotated[Probe, Depends(authenticated_probe)]
OriginDep = Annotated[Origin, Depends(authenticated_origin)]
AdminDep = Annotated[str, Depends(_token_dependency("admin"))]
EnrollTokenDep = Annotated[str, Depends(_token_dependency("enroll"))]
OriginTokenDep = Annotated[str, Depends(_token_dependency("origin"))]


def forbid_other_identity(own_id: object, claimed_id: object) -> None:
    """403 when a valid credential acts on another probe's or origin's id."""
    if str(own_id) != str(claimed_id):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            detail="credential does not belong to this id")


__all__ = ["AdminDep", "EnrollTokenDep", "INVALID_CREDENTIALS", "OriginDep", "OriginTokenDep",
           "ProbeDep", "SessionDep", "SettingsDep", "forbid_other_identity", "unauthorized", "utcnow"]
