"""``halfcast tokens create|list|revoke``: manage API tokens in the database directly (operator commands).

Like ``halfcast db upgrade`` these use ``HALFCAST_DATABASE_URL`` (default: the
embedded SQLite file), not the API, and each change is written to the audit log
with the actor ``cli:<os user>``. ``create`` prints the new token once, on stdout
(or writes it to ``--file``); only its SHA-256 is stored. ``list`` never shows
secrets or hashes.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from pathlib import Path

from server.cli.db import operator_session

log = logging.getLogger(__name__)

#: Exit status of a bad argument (unknown token id, bad owner).
EXIT_INVALID = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``tokens`` command group."""
    parser = subparsers.add_parser("tokens", help="create, list and revoke API tokens (database access)")
    commands = parser.add_subparsers(dest="tokens_command", metavar="TOKENS_COMMAND", required=True)
    create = commands.add_parser("create", help="create a token and print it once")
    create.add_argument("--owner", required=True, help="who the token's jobs belong to")
    create.add_argument("--admin", action="store_true", help="an admin token: sees every job, /metrics and /audit")
    create.add_argument("--file", type=Path, help="write the token to this file instead of printing it")
    create.add_argument(
        "--file-mode", type=lambda text: int(text, 8), default=0o600, help="permissions of --file, octal (default 600)"
    )
    create.add_argument("--if-missing", action="store_true", help="with --file: do nothing if the file exists")
    create.set_defaults(handler=run_create)
    listing = commands.add_parser("list", help="list tokens (id, owner, admin, created, last used, revoked)")
    listing.set_defaults(handler=run_list)
    revoke = commands.add_parser("revoke", help="revoke a token by id (its requests get 401 from then on)")
    revoke.add_argument("token_id", type=int)
    revoke.set_defaults(handler=run_revoke)


def cli_actor() -> str:
    """The audit actor of an operator command: ``cli:<os user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (containers)
        return "cli:unknown"


def run_create(args: argparse.Namespace) -> int:
    """Create a token; print it (or write ``--file``); 2 for an invalid owner."""
    from halfcast.cli.credentials import write_token_file
    from halfcast.core.db.tokens import create_token

    if args.if_missing and args.file is not None and args.file.exists():
        sys.stderr.write(f"{args.file} exists; no token created\n")
        return 0
    try:
        with operator_session() as session:
            token = create_token(session, args.owner, admin=args.admin, actor=cli_actor())
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_INVALID
    kind = "admin token" if args.admin else "token"
    if args.file is not None:
        write_token_file(args.file, token.secret, args.file_mode)
        sys.stderr.write(f"{kind} {token.row.id} for {token.row.owner} written to {args.file}\n")
        return 0
    sys.stderr.write(f"{kind} {token.row.id} for {token.row.owner} (shown once; only its hash is stored):\n")
    sys.stdout.write(token.secret + "\n")
    return 0


def _when(value: object) -> str:
    return "-" if value is None else str(value)[:19].replace("T", " ")


def run_list(_args: argparse.Namespace) -> int:
    """Print a table of every token (no secrets, no hashes)."""
    from halfcast.core.db.tokens import list_tokens

    with operator_session() as session:
        rows = [("ID", "OWNER", "ADMIN", "CREATED", "LAST USED", "REVOKED")]
        for token in list_tokens(session):
            rows.append(
                (
                    str(token.id),
                    token.owner,
                    "yes" if token.admin else "no",
                    _when(token.created_at),
                    _when(token.last_used_at),
                    _when(token.revoked_at),
                )
            )
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    """Revoke a token; 2 for an unknown id."""
    from halfcast.core.db.tokens import TokenNotFound, revoke_token

    try:
        with operator_session() as session:
            row = revoke_token(session, args.token_id, actor=cli_actor())
    except TokenNotFound:
        sys.stderr.write(f"error: no token has id {args.token_id}\n")
        return EXIT_INVALID
    sys.stdout.write(f"token {row.id} of {row.owner} revoked at {_when(row.revoked_at)}\n")
    return 0
