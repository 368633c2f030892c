"""``halfcast logs JOB_ID [--rank R] [--tail N] [--attempt N] [-f]``: a rank's stdout and stderr.

Prints the last ``--tail`` lines of the rank's log (newest attempt unless ``--attempt``)
on stdout, nothing else, so the output can be piped. With ``-f``/``--follow`` it
then prints new lines as they are written until the job ends; markers (which
attempt, how the job ended) go to stderr. Exit statuses as for the other job
commands (:mod:`halfcast.cli.jobs`): an unreachable server 3; an unknown job, one that
has not started, or a rank or attempt the job does not have 1 (what is not there, as
for a missing checkpoint); a negative ``--rank`` or an ``--attempt`` below 1 is a
usage error, 2; with ``-f``, 0 when the job succeeded and 1 when it failed or was
cancelled; Ctrl-C 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

# ``add_api_command`` gives the command the shared --url/--timeout options and error reporting.
from halfcast.cli.jobs import EXIT_ERROR, add_api_command, client_for
from halfcast.client import FieldError, HalfcastClient, ValidationFailed
from halfcast.contracts.events import LogAttempt, LogChunk, LogEnd
from halfcast.contracts.status import JobStatus

#: Options naming a part of the job: the API's 422 on one of them means the job has no such part.
JOB_PARTS = ("rank", "attempt")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``logs``."""
    logs = add_api_command(subparsers, "logs", "print a rank's log (stdout and stderr) of a job", run_logs)
    logs.add_argument("job_id")
    logs.add_argument("--rank", type=at_least(0), default=0, help="global rank (default 0)")
    logs.add_argument("--tail", type=int, default=200, help="last lines to print first (default 200, at most 10000)")
    logs.add_argument(
        "--attempt", type=at_least(1), default=None, help="attempt (default: the newest; -f follows retries)"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="print new lines until the job ends")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its "invalid int value" message
    return parse


def run_logs(args: argparse.Namespace) -> int:
    """Print the log's last lines, or follow it until the job ends; 1 for a rank or attempt the job does not have."""
    try:
        return _print_logs(args)
    except ValidationFailed as exc:
        if not (missing := _job_part_errors(exc)):
            raise  # a rejected argument (say, --tail over the limit): 2, reported as usual
        for error in missing:
            part = str(error.loc[-1])
            sys.stderr.write(f"error: job {args.job_id} has no {part} {getattr(args, part)}: {error.msg}\n")
        return EXIT_ERROR


def _job_part_errors(exc: ValidationFailed) -> list[FieldError]:
    """The errors of ``exc`` when each is on a :data:`JOB_PARTS` option (the job has no such part), else none."""
    parts = [error for error in exc.errors if error.loc in {("query", part) for part in JOB_PARTS}]
    return parts if len(parts) == len(exc.errors) else []


def _print_logs(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        if args.follow:
            return follow(client, args.job_id, args.rank, args.tail, args.attempt)
        body = client.logs(args.job_id, rank=args.rank, tail=args.tail, attempt=args.attempt)
    sys.stdout.writelines(line + "\n" for line in body.lines)
    return 0


def follow(client: HalfcastClient, job_id: str, rank: int, tail: int, attempt: int | None) -> int:
    """Print the followed log as it comes; 0 if the job succeeded, else 1."""
    status: JobStatus | None = None
    for event in client.follow_logs(job_id, rank=rank, tail=tail, attempt=attempt):
        data = event.data
        if isinstance(data, LogChunk):
            sys.stdout.writelines(line + "\n" for line in data.lines)
            sys.stdout.flush()
        elif isinstance(data, LogAttempt):
            sys.stderr.write(f"--- job {job_id}: attempt {data.attempt}, rank {data.rank} ---\n")
        elif isinstance(data, LogEnd):
            status = data.status
            sys.stderr.write(f"--- job {job_id}: {status} ---\n")
    return 0 if status == "succeeded" else EXIT_ERROR
