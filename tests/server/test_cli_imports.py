"""What a CLI command imports: a job command runs without the server's packages, and the dispatcher loads one group.

Each check runs in a fresh interpreter (a subprocess), so what this test process has
already imported does not hide an import. The job commands run against a closed port:
they get as far as the connection error (exit 3), which is every import they make.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from server.cli import COMMANDS, build_parser, command_name
from server.data_dir import DEFAULT_DATA_DIR, data_dir_from_environment
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "digits-fp16.json"
#: Packages of the server, the worker and the trainer that no job command may import.
SERVER_SIDE = ("torch", "sqlalchemy", "fastapi", "starlette", "celery", "kombu", "uvicorn", "alembic", "pydantic_settings",
               "worker", "trainer", "server.app", "server.db")  # fmt: skip
#: Every command that talks to the API, with arguments that get it to its first request.
JOB_COMMANDS = (["list"], ["status", "j"], ["watch", "j"], ["cancel", "j"], ["submit", str(SPEC)], ["logs", "j"],
                ["logs", "j", "-f"], ["checkpoints", "j"], ["download", "j"], ["exports", "j"],
                ["export", "j", "model"], ["audit"], ["datasets", "upload", str(SPEC), "--format", "text"],
                ["datasets", "list"], ["datasets", "show", "d"], ["datasets", "delete", "d"],
                ["models", "upload", str(SPEC.parent)], ["models", "list"], ["models", "show", "m"],
                ["models", "delete", "m"], ["models", "register", "j"])  # fmt: skip

#: Runs each command of argv (a JSON list of argument lists) with main(); prints the exit statuses and the modules loaded.
PROBE = """
import json, sys
from server.cli import main
statuses = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"statuses": statuses, "modules": sorted(sys.modules)}))
"""


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(commands: list[list[str]], tmp_path: Path) -> tuple[list[int], set[str]]:
    """Exit statuses of ``commands`` run one after the other in a fresh interpreter, and every module it had loaded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HALFCAST_URL": f"http://127.0.0.1:{closed_port()}",
           "HALFCAST_DATA_DIR": str(tmp_path), "HALFCAST_TOKEN": "hc_test"}  # fmt: skip
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    report = json.loads(result.stdout.splitlines()[-1])
    return report["statuses"], set(report["modules"])


def loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The ``packages`` of which ``modules`` holds the package itself or a submodule."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


def test_job_commands_import_no_server_side_package(tmp_path: Path) -> None:
    statuses, modules = probe([list(argv) for argv in JOB_COMMANDS], tmp_path)
    assert statuses == [3] * len(JOB_COMMANDS)  # each reached the (closed) API
    assert loaded(modules, SERVER_SIDE) == []


def test_the_dispatcher_imports_only_the_group_of_the_command(tmp_path: Path) -> None:
    _, modules = probe([["list"]], tmp_path)
    groups = {command.module for command in COMMANDS.values()}
    assert sorted(g for g in groups if f"server.cli.{g}" in modules) == ["jobs"]


def test_top_level_help_lists_every_command_as_its_module_registers_it() -> None:
    """The help text of :data:`COMMANDS` (shown without importing the groups) is the groups' own, in the same order."""
    assert build_parser([]).format_help() == build_parser().format_help()


@pytest.mark.parametrize(
    ("argv", "name"),
    [(["list"], "list"), (["--log-level", "DEBUG", "logs", "j"], "logs"), (["--log-level=ERROR", "up"], "up"),
     (["--log", "WARNING", "db", "upgrade"], "db"), (["-h"], None), ([], None), (["--", "status", "j"], "status")],
)  # fmt: skip
def test_command_name_is_the_first_word_after_the_global_options(argv: list[str], name: str | None) -> None:
    assert command_name(argv) == name


@pytest.mark.parametrize(
    "environ",
    [{}, {"HALFCAST_DATA_DIR": "/srv/halfcast"}, {"HALFCAST_DATA_DIR": "rel/data"}, {"HALFCAST_DATA_DIR": "~/hc"},
     {"halfcast_data_dir": "/lower/case"}],
)  # fmt: skip
def test_the_cli_finds_the_data_dir_settings_would(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.lower() == "halfcast_data_dir"]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert data_dir_from_environment() == Settings().resolved_data_dir
    assert Settings.model_fields["data_dir"].default == DEFAULT_DATA_DIR
