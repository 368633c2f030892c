"""``halfcast audit``: the newest audit events (needs an admin token), from the API."""

from __future__ import annotations

import argparse
import json
import sys

# ``add_api_command`` gives the command the shared --url/--timeout/--token options and error reporting.
from halfcast.cli.jobs import add_api_command, client_for, format_time, write_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``audit``."""
    audit = add_api_command(subparsers, "audit", "show the audit log, newest first (admin token)", run_audit)
    audit.add_argument("--limit", type=int, default=50, help="at most this many events (default 50, at most 1000)")
    audit.add_argument(
        "--action",
        help="only this action: job.create, job.cancel, job.requeue, token.create, token.revoke, quota.set, quota.clear",
    )
    audit.add_argument("--json", action="store_true", help="print the events as JSON")


def run_audit(args: argparse.Namespace) -> int:
    """Print one page of audit events: time, actor, action, subject, details."""
    with client_for(args) as client:
        page = client.audit(limit=args.limit, action=args.action)
    if args.json:
        write_json([event.model_dump(mode="json") for event in page.events])
        return 0
    for event in page.events:
        details = json.dumps(event.details, sort_keys=True) if event.details else ""
        sys.stdout.write(f"{format_time(event.at)}  {event.actor}  {event.action}  {event.subject}  {details}\n")
    return 0
