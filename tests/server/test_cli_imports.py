"""What a CLI command imports: a job command runs without the server's packages, and the dispatcher loads one group.

Each check runs in a fresh interpreter (a subprocess), so what this test process has
already imported does not hide an import. The job commands run against a closed port:
they get as far as the connection error (exit 3), which is every import they make.
A client-only install (``pip install halfcast``) is played by an import hook that
answers every server-side package as missing: the client and the job commands run,
and each command of an extra says which one to install (:mod:`halfcast.cli.extras`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from halfcast.cli import COMMANDS, EXIT_MISSING_EXTRA, build_parser, command_name
from halfcast.core.data_dir import DEFAULT_DATA_DIR, data_dir_from_environment
from halfcast.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "digits-fp16.json"
#: Packages of the server, the worker and the trainer that no job command may import (none in a client-only install;
#: pydantic is the client's own, for its typed answers).
SERVER_SIDE = (
    "torch",
    "sqlalchemy",
    "fastapi",
    "fastapi_offline",
    "starlette",
    "celery",
    "kombu",
    "redis",
    "uvicorn",
    "alembic",
    "psycopg",
    "pydantic_settings",
    "prometheus_client",
    "transformers",
    "peft",
    "sklearn",
    "safetensors",
    "tokenizers",
    "halfcast.core.db",
    "halfcast.core.settings",
    "halfcast.core.broker",
    "worker",
    "trainer",
    "server.app",
    "server.db",
)
#: Every command that talks to the API, with arguments that get it to its first request.
JOB_COMMANDS = (
    ["list"],
    ["status", "j"],
    ["watch", "j"],
    ["cancel", "j"],
    ["submit", str(SPEC)],
    ["logs", "j"],
    ["logs", "j", "-f"],
    ["checkpoints", "j"],
    ["download", "j"],
    ["exports", "j"],
    ["export", "j", "model"],
    ["audit"],
    ["datasets", "upload", str(SPEC), "--format", "text"],
    ["datasets", "list"],
    ["datasets", "show", "d"],
    ["datasets", "delete", "d"],
    ["models", "upload", str(SPEC.parent)],
    ["models", "list"],
    ["models", "show", "m"],
    ["models", "delete", "m"],
    ["models", "register", "j"],
)

#: Runs each command of argv (a JSON list of argument lists) with main(); prints the exit statuses and the modules loaded.
PROBE = """
import json, sys
from halfcast.cli import main
statuses = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"statuses": statuses, "modules": sorted(sys.modules)}))
"""

#: The commands of the extras, each with the extras it needs.
EXTRA_COMMANDS = (
    (["api"], "server"),
    (["db", "upgrade"], "server"),
    (["tokens", "list"], "server"),
    (["quotas", "list"], "server"),
    (["worker"], "worker"),
    (["up"], "server,worker"),
)

#: PROBE where the packages of argv[2] (JSON) are missing; it builds a client first, and counts --help's exit.
CLIENT_ONLY_PROBE = """
import importlib.abc, json, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == package or name.startswith(package + ".") for package in json.loads(sys.argv[2])):
            raise ModuleNotFoundError(f"No module named {name!r} (client-only install)", name=name)
        return None

sys.meta_path.insert(0, Missing())
from halfcast.cli import main
from halfcast.client import HalfcastClient
HalfcastClient("http://127.0.0.1:1", token="hc_test").close()
statuses = []
for argv in json.loads(sys.argv[1]):
    try:
        statuses.append(main(argv))
    except SystemExit as stop:  # --help
        statuses.append(stop.code)
print(json.dumps({"statuses": statuses, "modules": sorted(sys.modules)}))
"""


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(
    commands: list[list[str]],
    tmp_path: Path,
    missing: tuple[str, ...] | None = None,
) -> tuple[list[int], set[str], str]:
    """Exit statuses of ``commands`` run one after the other in a fresh interpreter, the modules it loaded, its stderr.

    With ``missing``, those packages cannot be imported there (:data:`CLIENT_ONLY_PROBE`).
    """
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HALFCAST_URL": f"http://127.0.0.1:{closed_port()}",
        "HALFCAST_DATA_DIR": str(tmp_path),
        "HALFCAST_TOKEN": "hc_test",
    }
    script, extra = (PROBE, []) if missing is None else (CLIENT_ONLY_PROBE, [json.dumps(missing)])
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(commands), *extra],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(result.stdout.splitlines()[-1])
    return report["statuses"], set(report["modules"]), result.stderr


def loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The ``packages`` of which ``modules`` holds the package itself or a submodule."""
    return [p for p in packages if any(m == p or m.startswith(p + ".") for m in modules)]


def test_job_commands_import_no_server_side_package(tmp_path: Path) -> None:
    statuses, modules, _ = probe([list(argv) for argv in JOB_COMMANDS], tmp_path)
    assert statuses == [3] * len(JOB_COMMANDS)  # each reached the (closed) API
    assert loaded(modules, SERVER_SIDE) == []


def test_a_client_only_install_runs_the_client_and_every_job_command(tmp_path: Path) -> None:
    statuses, modules, _ = probe([*map(list, JOB_COMMANDS), ["list", "--help"]], tmp_path, missing=SERVER_SIDE)
    assert statuses == [3] * len(JOB_COMMANDS) + [0]
    assert loaded(modules, SERVER_SIDE) == []


def test_a_client_only_install_names_the_extra_of_every_other_command(tmp_path: Path) -> None:
    statuses, _, stderr = probe([argv for argv, _ in EXTRA_COMMANDS], tmp_path, missing=SERVER_SIDE)
    assert statuses == [EXIT_MISSING_EXTRA] * len(EXTRA_COMMANDS)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(EXTRA_COMMANDS)
    for (argv, extras), error in zip(EXTRA_COMMANDS, errors, strict=True):
        assert error.startswith(f"error: halfcast {argv[0]} needs the ")
        assert error.endswith(f"pip install 'halfcast[{extras}]'")


def test_a_server_install_runs_the_server_commands_and_names_the_worker_extra(tmp_path: Path) -> None:
    trainer_side = ("torch", "transformers", "peft", "sklearn", "safetensors", "tokenizers")
    statuses, _, stderr = probe([["api", "--help"], ["db", "--help"], ["worker"]], tmp_path, missing=trainer_side)
    assert statuses == [0, 0, EXIT_MISSING_EXTRA]
    assert "halfcast worker needs the worker extra (missing: torch, sklearn, transformers and 3 more)" in stderr


def test_the_dispatcher_imports_only_the_group_of_the_command(tmp_path: Path) -> None:
    _, modules, _ = probe([["list"]], tmp_path)
    groups = {command.module for command in COMMANDS.values()}
    assert sorted(g for g in groups if g in modules) == ["halfcast.cli.jobs"]


def test_top_level_help_lists_every_command_as_its_module_registers_it() -> None:
    """The help text of :data:`COMMANDS` (shown without importing the groups) is the groups' own, in the same order."""
    assert build_parser([]).format_help() == build_parser().format_help()


@pytest.mark.parametrize(
    ("argv", "name"),
    [(["list"], "list"), (["--log-level", "DEBUG", "logs", "j"], "logs"), (["--log-level=ERROR", "up"], "up"),
     (["--log", "WARNING", "db", "upgrade"], "db"), (["-h"], None), ([], None), (["--", "status", "j"], "status")],
)  # fmt: skip  # a case table, laid out by hand
def test_command_name_is_the_first_word_after_the_global_options(argv: list[str], name: str | None) -> None:
    assert command_name(argv) == name


@pytest.mark.parametrize(
    "environ",
    [{}, {"HALFCAST_DATA_DIR": "/srv/halfcast"}, {"HALFCAST_DATA_DIR": "rel/data"}, {"HALFCAST_DATA_DIR": "~/hc"},
     {"halfcast_data_dir": "/lower/case"}],
)  # fmt: skip  # a case table, laid out by hand
def test_the_cli_finds_the_data_dir_settings_would(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.lower() == "halfcast_data_dir"]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert data_dir_from_environment() == Settings().resolved_data_dir
    assert Settings.model_fields["data_dir"].default == DEFAULT_DATA_DIR
