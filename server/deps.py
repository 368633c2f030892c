"""FastAPI dependencies as ``Annotated`` aliases; everything comes from ``app.state`` (set by the lifespan)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from halfcast.core.settings import Settings
from server.queue import JobQueue


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """A database session for one request, closed afterwards."""
    with request.app.state.session_factory() as session:
        yield session


def get_queue(request: Request) -> JobQueue:
    """The app's job queue (created once, in the lifespan)."""
    queue: JobQueue = request.app.state.queue
    return queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
QueueDep = Annotated[JobQueue, Depends(get_queue)]
