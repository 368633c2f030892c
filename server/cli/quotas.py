"""``halfcast quotas set|list|clear``: per-owner submission and storage limits in the database (operator commands).

Like ``halfcast tokens`` these use ``HALFCAST_DATABASE_URL`` (default: the embedded
SQLite file), not the API, and each change is audited (``quota.set``,
``quota.clear``) with the actor ``cli:<os user>``. A limit is a whole number >= 0,
or ``default`` to drop the owner's override of that limit (the server's
``HALFCAST_QUOTA_*`` default then applies; unset there means unlimited).
"""

from __future__ import annotations

import argparse
import sys

from halfcast.core.settings import Settings
from server.cli.db import operator_session
from server.cli.tokens import cli_actor

#: Exit status of a bad argument (bad owner, no limit given).
EXIT_INVALID = 2
#: The word that resets one limit to the server's default.
DEFAULT_WORD = "default"
#: CLI option of each limit.
OPTIONS = {
    "max_active_jobs": "--max-active-jobs",
    "max_gpus": "--max-gpus",
    "max_queued_jobs": "--max-queued-jobs",
    "max_storage_bytes": "--max-storage-bytes",
}


def limit_value(text: str) -> int | None:
    """A limit given on the command line: a whole number >= 0, or ``default`` (``None``). Raises ``ArgumentTypeError``."""
    if text.strip().lower() == DEFAULT_WORD:
        return None
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or {DEFAULT_WORD!r}, got {text!r}")
    return int(text)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``quotas`` command group."""
    parser = subparsers.add_parser("quotas", help="set, list and clear per-owner job quotas (database access)")
    commands = parser.add_subparsers(dest="quotas_command", metavar="QUOTAS_COMMAND", required=True)
    setter = commands.add_parser("set", help="override limits of one owner (others are kept)")
    setter.add_argument("owner")
    for name, option in OPTIONS.items():
        setter.add_argument(
            option,
            dest=name,
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N|default",
            help=f"{name.replace('_', ' ')} ('default': the server's HALFCAST_QUOTA_{name.upper()})",
        )
    setter.set_defaults(handler=run_set)
    listing = commands.add_parser("list", help="the server defaults and every owner's overrides")
    listing.set_defaults(handler=run_list)
    clear = commands.add_parser("clear", help="drop an owner's overrides (the defaults apply again)")
    clear.add_argument("owner")
    clear.set_defaults(handler=run_clear)


def _shown(value: int | None, default: int | None) -> str:
    if value is not None:
        return str(value)
    return f"default ({'unlimited' if default is None else default})"


def run_set(args: argparse.Namespace) -> int:
    """Set the given limits of an owner; 2 for a bad owner or when no limit is given."""
    from halfcast.core.db.quotas import set_quota

    values = {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}
    if not values:
        sys.stderr.write(f"error: give at least one of {', '.join(OPTIONS.values())}\n")
        return EXIT_INVALID
    try:
        with operator_session() as session:
            override = set_quota(session, args.owner, values, actor=cli_actor())
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_INVALID
    shown = ", ".join(
        f"{name}={'default' if getattr(override, name) is None else getattr(override, name)}" for name in OPTIONS
    )
    sys.stdout.write(f"quota of {args.owner.strip()}: {shown}\n")
    return 0


def run_list(_args: argparse.Namespace) -> int:
    """Print the server defaults, then one row per owner with an override."""
    from halfcast.core.db.quotas import list_overrides
    from server.quotas import default_limits

    defaults = default_limits(Settings())
    with operator_session() as session:
        overrides = list_overrides(session)
    rows: list[tuple[str, ...]] = [("OWNER", "MAX ACTIVE JOBS", "MAX GPUS", "MAX QUEUED JOBS", "MAX STORAGE BYTES")]
    rows.append(
        (
            "(server default)",
            *("unlimited" if getattr(defaults, n) is None else str(getattr(defaults, n)) for n in OPTIONS),
        )
    )
    for owner, limits in overrides:
        rows.append((owner, *(_shown(getattr(limits, n), getattr(defaults, n)) for n in OPTIONS)))
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    """Drop an owner's overrides (0 also when it had none)."""
    from halfcast.core.db.quotas import clear_quota

    with operator_session() as session:
        cleared = clear_quota(session, args.owner, actor=cli_actor())
    message = "cleared; the defaults apply" if cleared else "had no override; nothing changed"
    sys.stdout.write(f"quota of {args.owner.strip()}: {message}\n")
    return 0
