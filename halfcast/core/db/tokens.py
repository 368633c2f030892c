"""API tokens (``api_tokens``): create, revoke, list, and resolve a presented secret.

A token is ``hc_`` followed by 43 URL-safe base64 characters (32 random bytes from
:mod:`secrets`). Only its SHA-256 is stored. A fast, unsalted hash is the right tool
here, unlike for passwords: the secret has 256 bits of entropy, so neither a
dictionary nor brute force can invert the hash, and a deterministic hash lets the
lookup go through a unique index (``WHERE token_hash = ?``) instead of comparing the
secret with every row; the comparison an attacker could time is then of hashes of
their own guesses, which leaks nothing about stored secrets. The secret itself is
shown once, when created, and never stored or logged.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Update, func, select, update
from sqlalchemy.orm import Session

from halfcast.common.timeutil import as_utc
from halfcast.core.db import audit
from halfcast.core.db.engine import begin_write
from halfcast.core.db.models import ApiToken, utcnow

#: Prefix of every token (recognisable in leaked-secret scanners and config files).
TOKEN_PREFIX = "hc_"
#: Random bytes in a token.
TOKEN_BYTES = 32
#: ``last_used_at`` is rewritten at most this often per token (seconds), to keep requests read-only.
LAST_USED_RESOLUTION_S = 60.0
#: Longest owner name.
MAX_OWNER_LENGTH = 255


class TokenNotFound(LookupError):
    """No token has this id."""


@dataclass(frozen=True)
class NewToken:
    """A token just created: its row and the secret, which is not kept anywhere else."""

    row: ApiToken
    secret: str


def hash_token(secret: str) -> str:
    """Lowercase hex SHA-256 of ``secret`` (UTF-8), as stored in ``api_tokens.token_hash``."""
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_secret() -> str:
    """A new random token: ``hc_`` + 32 random bytes in URL-safe base64 (47 characters)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def validate_owner(owner: str) -> str:
    """``owner`` stripped; raises ``ValueError`` if empty, longer than 255 characters, or with control characters."""
    owner = owner.strip()
    if not owner or len(owner) > MAX_OWNER_LENGTH or not owner.isprintable():
        raise ValueError(f"an owner is 1 to {MAX_OWNER_LENGTH} printable characters, got {owner!r}")
    return owner


def create_token(session: Session, owner: str, *, admin: bool = False, actor: str, via: str = "cli") -> NewToken:
    """Store a new token for ``owner`` and audit it (``token.create`` by ``actor``); commit; return it with its secret.

    Raises ``ValueError`` for an invalid owner (see :func:`validate_owner`).
    """
    owner = validate_owner(owner)
    secret = generate_secret()
    row = ApiToken(owner=owner, admin=admin, token_hash=hash_token(secret), created_at=utcnow())
    session.add(row)
    session.flush()  # assigns the id the audit event names
    audit.add_event(session, actor, "token.create", str(row.id), {"owner": owner, "admin": admin, "via": via})
    session.commit()
    return NewToken(row, secret)


def revoke_token(session: Session, token_id: int, *, actor: str, via: str = "cli") -> ApiToken:
    """Revoke token ``token_id`` (idempotent: a revoked token keeps its first ``revoked_at``) and audit it.

    Read and write are one write transaction (:func:`halfcast.core.db.engine.begin_write`), so
    a concurrent writer never makes it fail with "database is locked" on SQLite.
    Raises :class:`TokenNotFound` for an unknown id, ``RuntimeError`` if ``session`` is
    already in a transaction.
    """
    begin_write(session)
    row = session.get(ApiToken, token_id, populate_existing=True)
    if row is None:
        raise TokenNotFound(token_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        audit.add_event(session, actor, "token.revoke", str(row.id), {"owner": row.owner, "via": via})
    session.commit()
    return row


def list_tokens(session: Session) -> list[ApiToken]:
    """Every token, oldest first (revoked ones included)."""
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def count_tokens(session: Session) -> int:
    """Number of tokens ever created (revoked ones included)."""
    return session.scalar(select(func.count()).select_from(ApiToken)) or 0


def resolve(session: Session, secret: str) -> ApiToken | None:
    """The live (not revoked) token whose secret is ``secret``, else ``None``; refreshes ``last_used_at``.

    ``last_used_at`` is written at most every :data:`LAST_USED_RESOLUTION_S` seconds per
    token, in a transaction of its own that is committed before returning.
    """
    if not plausible(secret):
        return None
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == hash_token(secret))).one_or_none()
    session.commit()  # end the read (SQLite: a read-then-write transaction could not upgrade its lock)
    if row is None or row.revoked_at is not None:
        return None
    now = utcnow()
    if last_use_is_stale(row.last_used_at, now):
        session.execute(touch_statement(row.id, now))
        session.commit()
    return row


def plausible(secret: str) -> bool:
    """Whether ``secret`` could be a token at all (prefix, length): anything else is refused without a query."""
    return secret.startswith(TOKEN_PREFIX) and len(secret) <= 256


def last_use_is_stale(last_used_at: datetime | None, now: datetime) -> bool:
    """Whether a token last used at ``last_used_at`` gets ``last_used_at`` rewritten now (:data:`LAST_USED_RESOLUTION_S`)."""
    return last_used_at is None or now - as_utc(last_used_at) > timedelta(seconds=LAST_USED_RESOLUTION_S)


def touch_statement(token_id: int, now: datetime) -> Update:
    """The ``UPDATE`` setting token ``token_id``'s ``last_used_at`` to ``now``."""
    return update(ApiToken).where(ApiToken.id == token_id).values(last_used_at=now)
