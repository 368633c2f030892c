"""The typed errors of the Halfcast client: one class per kind of error answer, and the answer's fields.

:func:`raise_for_status` turns an error answer of the API into its class: :class:`ServerUnavailable` (no
connection, a timeout, or a 503), :class:`ValidationFailed` (422, with every :class:`FieldError`),
:class:`NotFound` (404), :class:`Conflict` (409), :class:`Unauthorized` (401), :class:`Forbidden` (403),
:class:`QuotaExceeded` (429), and :class:`HalfcastError` for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

#: The model an answer is read as.
M = TypeVar("M", bound=BaseModel)


class HalfcastError(Exception):
    """An error answer of the API (``status_code``; ``None`` when no answer came)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ServerUnavailable(HalfcastError):
    """The API could not be reached, timed out, or answered 503."""


class QuotaExceeded(HalfcastError):
    """429: the job would take its owner over quota ``limit`` (whose value is ``value``); retry after ``retry_after`` s."""

    def __init__(self, message: str, limit: str | None, value: int | None, retry_after: float | None) -> None:
        super().__init__(f"quota exceeded: {message}" if not message.startswith("quota") else message, 429)
        self.limit = limit
        self.value = value
        self.retry_after = retry_after


def _retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds, or ``None`` when absent or not a number."""
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


class NotFound(HalfcastError):
    """404: no such job."""


class Conflict(HalfcastError):
    """409: the request conflicts with the job's state (e.g. cancelling a finished job)."""


class Unauthorized(HalfcastError):
    """401: no token was sent, or it is unknown or revoked."""


class Forbidden(HalfcastError):
    """403: the request needs an admin token."""


@dataclass(frozen=True)
class FieldError:
    """One validation error: ``loc`` as the API gives it (``["body", "loss_scale", "init_scale"]``) and ``msg``.

    ``field``: the API's clean path of the field (``loc`` without its source and union tags), if it sent one.
    """

    loc: tuple[str | int, ...]
    msg: str
    type: str = ""
    field: tuple[str | int, ...] | None = None

    @property
    def path(self) -> str:
        """The field path without the leading ``body``/``query``: ``loss_scale.init_scale``, ``hidden_sizes[0]``."""
        parts = (
            self.field if self.field is not None else self.loc[1:] if self.loc and self.loc[0] == "body" else self.loc
        )
        text = ""
        for part in parts:
            text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
        return text or "(spec)"


class ValidationFailed(HalfcastError):
    """422: the request did not validate; ``errors`` names every bad field."""

    def __init__(self, errors: list[FieldError]) -> None:
        lines = "; ".join(f"{error.path}: {error.msg}" for error in errors)
        super().__init__(f"invalid request: {lines}", 422)
        self.errors = errors


def _field_error(item: Any) -> FieldError:
    """One 422 item as a :class:`FieldError` (``field`` only when the API sent a list)."""
    item = item if isinstance(item, dict) else {}
    field = item.get("field")
    return FieldError(
        tuple(item.get("loc", ())),
        str(item.get("msg", "")),
        str(item.get("type", "")),
        tuple(field) if isinstance(field, list) else None,
    )


def raise_for_status(response: httpx.Response) -> None:
    """Raise the typed error of an error answer."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text.strip() or response.reason_phrase}
    detail = body.get("detail") if isinstance(body, dict) else body
    if response.status_code == 422 and isinstance(detail, list):
        raise ValidationFailed([_field_error(item) for item in detail])
    message = str(detail)
    if response.status_code == 404:
        raise NotFound(message, 404)
    if response.status_code == 409:
        raise Conflict(message, 409)
    if response.status_code == 401:
        raise Unauthorized(f"not authenticated: {message}", 401)
    if response.status_code == 403:
        raise Forbidden(f"forbidden: {message}", 403)
    if response.status_code == 503:
        raise ServerUnavailable(message, 503)
    if response.status_code == 429 and isinstance(body, dict):
        raise QuotaExceeded(message, body.get("limit"), body.get("value"), _retry_after(response))
    raise HalfcastError(f"HTTP {response.status_code}: {message}", response.status_code)


def parse_model(model: type[M], body: Any) -> M:
    """``body`` (an answer's JSON) as ``model``; :class:`HalfcastError` when it does not validate."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise HalfcastError(f"the API answered a {model.__name__} that does not validate: {exc}") from exc
