"""Declare in the OpenAPI schema the error answers that come from dependencies and middleware.

A route's own ``responses=`` names what its handler raises (404, 409, ...). Some
errors come from elsewhere and apply to every route that shares a dependency:

- ``401`` from :func:`server.auth.authenticate` (no, a malformed, unknown or revoked token);
- ``403`` from :func:`server.auth.require_admin` (a token that is not an admin's);
- ``503`` ``database unavailable`` (:mod:`server.http.errors`) for every route that uses
  the database: a session, or token resolution;
- ``413`` from :class:`server.http.body_limit.BodySizeLimitMiddleware` for every route
  with a request body.

:func:`declare_error_responses` (called after all routers are included) adds them to each route
when the OpenAPI description is first built, so a new route is documented by what it depends on, and clients and
schema-driven tests (``tests/server/test_fuzz_api.py``) see every status the API sends.
It also adds ``field`` to FastAPI's ``ValidationError`` schema: every 422 item has one
(:mod:`server.http.field_paths`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypedDict

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.utils import create_model_field
from pydantic import BaseModel

from server.auth import authenticate, require_admin
from server.deps import get_session
from server.schemas import ErrorBody


class _Declaration(TypedDict):
    """A declared answer, as a route's ``responses=`` entry: its body's model and a description."""

    model: type[BaseModel]
    description: str


_UNAUTHORIZED: _Declaration = {"model": ErrorBody, "description": "No token, or a malformed, unknown or revoked one"}
_FORBIDDEN: _Declaration = {"model": ErrorBody, "description": "The token is not an admin's"}
_TOO_LARGE: _Declaration = {"model": ErrorBody, "description": "The request body exceeds 1 MiB"}
_UNAVAILABLE: _Declaration = {"model": ErrorBody, "description": "The database is unreachable (`database unavailable`)"}
#: The ``field`` of a 422 item (:func:`server.http.field_paths.with_field`), as a property of ``ValidationError``.
FIELD_PROPERTY: dict[str, object] = {
    "type": "array",
    "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "title": "Field",
    "description": "The field inside its source: `loc` without `body`/`query`/`path`/`header` "
    'and without pydantic\'s union tags (`["model", "config", "hidden_sizes"]`)',
}


def dependency_calls(dependant: Dependant) -> Iterator[Callable[..., Any] | None]:
    """Every dependency callable of ``dependant``, sub-dependencies included."""
    for sub in dependant.dependencies:
        yield sub.call
        yield from dependency_calls(sub)


def _api_routes(app: FastAPI) -> Iterator[Any]:
    """The app's API routes as the OpenAPI description reads them: FastAPI >= 0.165's route contexts (each route
    with its routers' dependencies and responses; included routers stay nested), else the routes themselves."""
    iter_contexts = getattr(routing, "iter_route_contexts", None)
    if iter_contexts is None:
        yield from (route for route in app.routes if isinstance(route, APIRoute))
        return
    for context in iter_contexts(app.routes):
        if isinstance(context.original_route, APIRoute):
            yield context


def _extra_responses(route: Any) -> dict[int, _Declaration]:
    calls = set(dependency_calls(route.dependant))
    extra: dict[int, _Declaration] = {}
    if authenticate in calls:
        extra[401] = _UNAUTHORIZED
    if require_admin in calls:
        extra[403] = _FORBIDDEN
    if route.body_field is not None:
        extra[413] = _TOO_LARGE
    if calls & {authenticate, get_session}:
        extra[503] = _UNAVAILABLE
    return extra


def declare_error_responses(app: FastAPI) -> None:
    """Add 401/403/413/503 to the ``responses`` of every route that can answer them (a route's own entry wins).

    Also documents the ``field`` of every 422 item (:func:`_with_field_property`). Both happen when the
    OpenAPI description is first built, not here: finding a route's dependencies makes FastAPI (>= 0.165)
    build every route's request model at once, which it otherwise does on a route's first request
    (about 50 ms an app, once per API process and per test app).
    """
    build = app.openapi

    def openapi() -> dict[str, object]:
        fresh = app.openapi_schema is None
        if fresh:
            _add_error_responses(app)
        schema = build()
        return _with_field_property(schema) if fresh else schema

    app.openapi = openapi  # type: ignore[method-assign]  # how FastAPI lets an app change its schema


def _add_error_responses(app: FastAPI) -> None:
    for route in _api_routes(app):
        for status_code, declaration in _extra_responses(route).items():
            if status_code not in route.responses and str(status_code) not in route.responses:
                _declare(route, status_code, declaration)


def _declare(route: Any, status_code: int, declaration: _Declaration) -> None:
    """Add one answer to ``route`` as FastAPI does for a declared ``responses=`` entry: with its body's model field.

    Routes are declared once per process and shared by its apps (:mod:`server.http.built_routes`), so the
    first app's description adds them and later apps find them there.
    """
    route.responses[status_code] = declaration
    route.response_fields[status_code] = create_model_field(
        name=f"Response_{status_code}_{route.unique_id}", type_=declaration["model"], mode="serialization"
    )


def _with_field_property(schema: dict[str, object]) -> dict[str, object]:
    """``schema`` (the OpenAPI description, changed in place) with ``field`` in FastAPI's ``ValidationError``."""
    components = schema.get("components")
    schemas = components.get("schemas") if isinstance(components, dict) else None
    item = schemas.get("ValidationError") if isinstance(schemas, dict) else None
    if isinstance(item, dict):
        item.setdefault("properties", {})["field"] = FIELD_PROPERTY
    return schema
