"""``halfcast logs JOB_ID [--rank R] [--tail N] [--attempt N] [-f]``: a rank's stdout and stderr.

Prints the last ``--tail`` lines of the rank's log (newest attempt unless ``--attempt``)
on stdout, nothing else, so the output can be piped. With ``-f``/``--follow`` it
then prints new lines as they are written until the job ends; markers (which
attempt, how the job ended) go to stderr. Exit statuses as for the other job
commands (:mod:`server.cli.jobs`): an unreachable server 3, a rank or attempt the job
does not have 2, an unknown job or one that has not started 1; with ``-f``, 0 when
the job succeeded and 1 when it failed or was cancelled; Ctrl-C 130.
"""

from __future__ import annotations

import argparse
import sys

# ``add_api_command`` gives the command the shared --url/--timeout options and error reporting.
from server.cli.jobs import EXIT_ERROR, client_for
from server.cli.jobs import add_api_command
from server.client import HalfcastClient


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``logs``."""
    logs = add_api_command(subparsers, "logs", "print a rank's log (stdout and stderr) of a job", run_logs)
    logs.add_argument("job_id")
    logs.add_argument("--rank", type=int, default=0, help="global rank (default 0)")
    logs.add_argument("--tail", type=int, default=200, help="last lines to print first (default 200, at most 10000)")
    logs.add_argument("--attempt", type=int, default=None, help="attempt (default: the newest; -f follows retries)")
    logs.add_argument("-f", "--follow", action="store_true", help="print new lines until the job ends")


def run_logs(args: argparse.Namespace) -> int:
    """Print the log's last lines, or follow it until the job ends."""
    with client_for(args) as client:
        if args.follow:
            return follow(client, args.job_id, args.rank, args.tail, args.attempt)
        body = client.logs(args.job_id, rank=args.rank, tail=args.tail, attempt=args.attempt)
    sys.stdout.writelines(line + "\n" for line in body["lines"])
    return 0


def follow(client: HalfcastClient, job_id: str, rank: int, tail: int, attempt: int | None) -> int:
    """Print the followed log as it comes; 0 if the job succeeded, else 1."""
    status = None
    for event in client.follow_logs(job_id, rank=rank, tail=tail, attempt=attempt):
        if event.event == "lines":
            sys.stdout.writelines(line + "\n" for line in event.data["lines"])
            sys.stdout.flush()
        elif event.event == "attempt":
            sys.stderr.write(f"--- job {job_id}: attempt {event.data['attempt']}, rank {event.data['rank']} ---\n")
        elif event.event == "end":
            status = event.data["status"]
            sys.stderr.write(f"--- job {job_id}: {status} ---\n")
    return 0 if status == "succeeded" else EXIT_ERROR
