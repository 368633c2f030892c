"""Who is calling: bearer tokens resolved to a :class:`Principal` (owner, admin), and the job visibility rule.

Every route except the probes (``/healthz``, ``/readyz``), the dashboard page and its
static assets, and the OpenAPI description (``/openapi.json``, ``/docs``) depends on
:func:`authenticate`. A request authenticates with ``Authorization: Bearer <token>``;
a ``GET``/``HEAD`` request may instead carry the dashboard's session cookie
(:data:`SESSION_COOKIE`, set by ``POST /session``), because a browser's
``EventSource`` cannot send headers. Requests that change state always need the
header, so a cross-site form or script cannot act with the cookie (CSRF); the
cookie is also ``SameSite=Strict`` and ``HttpOnly``.

Missing, malformed, unknown and revoked tokens are all answered alike: ``401`` with
``WWW-Authenticate: Bearer`` and ``{"detail": ...}``. With ``HALFCAST_AUTH=off``
(allowed only on a loopback address, see :func:`check_exposure`) every request is
:data:`LOCAL_ADMIN`.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from halfcast.core.db import tokens
from halfcast.core.db.job_reads import JobView, TokenView
from halfcast.core.db.models import Job
from halfcast.core.settings import Settings
from server.http.errors import ApiError

log = logging.getLogger(__name__)

#: Name of the dashboard's session cookie (its value is the token; accepted on GET/HEAD only).
SESSION_COOKIE = "halfcast_session"
#: Methods that may authenticate with the session cookie (they change nothing).
COOKIE_METHODS = frozenset({"GET", "HEAD"})

#: The bearer credentials of a request (``None`` without an ``Authorization: Bearer`` header); declares the scheme.
bearer = HTTPBearer(auto_error=False, description="An API token: `halfcast tokens create --owner NAME`")


@dataclass(frozen=True)
class Principal:
    """The caller: ``owner`` of the token (jobs belong to it) and whether it is an ``admin`` (sees every job)."""

    owner: str
    admin: bool = False
    token_id: int | None = None


#: The caller when authentication is off (``HALFCAST_AUTH=off``, loopback only).
LOCAL_ADMIN = Principal(owner="local", admin=True)


class ExposureError(RuntimeError):
    """Authentication is off but the API would listen on a non-loopback address."""


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, detail, headers={"WWW-Authenticate": "Bearer"})


def _presented_secret(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The token from the ``Authorization`` header, else (GET/HEAD only) from the session cookie."""
    if credentials is not None:
        return credentials.credentials
    if request.headers.get("authorization"):
        raise _unauthorized("the Authorization header must be 'Bearer <token>'")
    if request.method in COOKIE_METHODS:
        return request.cookies.get(SESSION_COOKIE)
    return None


def _required_secret(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str:
    """The presented token; ``ApiError`` 401 when there is none."""
    secret = _presented_secret(request, credentials)
    if not secret:
        raise _unauthorized("authentication required: send 'Authorization: Bearer <token>'")
    return secret


def authenticate(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Principal:
    """The caller of ``request``. Raises ``ApiError`` 401 (with ``WWW-Authenticate: Bearer``) for no or a bad token."""
    settings: Settings = request.app.state.settings
    if not settings.auth:
        return LOCAL_ADMIN
    secret = _required_secret(request, credentials)
    with request.app.state.session_factory() as session:
        row = tokens.resolve(session, secret)
    if row is None:
        raise _unauthorized("invalid or revoked token")
    return Principal(owner=row.owner, admin=row.admin, token_id=row.id)


def presented_token_hash(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """For a route that looks the token up itself: the presented token's hash; ``None`` when authentication is off.

    Raises ``ApiError`` 401 as :func:`authenticate` does for no token or one that cannot be a token.
    """
    settings: Settings = request.app.state.settings
    if not settings.auth:
        return None
    secret = _required_secret(request, credentials)
    if not tokens.plausible(secret):
        raise _unauthorized("invalid or revoked token")
    return tokens.hash_token(secret)


def principal_of(token: TokenView | None, token_hash: str | None) -> Principal:
    """The caller whose token :mod:`halfcast.core.db.job_reads` found for ``token_hash`` (``None``: authentication off).

    Raises ``ApiError`` 401 for an unknown or revoked token.
    """
    if token_hash is None:
        return LOCAL_ADMIN
    if token is None or token.revoked_at is not None:
        raise _unauthorized("invalid or revoked token")
    return Principal(owner=token.owner, admin=token.admin, token_id=token.id)


def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """The caller, if an admin. Raises ``ApiError`` 403 otherwise (401 first, as :func:`authenticate`)."""
    if not principal.admin:
        raise ApiError(403, "this needs an admin token")
    return principal


def can_see(principal: Principal, job: Job | JobView) -> bool:
    """Whether ``principal`` may see ``job``: its owner, or any admin (jobs without owner: admins only)."""
    return principal.admin or (job.owner is not None and job.owner == principal.owner)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name) only accepts connections from this machine."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> None:
    """Raise :class:`ExposureError` when authentication is off and ``settings.host`` is not a loopback address."""
    if not settings.auth and not is_loopback(settings.host):
        raise ExposureError(
            f"refusing to serve without authentication on {settings.host}: HALFCAST_AUTH=off is allowed "
            "only on a loopback address (127.0.0.1, ::1, localhost); turn authentication on, or bind to 127.0.0.1"
        )


PrincipalDep = Annotated[Principal, Depends(authenticate)]
AdminDep = Annotated[Principal, Depends(require_admin)]
