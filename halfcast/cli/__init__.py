"""The ``halfcast`` command line: ``halfcast <group> ...``.

Each command group lives in its own module with a ``register(subparsers)`` function
that adds its sub-commands and sets ``handler`` (``(args) -> exit status``) on them: the
job commands here, the operator's in :mod:`server.cli`, ``halfcast worker`` in :mod:`worker.cli`.
Output for people goes to stdout; diagnostics go through ``logging`` (stderr).

Only the module of the command being run is imported (:data:`COMMANDS` says which
module holds each command): a job command such as ``halfcast list`` imports the HTTP
client, not the server's database, web framework, task queue or torch. The other
commands appear in ``--help`` with the help text of :data:`COMMANDS`. A command that
needs an extra this install lacks (``halfcast api`` after ``pip install halfcast``)
stops with the pip command that adds it (:mod:`halfcast.cli.extras`). This package names the
other packages' command modules only as strings, so it imports neither the server nor the worker.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Collection, Sequence
from types import ModuleType
from typing import NamedTuple

from halfcast.cli.extras import missing_extra_message, missing_extras
from halfcast.common.quiet_logs import quiet_third_party_logs
from halfcast.common.redact import install_log_redaction

#: Exit status of a command whose reader closed the pipe (``halfcast list | head``): 128 + SIGPIPE, as a shell reports it.
EXIT_BROKEN_PIPE = 141
#: Exit status of a command that needs an extra this install lacks (as for a usage error).
EXIT_MISSING_EXTRA = 2


class Command(NamedTuple):
    """Where a top-level command is registered (a module's dotted name), its one-line help, and its extras.

    ``extras`` names the extras of pyproject.toml the command needs beyond the client's
    own dependencies (:mod:`halfcast.cli.extras`); the job commands need none.
    """

    module: str
    help: str
    extras: tuple[str, ...] = ()


#: Every top-level command, in the order ``--help`` lists them. The help must be the one its module registers.
COMMANDS: dict[str, Command] = {
    "up": Command(
        "server.cli.services", "migrate, then run the API and a worker (embedded defaults)", ("server", "worker")
    ),
    "api": Command("server.cli.services", "run the HTTP API (uvicorn)", ("server",)),
    "worker": Command("worker.cli", "run a Celery worker; extra arguments go to Celery", ("worker",)),
    "db": Command("server.cli.db", "database schema commands", ("server",)),
    "tokens": Command("server.cli.tokens", "create, list and revoke API tokens (database access)", ("server",)),
    "quotas": Command("server.cli.quotas", "set, list and clear per-owner job quotas (database access)", ("server",)),
    "submit": Command("halfcast.cli.jobs", "submit a job spec (YAML or JSON file; - reads stdin)"),
    "list": Command("halfcast.cli.jobs", "list jobs, newest first"),
    "status": Command("halfcast.cli.jobs", "show one job"),
    "watch": Command("halfcast.cli.jobs", "follow a job live until it ends"),
    "cancel": Command("halfcast.cli.jobs", "cancel a job"),
    "logs": Command("halfcast.cli.logs", "print a rank's log (stdout and stderr) of a job"),
    "checkpoints": Command("halfcast.cli.checkpoints", "list a job's checkpoint files"),
    "download": Command("halfcast.cli.checkpoints", "download a job's checkpoint (default: the newest)"),
    "exports": Command("halfcast.cli.exports", "list a job's exports (adapter, model)"),
    "export": Command("halfcast.cli.exports", "download a job's export and unpack it as a directory"),
    "datasets": Command("halfcast.cli.datasets", "upload, list, show and delete registered datasets"),
    "models": Command("halfcast.cli.models", "upload, register, list, show and delete registered models"),
    "audit": Command("halfcast.cli.audit", "show the audit log, newest first (admin token)"),
}

#: The one global option, and its values.
LOG_LEVEL_OPTION = "--log-level"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def group_module(name: str) -> ModuleType:
    """The command-group module ``name`` (dotted), imported now."""
    return importlib.import_module(name)


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of ``halfcast``: every command (``None``), or the groups of ``commands`` only.

    With ``commands``, the modules of the other commands are not imported: those
    commands get a stand-in sub-parser with their help text, enough for ``--help``
    and for argparse's list of choices, but not for running them.
    """
    parser = argparse.ArgumentParser(prog="halfcast", description="Halfcast: training as a service.")
    parser.add_argument(LOG_LEVEL_OPTION, default="INFO", choices=LOG_LEVELS)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = {COMMANDS[name].module for name in (COMMANDS if commands is None else commands) if name in COMMANDS}
    registered: set[str] = set()
    for name, command in COMMANDS.items():
        if command.module not in wanted:
            subparsers.add_parser(name, help=command.help)
        elif command.module not in registered:
            group_module(command.module).register(subparsers)
            registered.add(command.module)
    return parser


def command_name(argv: Sequence[str]) -> str | None:
    """The top-level command ``argv`` names: its first word after the global options (``None`` without one)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return next(words, None)
        if not word.startswith("-"):
            return word
        if "=" not in word and len(word) > 2 and LOG_LEVEL_OPTION.startswith(word):
            next(words, None)  # the option's value (argparse takes any unambiguous prefix of the option)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``halfcast`` with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_name(argv)
    if command in COMMANDS and (missing := missing_extras(COMMANDS[command].extras)):
        sys.stderr.write(missing_extra_message(command, COMMANDS[command].extras, missing) + "\n")
        return EXIT_MISSING_EXTRA
    args = build_parser([command] if command else []).parse_args(argv)
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
