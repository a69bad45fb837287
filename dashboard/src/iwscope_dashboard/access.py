"""Who may see the Real users page: holders of a ``read`` (or ``admin``) token.

What operators' servers measured of their own users is not public like the probes' data (the
collector's ``/api/v1/analysis/passive/...`` routes need the same credential).  The dashboard
reads the database directly, so it checks tokens there itself:

* ``/real-users`` and everything under it, and every Dash callback that concerns the page (an
  output or input id starting ``realusers-``, or the page router asked for ``/real-users``),
  answer **401** unless the request carries a credential -- a page that is merely empty would
  still leak through its callbacks;
* a credential is either ``Authorization: Bearer <read or admin token>`` (scripted access; checked
  like the API does, :func:`iwscope.auth.services.api_token_kind`) or the session cookie
  :data:`COOKIE` that the form at :data:`LOGIN_PATH` sets after checking a token: HttpOnly,
  SameSite=Strict, ``Secure`` over HTTPS, valid :data:`SESSION_SECONDS`;
* the cookie holds no secret of its own: ``v1.<token id>.<expiry>.<mac>``, the MAC an
  HMAC-SHA256 of the first three keyed with the stored hash of the token (which only the
  database has).  Every request looks the token up again, so a revoked token's sessions end at
  once, and a stolen cookie is worth nothing after its expiry nor against the API (which wants
  the token itself);
* a wrong, revoked or other kind of token gets the same 401, without saying why.  The other
  pages stay public.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import logging
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from flask import Flask, Response, redirect, request
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from iwscope.auth.dependencies import READER_KINDS
from iwscope.auth.services import api_token_kind, hash_secret
from iwscope.config import get_settings
from iwscope.db import session_scope
from iwscope_dashboard import db

log = logging.getLogger(__name__)

#: The protected page and its sign-in and sign-out addresses.
PROTECTED_PATH = "/real-users"
LOGIN_PATH = "/real-users/login"
LOGOUT_PATH = "/real-users/logout"
#: Component ids of the page start with this (its Dash callbacks are recognised by it).
PAGE_PREFIX = "realusers-"
COOKIE = "iwscope_reader"
SESSION_SECONDS = 12 * 3600
_VERSION = "v1"
#: The cookie's token id of the bootstrap admin token (``IWSCOPE_ADMIN_TOKEN``, not stored).
_BOOTSTRAP_ID = 0
_CALLBACK_PATH = "/_dash-update-component"
_REFUSED = "Not accepted: this page needs a read (or admin) token of this iwscope installation."


# ---- tokens and sessions --------------------------------------------------------------------------


def _token_row(token: str) -> tuple[int, str] | None:
    """``(id, stored hash)`` of an unrevoked read or admin token (the bootstrap admin token: id 0)."""
    settings = get_settings()
    with session_scope(db.session_factory()) as session:
        kind = api_token_kind(session, settings, READER_KINDS, token)
        if kind is None:
            return None
        row = session.execute(
            text("SELECT id, token_hash FROM api_tokens WHERE token_hash = :hash AND revoked_at IS NULL AND kind = ANY(:kinds)"),
            {"hash": hash_secret(token), "kinds": list(READER_KINDS)},
        ).first()
    if row is not None:
        return int(row.id), str(row.token_hash)
    return _BOOTSTRAP_ID, hash_secret(token)  # the bootstrap admin token (api_token_kind accepted it)


def _stored_hash(token_id: int) -> str | None:
    """The stored hash of an unrevoked read or admin token, by id (the bootstrap admin token's, for 0)."""
    if token_id == _BOOTSTRAP_ID:
        admin = get_settings().admin_token
        return hash_secret(admin) if admin else None
    with session_scope(db.session_factory()) as session:
        row = session.execute(
            text("SELECT token_hash FROM api_tokens WHERE id = :id AND revoked_at IS NULL AND kind = ANY(:kinds)"),
            {"id": token_id, "kinds": list(READER_KINDS)},
        ).first()
    return None if row is None else str(row.token_hash)


def _mac(key: str, token_id: int, expires: int) -> str:
    return hmac.new(key.encode("utf-8"), f"{_VERSION}.{token_id}.{expires}".encode(), hashlib.sha256).hexdigest()


def session_cookie(token_id: int, stored_hash: str, now: float | None = None) -> str:
    """The cookie value of a session of token ``token_id`` (module docstring)."""
    expires = int((now if now is not None else time.time()) + SESSION_SECONDS)
    return f"{_VERSION}.{token_id}.{expires}.{_mac(stored_hash, token_id, expires)}"


def session_valid(value: str, now: float | None = None) -> bool:
    """Whether a cookie value is an unexpired session of a token that is still valid."""
    parts = value.split(".")
    if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    token_id, expires = int(parts[1]), int(parts[2])
    if expires < (now if now is not None else time.time()) or token_id > 2**63 - 1:
        return False
    stored = _stored_hash(token_id)
    return stored is not None and hmac.compare_digest(_mac(stored, token_id, expires), parts[3])


def reader_credential() -> bool:
    """Whether the current request carries a read credential (bearer token or session cookie)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return _token_row(token.strip()) is not None
    cookie = request.cookies.get(COOKIE)
    return bool(cookie) and session_valid(str(cookie))


# ---- which requests are the page's ----------------------------------------------------------------


def protected_path(path: str) -> bool:
    """Whether ``path`` is the page or under it (but its sign-in and sign-out addresses); compared
    unquoted and in lower case, so no spelling of it slips through."""
    plain = "/" + unquote(path).lower().strip("/")
    return plain == PROTECTED_PATH or (plain.startswith(PROTECTED_PATH + "/") and plain not in (LOGIN_PATH, LOGOUT_PATH))


def _ids(items: Any) -> Iterator[dict[str, Any]]:
    """Every ``{"id": ..., "property": ..., "value": ...}`` of a callback's inputs or state (nested
    lists for pattern-matching ids)."""
    if isinstance(items, dict):
        yield items
    elif isinstance(items, list):
        for item in items:
            yield from _ids(item)


def protected_callback(body: Any) -> bool:
    """Whether a Dash callback request concerns the Real users page."""
    if not isinstance(body, dict):
        return False
    if PAGE_PREFIX in str(body.get("output", "")) or PAGE_PREFIX in str(body.get("outputs", "")):
        return True
    for item in _ids([body.get("inputs", []), body.get("state", [])]):
        component = item.get("id")
        if isinstance(component, str) and component.startswith(PAGE_PREFIX):
            return True
        if PAGE_PREFIX in str(component):
            return True
        if (
            component == "_pages_location"
            and item.get("property") == "pathname"
            and isinstance(item.get("value"), str)
            and protected_path(urlsplit(item["value"]).path)
        ):
            return True
    return False


def _unauthorized() -> Response:
    if request.path.endswith(_CALLBACK_PATH):
        response = Response('{"detail": "a read token is needed"}', status=401, mimetype="application/json")
    else:
        response = Response(
            _page(
                "Real users: sign in needed",
                f'<p>{html.escape(_REFUSED)}</p><p><a href="{LOGIN_PATH}">Sign in with a read token</a>'
                " or send <code>Authorization: Bearer &lt;token&gt;</code>.</p>",
            ),
            status=401,
            mimetype="text/html",
        )
    response.headers["WWW-Authenticate"] = 'Bearer realm="iwscope real users"'
    response.headers["Cache-Control"] = "no-store"
    return response


def _guard() -> Response | None:
    path = request.path
    if path.endswith(_CALLBACK_PATH):
        if not protected_callback(request.get_json(silent=True)):
            return None
    elif not protected_path(path):
        return None
    try:
        allowed = reader_credential()
    except (SQLAlchemyError, db.DatabaseNotConfigured):
        log.exception("checking a read credential failed")
        return Response(
            "the database did not answer; try again",
            status=503,
            mimetype="text/plain",
            headers={"Retry-After": "5", "Cache-Control": "no-store"},
        )
    return None if allowed else _unauthorized()


# ---- sign in and out --------------------------------------------------------------------------------


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<style>body{font-family:system-ui,sans-serif;max-width:34em;margin:3em auto;color:#1d2329}"
        "input{font:inherit;padding:6px;width:100%;box-sizing:border-box}"
        "button{font:inherit;padding:6px 14px;margin-top:10px}.iw-refused{color:#a33}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _form(message: str = "") -> str:
    note = f'<p class="iw-refused" id="realusers-login-refused">{html.escape(message)}</p>' if message else ""
    return _page(
        "Real users: sign in",
        note
        + (
            "<p>The Real users page shows what operators' servers measured of their own users; it needs a "
            "<code>read</code> token (<code>iwscope token create --kind read</code>) or an admin token.</p>"
            f'<form method="post" action="{LOGIN_PATH}" id="realusers-login-form">'
            '<label for="realusers-login-token">Token</label>'
            '<input type="password" name="token" id="realusers-login-token" autocomplete="off" required>'
            '<button type="submit" id="realusers-login-submit">Sign in</button></form>'
            '<p><a href="/">Back to the public pages</a></p>'
        ),
    )


def _same_origin() -> bool:
    """A form post from this dashboard's own pages (``Origin``, when the browser sends it, names us)."""
    origin = request.headers.get("Origin")
    return origin is None or urlsplit(origin).netloc == request.host


def _login() -> Any:
    if request.method == "GET":
        return Response(_form(), mimetype="text/html", headers={"Cache-Control": "no-store"})
    token = (request.form.get("token") or "").strip()
    found = None
    if token and len(token) <= 512 and "\x00" not in token and _same_origin():
        try:
            found = _token_row(token)
        except (SQLAlchemyError, db.DatabaseNotConfigured):
            log.exception("checking a read token failed")
            return Response("the database did not answer; try again", status=503, mimetype="text/plain")
    if found is None:
        return Response(
            _form(_REFUSED),
            status=401,
            mimetype="text/html",
            headers={"Cache-Control": "no-store", "WWW-Authenticate": 'Bearer realm="iwscope real users"'},
        )
    response = redirect(PROTECTED_PATH, code=303)
    response.set_cookie(
        COOKIE,
        session_cookie(*found),
        max_age=SESSION_SECONDS,
        path="/",
        secure=request.is_secure,
        httponly=True,
        samesite="Strict",
    )
    response.headers["Cache-Control"] = "no-store"
    return response


def _logout() -> Any:
    response = redirect("/", code=303)
    response.delete_cookie(COOKIE, path="/", secure=request.is_secure, httponly=True, samesite="Strict")
    return response


def register_access(server: Flask) -> None:
    """Guard the Real users page and its callbacks; add the sign-in and sign-out addresses."""
    server.before_request(_guard)
    server.add_url_rule(LOGIN_PATH, "realusers_login", _login, methods=["GET", "POST"])
    server.add_url_rule(LOGOUT_PATH, "realusers_logout", _logout, methods=["GET", "POST"])
