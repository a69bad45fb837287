"""HTTP client for the collector API (``urllib.request``, TLS verified, timeouts)."""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import math
import ssl
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from . import __version__

USER_AGENT = f"iwprobe/{__version__}"


#: Longest ``Retry-After`` honoured: a larger value is clamped, so that a misconfigured
#: collector cannot park its probes for days (their spools keep everything meanwhile).
MAX_RETRY_AFTER_S = 3600.0


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP-date, clamped to
    ``[0, MAX_RETRY_AFTER_S]``; ``None`` when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


class CollectorError(Exception):
    """The collector answered with an error status or could not be reached."""

    def __init__(
        self, message: str, status: Optional[int] = None, body: Any = None, retry_after_s: Optional[float] = None
    ) -> None:
        super().__init__(message)
        #: HTTP status, ``None`` when the collector could not be reached at all.
        self.status = status
        self.body = body
        #: The answer's ``Retry-After`` in seconds (e.g. of a 503 from an overloaded collector).
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        """Network failures, 408, 429 and 5xx are worth retrying later; 4xx are not."""
        return self.status is None or self.status in (408, 429) or self.status >= 500


class CollectorClient:
    """Talks JSON to the collector at ``base_url`` with an optional bearer ``credential``."""

    def __init__(
        self, base_url: str, credential: Optional[str] = None, ca_file: Optional[str] = None, timeout_s: float = 30.0
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"collector URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.credential = credential
        self.timeout_s = timeout_s
        self._ssl_context: Optional[ssl.SSLContext] = None
        if self.base_url.startswith("https://"):
            self._ssl_context = tls_context(ca_file)

    def request(self, method: str, path: str, body: Optional[bytes] = None, token: Optional[str] = None) -> tuple[int, Any]:
        """Send one request; return (status, parsed JSON or None).  Raises CollectorError."""
        status, payload, _ = self._exchange(method, path, body, token, {})
        return status, payload

    def _exchange(
        self, method: str, path: str, body: Optional[bytes], token: Optional[str], extra_headers: dict[str, str]
    ) -> tuple[int, Any, Any]:
        """(status, parsed JSON or None, response headers); 304 is an answer, not an error."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **extra_headers}
        bearer = token if token is not None else self.credential
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._ssl_context) as response:
                return response.status, _parse(response.read()), response.headers
        except urllib.error.HTTPError as error:
            if error.code == 304:
                return 304, None, error.headers
            payload = _parse(error.read())
            retry_after = parse_retry_after(error.headers.get("Retry-After")) if error.headers is not None else None
            raise CollectorError(
                f"{method} {path}: HTTP {error.code}: {_short(payload)}", error.code, payload, retry_after
            ) from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
            # HTTPException: not HTTP at all (BadStatusLine), a body cut short (IncompleteRead)...
            reason = getattr(error, "reason", error)
            if isinstance(reason, ssl.SSLCertVerificationError):
                # The handshake failed before any HTTP byte (and so the credential) was sent.
                raise CollectorError(
                    f"{method} {path}: TLS certificate of {self.base_url} not trusted: "
                    f"{reason} (pin the collector's CA with --ca-file)"
                ) from None
            raise CollectorError(f"{method} {path}: {reason}") from None

    def post_json(self, path: str, payload: bytes, token: Optional[str] = None) -> tuple[int, Any]:
        return self.request("POST", path, payload, token)

    def get_json(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def get_json_if_changed(self, path: str, etag: Optional[str]) -> tuple[int, Any, Optional[str]]:
        """``GET`` with ``If-None-Match: etag``: (200, document, its ETag) or (304, None, etag)
        when the collector says the copy the caller holds is current."""
        status, payload, headers = self._exchange("GET", path, None, None, {"If-None-Match": etag} if etag else {})
        new_etag = headers.get("ETag") if headers is not None else None
        return status, payload, new_etag or (etag if status == 304 else None)


def tls_context(ca_file: Optional[str] = None) -> ssl.SSLContext:
    """Client context: certificate chain and host name verified, TLS >= 1.2; a pinned CA file
    (``ca_file``) replaces the system trust store.  A missing or unreadable CA file is a
    ``ValueError`` naming it."""
    try:
        context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load the CA file {ca_file!r}: {error}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return raw[:500].decode("utf-8", "replace")


def _short(payload: Any) -> str:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return text[:300]


def from_dict(cls: Any, data: dict[str, Any]) -> Any:
    """Build a (possibly nested) wire dataclass from a decoded JSON dict; unknown keys ignored."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in data:
            continue
        values[field.name] = _convert(hints[field.name], data[field.name])
    return cls(**values)


def _convert(hint: Any, value: Any) -> Any:
    import dataclasses
    import typing

    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None:
        return None
    if origin is typing.Union:
        for arg in args:
            if arg is not type(None):
                return _convert(arg, value)
    if origin in (list, list) and args:
        return [_convert(args[0], item) for item in value]
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    return value
