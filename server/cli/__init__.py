"""The ``halfcast`` command line: ``halfcast <group> ...``.

Each command group lives in its own module with a ``register(subparsers)`` function
that adds its sub-commands and sets ``handler`` (``(args) -> exit status``) on them.
Output for people goes to stdout; diagnostics go through ``logging`` (stderr).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from server.cli import audit, checkpoints, db, exports, jobs, logs, quotas, services, tokens
from server.quiet_logs import quiet_third_party_logs
from server.redact import install_log_redaction

#: Exit status of a command whose reader closed the pipe (``halfcast list | head``): 128 + SIGPIPE, as a shell reports it.
EXIT_BROKEN_PIPE = 141

#: Command-group modules, in the order ``--help`` lists them.
GROUPS = (services, db, tokens, quotas, jobs, logs, checkpoints, exports, audit)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``halfcast`` command."""
    parser = argparse.ArgumentParser(prog="halfcast", description="Halfcast: training as a service.")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in GROUPS:
        group.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``halfcast`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    quiet_third_party_logs(args.log_level)
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_left()
    return status


def _reader_left() -> int:
    """The reader of stdout closed it: stop quietly, as ``head`` expects (no traceback, no flush error at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout again at exit; let that write go nowhere
    os.close(devnull)
    return EXIT_BROKEN_PIPE
