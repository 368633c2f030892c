"""Request bodies parsed as strict JSON (:mod:`halfcast.common.strict_json`) on every route of a router that asks for it.

FastAPI reads a JSON body with ``Request.json()``, which is Python's lenient
:func:`json.loads`: ``NaN``, ``Infinity``, ``-Infinity`` and ``1e309`` came through as
floats, and the 422 echoing them could not be rendered (a 500). A router built with
``APIRouter(route_class=StrictJSONRoute)`` hands its handlers a
:class:`StrictJSONRequest` instead, whose ``json()`` raises
:class:`halfcast.common.strict_json.NonFiniteNumbers`; FastAPI turns that into its body-parsing
400, which :mod:`server.http.body_errors` answers as a 422 at each number's field.

The body is UTF-8 JSON and nothing else: a ``charset`` other than UTF-8 in ``Content-Type``
is a ``415``, and bytes that are not UTF-8 (UTF-16, UTF-32, with or without a byte order mark)
are a 422 at ``["body"]`` (Python's ``json.loads`` would guess the encoding of bytes).

Types are JSON's, strictly (:func:`strict_types`, a dependency after the token check): a string or
a boolean where the model wants a number, a number where it wants a string, a float where it wants
an integer are each a 422 at the field. FastAPI validates a body in pydantic's lax mode, where
``"5"`` and ``true`` are numbers; the dependency validates the raw body first in strict JSON mode.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import lru_cache
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError

from halfcast.common.strict_json import loads_strict
from server.http.errors import ApiError

#: The only character encoding a JSON body may declare (RFC 8259 section 8.1).
UTF8_NAMES = frozenset({"utf-8", "utf8"})


def _declared_charset(content_type: str) -> str | None:
    """The ``charset`` parameter of a ``Content-Type`` value, lowercased and unquoted; ``None`` without one."""
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def check_charset(request: Request) -> None:
    """``ApiError`` 415 when the request's ``Content-Type`` declares a charset other than UTF-8."""
    charset = _declared_charset(request.headers.get("content-type", ""))
    if charset is not None and charset not in UTF8_NAMES:
        raise ApiError(415, f"the body must be UTF-8 JSON; Content-Type declares charset={charset}")


class StrictJSONRequest(Request):
    """A request whose ``json()`` refuses non-finite numbers (:func:`halfcast.common.strict_json.loads_strict`)."""

    async def json(self) -> Any:
        """The body parsed as strict JSON (cached, like Starlette's)."""
        if not hasattr(self, "_strict_json"):
            self._strict_json = loads_strict((await self.body()).decode("utf-8"))
        return self._strict_json


class StrictJSONRoute(APIRoute):
    """An API route whose body is parsed by :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given a :class:`StrictJSONRequest` on the same ASGI scope and stream."""
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            check_charset(request)
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler


@lru_cache(maxsize=64)
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


async def strict_types(request: Request) -> None:
    """A dependency: the raw body validated in strict JSON mode against the route's body model; a 422 at each field.

    Put it after :func:`server.auth.authenticate` in a router's dependencies, so a caller
    without a token gets its 401 first. A route without a body, or a request without one,
    passes (FastAPI's own validation then answers as usual).
    """
    route = request.scope.get("route")
    body_field = route.body_field if isinstance(route, APIRoute) else None
    raw = await request.body()
    if body_field is None or not raw:
        return
    annotation: Any = body_field.field_info.annotation
    try:
        _adapter(annotation).validate_json(raw, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        if any(error["type"] == "json_invalid" for error in errors):
            return  # JSON the stdlib parsed but pydantic's parser does not (a lone surrogate): FastAPI's check answers
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in errors]) from None
