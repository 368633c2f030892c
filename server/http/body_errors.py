"""Answers for a body that cannot be parsed (the caller's 401 first, else a 422 naming why), and safe 422 rendering.

FastAPI reads and decodes a JSON body *before* it runs the route's dependencies, so
these things would otherwise go wrong for a body it cannot take:

- a caller without a valid token learns about the body (``422 json_invalid``) instead
  of getting the ``401`` every other unauthenticated request gets;
- a body that is not JSON at all (bytes that are not UTF-8, nesting beyond the
  parser's recursion limit) is a bare ``400 "There was an error parsing the body"``,
  not the ``422`` at ``["body"]`` that malformed JSON gets (docs/api.md, "Errors");
- a 422 echoes the rejected ``input``, and JSON text may hold lone surrogates
  (``"\ud800"``) that cannot be encoded as UTF-8: rendering that 422 failed with a 500.
  422s are rendered with ``ensure_ascii`` (:class:`AsciiJSONResponse`), which escapes them;
- a body with ``NaN``, ``Infinity``, ``-Infinity`` or ``1e309`` is not JSON either: routes
  of :class:`server.http.strict_body.StrictJSONRoute` refuse it while parsing, and the 422
  names each number's field (``["body", "max_grad_norm"]``). As a second line, a 422
  that still holds a non-finite float (an ``input`` echo, a ``ctx`` value) renders it as
  a string (``"NaN"``, ``"Infinity"``, ``"-Infinity"``) instead of failing;
- a ``loc`` through a union holds pydantic's tag of the member (``["body", "model", "mlp",
  "config", ...]``), which is no key of the body: every 422 item also gets ``field``, the
  path inside its source without those tags (:mod:`server.http.field_paths`).

:func:`install_body_error_handlers` fixes them: on a route that depends on
:func:`server.auth.authenticate`, the token is checked first; then the body error
is a 422 (FastAPI's format) whose ``msg`` says why the body could not be read.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from halfcast.common.strict_json import NONFINITE_MESSAGE, NonFiniteNumbers
from server.auth import authenticate
from server.http.errors import ApiError, ErrorItem, error_response
from server.http.field_paths import body_schema, with_field
from server.http.openapi_errors import dependency_calls

#: FastAPI's ``detail`` when it cannot read a body for a reason other than JSON syntax.
BODY_PARSE_DETAIL = "There was an error parsing the body"


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped, so any Python string renders (lone surrogates too)."""

    def render(self, content: Any) -> bytes:
        """``content`` as compact ASCII JSON; a non-finite float becomes the string ``NaN``/``Infinity``/``-Infinity``."""
        try:
            return _ascii_json(content)
        except ValueError:  # a non-finite float: strict JSON has no way to write it
            return _ascii_json(_finite_floats(content))


def _ascii_json(content: Any) -> bytes:
    return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _finite_floats(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every non-finite float replaced by its JavaScript name."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite_floats(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_floats(child) for child in value]
    return value


def _bearer_credentials(request: Request) -> HTTPAuthorizationCredentials | None:
    """The ``Authorization: Bearer <token>`` credentials, as ``HTTPBearer(auto_error=False)`` reads them."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=token)


def _needs_token(request: Request) -> bool:
    route = request.scope.get("route")
    return isinstance(route, APIRoute) and authenticate in set(dependency_calls(route.dependant))


async def unauthorized_response(request: Request) -> Response | None:
    """The 401 (or other auth error) ``request`` gets on a route that needs a token, else ``None``."""
    if not _needs_token(request):
        return None
    try:
        await run_in_threadpool(authenticate, request, _bearer_credentials(request))
    except ApiError as exc:
        return error_response(exc.status_code, exc.body, exc.headers)
    return None


def _is_body_parse_error(exc: RequestValidationError) -> bool:
    return any(error.get("type") == "json_invalid" for error in exc.errors())


async def _validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's 422, unless the body could not be parsed and the caller is not authenticated (401)."""
    if not isinstance(exc, RequestValidationError):  # registered for RequestValidationError only
        raise exc
    if _is_body_parse_error(exc) and (denied := await unauthorized_response(request)) is not None:
        return denied
    schema = _route_body_schema(request)
    items = [with_field(item, schema) for item in jsonable_encoder(exc.errors())]
    return AsciiJSONResponse({"detail": items}, status_code=422)


def _route_body_schema(request: Request) -> Any:
    """The core schema of the body the request's route validates, if it has one."""
    route = request.scope.get("route")
    body = route.body_field if isinstance(route, APIRoute) else None
    return body_schema(body.field_info.annotation) if body is not None else None


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's bare 400 for an unreadable body becomes a 422 at ``["body"]`` (after the token check)."""
    if not isinstance(exc, StarletteHTTPException):  # registered for HTTPException only
        raise exc
    if exc.status_code != 400 or exc.detail != BODY_PARSE_DETAIL or exc.__cause__ is None:
        return await http_exception_handler(request, exc)
    if (denied := await unauthorized_response(request)) is not None:
        return denied
    return AsciiJSONResponse(
        {"detail": [with_field(item, None) for item in _unreadable_body_errors(exc.__cause__)]}, 422
    )


def _unreadable_body_errors(cause: BaseException) -> list[ErrorItem]:
    """The 422 items for a body that could not be parsed: one per non-finite number, else one at ``["body"]``."""
    if isinstance(cause, NonFiniteNumbers):
        return [
            {"type": "json_invalid", "loc": ["body", *item.path], "msg": NONFINITE_MESSAGE, "input": item.text}
            for item in cause.found
        ]
    message = f"the body is not JSON: {type(cause).__name__}: {str(cause)[:200]}"
    return [{"type": "json_invalid", "loc": ["body"], "msg": message, "input": None}]


def install_body_error_handlers(app: FastAPI) -> None:
    """Register the handlers for validation errors and FastAPI's body-parsing 400."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
