"""Request bodies parsed as strict JSON (:mod:`server.http.strict_json`) on every route of a router that asks for it.

FastAPI reads a JSON body with ``Request.json()``, which is Python's lenient
:func:`json.loads`: ``NaN``, ``Infinity``, ``-Infinity`` and ``1e309`` came through as
floats, and the 422 echoing them could not be rendered (a 500). A router built with
``APIRouter(route_class=StrictJSONRoute)`` hands its handlers a
:class:`StrictJSONRequest` instead, whose ``json()`` raises
:class:`server.http.strict_json.NonFiniteNumbers`; FastAPI turns that into its body-parsing
400, which :mod:`server.http.body_errors` answers as a 422 at each number's field.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from server.http.strict_json import loads_strict


class StrictJSONRequest(Request):
    """A request whose ``json()`` refuses non-finite numbers (:func:`server.http.strict_json.loads_strict`)."""

    async def json(self) -> Any:
        """The body parsed as strict JSON (cached, like Starlette's)."""
        if not hasattr(self, "_strict_json"):
            self._strict_json = loads_strict(await self.body())
        return self._strict_json


class StrictJSONRoute(APIRoute):
    """An API route whose body is parsed by :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given a :class:`StrictJSONRequest` on the same ASGI scope and stream."""
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
