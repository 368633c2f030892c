"""``/session``: the dashboard's login. ``POST`` sets the session cookie for its event streams; ``DELETE`` clears it.

A browser's ``EventSource`` cannot send an ``Authorization`` header, so after the
user pastes a token the dashboard posts it here (as the bearer header) and the
answer sets :data:`server.auth.SESSION_COOKIE` to it: ``HttpOnly`` (scripts cannot
read it), ``SameSite=Strict`` (no cross-site request carries it), ``Path=/``, and
``Secure`` when the request came over HTTPS. The cookie authenticates ``GET`` and
``HEAD`` requests only; everything that changes state still needs the header.
It is a browser-session cookie (no ``Max-Age``), and stops working when the token
is revoked.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security.utils import get_authorization_scheme_param

from halfcast.contracts.access import SessionPublic
from server.auth import SESSION_COOKIE, PrincipalDep, authenticate

router = APIRouter(prefix="/session", tags=["session"], dependencies=[Depends(authenticate)])


@router.get("", response_model=SessionPublic)
def whoami(principal: PrincipalDep) -> SessionPublic:
    """The caller's owner name and whether it is an admin."""
    return SessionPublic(owner=principal.owner, admin=principal.admin)


@router.post("", response_model=SessionPublic)
def login(request: Request, response: Response, principal: PrincipalDep) -> SessionPublic:
    """Set the session cookie to the bearer token of this request (none is set when authentication is off)."""
    _scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    if token:
        secure = request.url.scheme == "https"
        response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="strict", path="/", secure=secure)
    return SessionPublic(owner=principal.owner, admin=principal.admin)


@router.delete("", status_code=204)
def logout(response: Response) -> Response:
    """Clear the session cookie."""
    response.status_code = 204
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
