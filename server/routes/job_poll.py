"""``GET /jobs/{id}`` without FastAPI's router and dependency solving: the poll's shortcut.

Polling that one route is most of the API's traffic, and on it Starlette's routing (the
routes tried in turn), FastAPI's request wrapper (two exit stacks, the exception
wrapper) and dependency solving cost more than the answer itself.
:class:`JobPollShortcut` is the innermost middleware (inside metrics, the body limit and
admission): a ``GET`` whose path the route's own pattern matches is answered by
:func:`server.routes.job_resource.job_response` straight away, with the same bearer
scheme object, the same headers read the same way, and errors answered by the app's own
exception handlers (so 401, 404 and 503 are the bytes FastAPI would send). Everything
else, ``HEAD`` on this route included, goes on to FastAPI. The route stays declared as it
was, so the OpenAPI description does not change, and ``scope["route"]`` is set as routing
sets it (the request metric's ``route`` label).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from server.auth import bearer
from server.routes.job_resource import job_response

#: The header :func:`server.routes.job_resource.get_job` reads as ``if_none_match``.
IF_NONE_MATCH = "if-none-match"


class JobPollShortcut:
    """Answers ``GET`` requests for ``route`` (``/jobs/{job_id}``) itself; passes every other request to ``app``."""

    def __init__(self, app: ASGIApp, route: APIRoute) -> None:
        self.app = app
        self.route = route
        self._path = route.path_regex

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a poll, or pass the request on."""
        match = self._path.match(scope["path"]) if _plain_get(scope) else None
        if match is None:
            await self.app(scope, receive, send)
            return
        job_id = match["job_id"]
        scope["route"] = self.route
        scope["path_params"] = {"job_id": job_id}
        request = Request(scope, receive, send)
        try:
            response = await job_response(request, job_id, await bearer(request), request.headers.get(IF_NONE_MATCH))
        except Exception as exc:  # noqa: BLE001  # answered by the app's handler for it, or raised on as FastAPI would
            response = await _handled(request, exc)
        await response(scope, receive, send)


def _plain_get(scope: Scope) -> bool:
    """An HTTP ``GET`` served at the root (no ``root_path``: the path is the route path)."""
    return scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path")


async def _handled(request: Request, exc: Exception) -> Response:
    """The response of the app's exception handler for ``exc`` (looked up as Starlette does, by class); else re-raise."""
    handler = _handler_for(request.app.exception_handlers, exc)
    if handler is None:
        raise exc
    response = handler(request, exc)
    if inspect.isawaitable(response):
        response = await response
    if not isinstance(response, Response):
        raise TypeError(f"the handler for {type(exc).__name__} returned {response!r}, not a response")
    return response


def _handler_for(handlers: dict[Any, Callable[..., Any]], exc: Exception) -> Callable[..., Any] | None:
    """The handler registered for the nearest class of ``exc``; ``Exception``'s is the server error's, not looked at."""
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
