"""README.md is a short front door and docs/ holds the reference; both agree with the code.

- every relative link in README.md and docs/*.md points to a file that exists (and to a heading of it,
  for ``#anchor`` links), and every docs/*.md is linked from README.md;
- README.md stays under 200 lines, none over 120 characters (a line that is only a URL excepted);
- the endpoint table of docs/api.md lists exactly the app's routes, its Prometheus table exactly the
  series ``GET /metrics`` exposes, docs/configuration.md every ``HALFCAST_*`` setting, docs/cli.md every
  ``halfcast`` command;
- the Docker Compose commands the docs give for minting a token are real ``halfcast`` commands run in a
  service of the compose file;
- every ``*.md`` file the code's docstrings and comments cite exists.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOC_FILES = sorted(DOCS.glob("*.md"))
MARKDOWN = [README, *DOC_FILES]
README_MAX_LINES = 200
MAX_LINE = 120
#: The folders of Python code whose docstrings and comments may cite documents.
CODE_DIRS = ("halfcast", "server", "worker", "trainer", "migrations", "bench", "tests")
#: A cited document: a path ending in ``.md``.
CITED_DOCUMENT = re.compile(r"[\w./-]*\w\.md\b")

#: ``[text](target)``: the target up to the first space or closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: ``METHOD /path`` in a backticked cell of an endpoint table.
ENDPOINT = re.compile(r"^(GET|HEAD|POST|PUT|PATCH|DELETE) (/\S*)$")


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link outside code (fenced blocks and inline code spans)."""
    found = []
    for number, line in prose_lines(path):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            found.append((number, target))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of every heading of ``path`` (repeated headings get ``-1``, ``-2``... as on GitHub)."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(path):
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def table_after(path: Path, heading: str) -> list[list[str]]:
    """The cells of the body rows of the first table after the line ``heading``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            break
    assert len(rows) > 2, f"{path.name}: no table after {heading!r}"
    return rows[2:]  # below the header and its |---| line


# ----------------------------------------------------------------------------- links and the README


@pytest.mark.parametrize("path", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for number, target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{path.name}:{number}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{path.name}:{number}: {target} (no heading #{anchor} in {linked.name})")
    assert not broken, "\n".join(broken)


def test_the_code_cites_only_documents_the_repository_has() -> None:
    """A ``*.md`` named in a Python file is a path from the repository's root, from docs/ or from the file's folder."""
    missing = []
    for path in sorted(p for folder in CODE_DIRS for p in (ROOT / folder).rglob("*.py")):
        for name in set(CITED_DOCUMENT.findall(path.read_text(encoding="utf-8"))):
            if not any((base / name).is_file() for base in (ROOT, DOCS, path.parent)):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in links(README)}
    missing = [doc.relative_to(ROOT).as_posix() for doc in DOC_FILES if doc.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"
    long = [
        f"{number}: {len(line)} characters"
        for number, line in enumerate(lines, start=1)
        if len(line) > MAX_LINE and not re.fullmatch(r"\s*<?https?://\S+>?\s*", line)
    ]
    assert not long, f"README.md lines over {MAX_LINE} characters:\n" + "\n".join(long)


# ----------------------------------------------------------------------------- references against the code


def documented_endpoints() -> set[tuple[str, str]]:
    """(method, path) of every route in the endpoint table of docs/api.md (``{id}`` as the app's ``{job_id}``)."""
    found: set[tuple[str, str]] = set()
    for row in table_after(DOCS / "api.md", "## Endpoints"):
        path = None
        for code in re.findall(r"`([^`]+)`", row[0]):
            if match := ENDPOINT.match(code):
                method, path = match.group(1), match.group(2).split("?")[0].replace("{id}", "{job_id}")
                found.add((method, path))
            elif code == "HEAD" and path is not None:  # "`GET /x` (and `HEAD`)"
                found.add(("HEAD", path))
    return found


def app_endpoints() -> set[tuple[str, str]]:
    """(method, path) of every route of the app, HEAD included (mounted static files excluded)."""
    from starlette.routing import Mount

    from halfcast.core.settings import Settings
    from server.app import create_app

    def flatten(routes: list[Any]) -> Iterator[Any]:
        for route in routes:
            if isinstance(route, Mount):
                continue
            if hasattr(route, "effective_route_contexts"):  # FastAPI wraps included routers
                yield from route.effective_route_contexts()
            else:
                yield route

    app = create_app(Settings(auth=True))
    return {(method, route.path) for route in flatten(app.routes) for method in (route.methods or ())}


def test_the_endpoint_table_lists_every_route() -> None:
    documented, served = documented_endpoints(), app_endpoints()
    assert documented == served, {"undocumented": sorted(served - documented), "unknown": sorted(documented - served)}


#: Series only an API on PostgreSQL exposes (HALFCAST_POLL_READS=notified): tests/server/test_notified_reads.py reads them.
POSTGRESQL_ONLY_SERIES = {"halfcast_poll_change_feed_listening", "halfcast_poll_change_feed_losses_total"}


def exposed_metrics(tmp_path: Path) -> set[str]:
    """The series names ``GET /metrics`` declares (``# TYPE`` lines), from a fresh app on a migrated SQLite."""
    from fastapi.testclient import TestClient

    from halfcast.core.db.engine import make_engine, make_session_factory
    from halfcast.core.db.migrate import upgrade_database
    from halfcast.core.db.tokens import create_token
    from halfcast.core.settings import Settings
    from server.app import create_app

    url = f"sqlite:///{tmp_path / 'halfcast.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            token = create_token(session, "docs", admin=True, actor="cli:test")
            session.commit()
    finally:
        engine.dispose()
    # Explicit database and broker (the embedded one under data_dir): never the environment's.
    # Polls keeping reads a while: halfcast_poll_reads_total is only exposed then.
    settings = Settings(data_dir=tmp_path, database_url=url, broker_url=None, auth=True, poll_max_age_s=0.5)
    with TestClient(create_app(settings)) as client:
        answer = client.get("/metrics", headers={"Authorization": f"Bearer {token.secret}"})
    assert answer.status_code == 200, answer.text
    return {line.split()[2] for line in answer.text.splitlines() if line.startswith("# TYPE ")}


def test_the_prometheus_table_lists_every_series(tmp_path: Path) -> None:
    documented = {
        name
        for row in table_after(DOCS / "api.md", "## Prometheus series")
        for name in re.findall(r"`(halfcast_\w+)", row[0])
    }
    exposed = exposed_metrics(tmp_path) | POSTGRESQL_ONLY_SERIES
    assert documented == exposed, {
        "undocumented": sorted(exposed - documented),
        "unknown": sorted(documented - exposed),
    }


def test_the_configuration_doc_names_every_setting() -> None:
    from halfcast.core.settings import Settings
    from server.streams.stats import EventStreamSettings

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    variables = {f"HALFCAST_{name.upper()}" for name in Settings.model_fields}
    variables |= {f"HALFCAST_EVENTS_{name.upper()}" for name in EventStreamSettings.model_fields}
    variables |= {"HALFCAST_URL", "HALFCAST_TOKEN"}  # read by the CLI (halfcast/client.py, halfcast/cli/credentials.py)
    documented = set(re.findall(r"`(HALFCAST_[A-Z_]+)`", text))
    assert documented == variables, {
        "undocumented": sorted(variables - documented),
        "unknown": sorted(documented - variables),
    }


def cli_commands() -> set[str]:
    """Every ``halfcast`` command, with its sub-command for groups: ``submit``, ``tokens create``..."""
    import argparse

    from halfcast.cli import build_parser

    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:  # argparse has no public way to list sub-parsers
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    commands = set()
    for name, parser in subcommands(build_parser()).items():
        nested = subcommands(parser)
        commands |= {f"{name} {sub}" for sub in nested} if nested else {name}
    return commands


def test_the_cli_doc_shows_every_command() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing = sorted(command for command in cli_commands() if not re.search(rf"halfcast {command}\b", text))
    assert not missing, f"docs/cli.md shows no `halfcast ...` line for {missing}"


# ----------------------------------------------------------------------------- the first token under Docker Compose


def compose_commands(path: Path) -> list[list[str]]:
    """The argv of every ``docker compose run ... halfcast ...`` line in ``path``'s code blocks."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if match := re.search(r"docker compose run [^`#)]*", line):
            text = match.group(0).strip().rstrip(")")
            argv = shlex.split(text)
            if "halfcast" in argv and "..." not in argv:
                found.append(argv)
    return found


def test_the_documented_compose_token_commands_work() -> None:
    from halfcast.cli import build_parser

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    image = services["api"]["image"]
    commands = compose_commands(README) + compose_commands(DOCS / "deployment.md") + compose_commands(DOCS / "cli.md")
    first_token = [
        argv for argv in compose_commands(README) if argv[argv.index("halfcast") + 1 :][:2] == ["tokens", "create"]
    ]
    assert first_token, "README.md gives no `docker compose run ... halfcast tokens create` command"
    for argv in commands:
        at = argv.index("halfcast")
        options, service = argv[3 : at - 1], argv[at - 1]
        assert set(options) <= {"--rm", "-T"}, argv
        assert services.get(service, {}).get("image") == image, f"{service}: not a service of the halfcast image"
        try:
            args = build_parser().parse_args(argv[at + 1 :])
        except SystemExit as exc:
            pytest.fail(f"`{shlex.join(argv)}` is not a halfcast command (exit {exc.code})")
        if argv in first_token:
            assert args.admin and args.file is None, "the first token is an admin token, printed"


def _backticked_words(text: str) -> set[str]:
    """Every word inside backticks in ``text`` (split at spaces, commas, brackets, slashes and colons), and each whole span."""
    spans = set(re.findall(r"`([^`]+)`", text))
    return spans | {word for span in spans for word in re.split(r"[\s,()/:]+", span) if word}


def modules_not_named(package: str, doc: Path) -> list[str]:
    """The modules of ``package`` that ``doc`` names nowhere (dotted, as a path, or by their own name, in backticks)."""
    text = doc.read_text(encoding="utf-8")
    named = _backticked_words(text)
    missing = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT / package).with_suffix("").parts)
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not parts:  # the package itself
            continue
        dotted, as_path = ".".join(parts), f"{package}/{path.relative_to(ROOT / package)}"
        if not ({dotted, parts[-1], f"{'/'.join(parts)}/"} & named or as_path in text):
            missing.append(dotted)
    return missing


@pytest.mark.parametrize("package", ["trainer", "worker"])
def test_the_package_doc_names_every_module(package: str) -> None:
    """docs/trainer.md and docs/worker.md name every module of their package (issue 30, item 5)."""
    assert modules_not_named(package, ROOT / "docs" / f"{package}.md") == []


def test_a_module_the_doc_does_not_name_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.txt"
    page.write_text("`loop`, `hf/` and `data.jsonl.rows`\n")
    missing = modules_not_named("trainer", page)
    assert "loop" not in missing and "hf" not in missing and "data.jsonl.rows" not in missing
    assert "run.step" in missing and "hf.build" in missing and "data.jsonl.chat" in missing
