"""Property-based fuzzing of the whole HTTP API with schemathesis, from the app's own OpenAPI schema.

Every operation of ``/openapi.json`` gets ``HALFCAST_FUZZ_EXAMPLES`` (default 25)
generated requests, valid and invalid (schemathesis' positive and negative modes),
against the app in-process (ASGI, lifespan started once) on each of two migrated
databases: SQLite in the test's data dir, and PostgreSQL (left out, with a warning, where
it does not answer; a failure under ``HALFCAST_REQUIRE_SERVICES=1``). Each generated
request is sent to both apps (:class:`FuzzTargets`): generating it is most of the fuzz's
cost, and the backends get the very same requests. Hypothesis is derandomized, so CI
runs the same examples every time; a deeper local run is
``HALFCAST_FUZZ_EXAMPLES=500 pytest tests/server/test_fuzz_api.py``.

Each response must:

- not be a 5xx;
- if 4xx, be JSON naming the problem (:func:`fuzz_support.check_error_body`), and
  leave the database exactly as it was (nothing half-written, nothing stored);
- conform to the schema: a declared status code, the declared content type,
  headers and body (schemathesis' conformance checks), and reject invalid input
  (``negative_data_rejection``).

After the run, :func:`test_fuzzed_database_is_consistent` checks the database
holds nothing half-written (:func:`fuzz_support.database_problems`).

Non-strict JSON: schemathesis only generates strict JSON, but Python's parser also
reads ``NaN``, ``Infinity``, ``-Infinity`` and ``1e309``. Every operation with a JSON
body gets generated valid bodies written back as raw text with one of those at one of
their numbers (:func:`test_nonfinite_numbers_in_generated_bodies_are_4xx`), and every
number of every spec in ``examples/`` gets each of them
(:func:`test_nonfinite_numbers_in_example_specs_are_422_at_their_field`): a 4xx, never a
5xx or a dropped connection, and nothing stored.

Streaming: ``GET /jobs/{id}/events`` and ``GET /jobs/{id}/logs?follow=true`` stream
until the job is terminal, so the seeded ids swapped into their paths are only those
of terminal jobs (their streams end after the snapshot); a generated id is unknown
(404); pytest-timeout ends a stream that would not.

Uploads: ``POST /datasets`` and ``POST /models`` take raw bodies (JSON lines or CSV; a tar), which
schemathesis generates as strings and bytes (:func:`_raw_bytes` serializes the tar media type); a
refused upload must leave no row and no file under the registry directory.

Authentication: each operation is fuzzed as ``admin`` (an admin token: sees every
job), ``user`` (a plain token owning the seeded jobs) and ``anonymous`` (no token or
whatever ``Authorization`` schemathesis makes of the security scheme: 401 JSON with
``WWW-Authenticate: Bearer`` everywhere but ``/healthz`` and ``/readyz``).
:func:`caller_headers` is the one place that turns a caller into headers. The
``admin`` and ``user`` requests differ only in their token: each is generated once,
with the admin's token fixed, and sent by both (:data:`CALLER_GROUPS`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import schemathesis
from api_support import FakeQueue
from fastapi.testclient import TestClient
from fuzz_support import (
    NONFINITE_LITERALS,
    Seeded,
    check_error_body,
    database_problems,
    fingerprint,
    make_tokens,
    node_paths,
    numeric_paths,
    seed_jobs,
    with_literal,
)
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import ignored_auth, positive_data_acceptance
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from halfcast.core.db.engine import make_engine, make_session_factory
from halfcast.core.db.models import Base
from halfcast.core.settings import Settings
from server.app import create_app

pytestmark = pytest.mark.slow  # hundreds of generated requests per operation: not in make check

log = logging.getLogger(__name__)

#: The repository's example specs (valid job specs with numbers in many positions).
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.json"))

#: Generated requests per operation (and per backend and auth mode); CI keeps the default.
FUZZ_EXAMPLES = int(os.environ.get("HALFCAST_FUZZ_EXAMPLES", "25"))
#: Paths answered without a token.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
#: Operations whose answer may be an endless stream for a job that is not terminal.
STREAMING_PATHS = frozenset({"/jobs/{job_id}/events", "/jobs/{job_id}/logs"})
#: The callers of a fuzz test, by the headers its requests are generated with: the admin's token fixed
#: (each request also sent with the user's), or none fixed (schemathesis' own ``Authorization``, if any).
CALLER_GROUPS = {"token": ("admin", "user"), "anonymous": ("anonymous",)}
#: Schemathesis checks left out, and why.
EXCLUDED_CHECKS = (
    # It re-sends the case without credentials through schemathesis' own ASGI transport (a
    # second lifespan of the app); the ``anonymous`` caller checks the same thing here.
    ignored_auth,
    # The JSON Schema cannot express the spec's cross-field rules (model/dataset pairs, fp8
    # needs GPUs, global batch divisibility) or state-dependent ones (rank < world size,
    # opaque cursors): such schema-valid requests answer 422 by design, and the 422 body
    # is still checked by ``check_error_body``.
    positive_data_acceptance,
)


@schemathesis.serializer("application/x-tar")
def _raw_bytes(_ctx: Any, value: Any) -> bytes:
    """A generated body of ``POST /models`` (any bytes: what the route must refuse unless it is a model tar)."""
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else json.dumps(value).encode()


@dataclass
class FuzzTarget:
    """One app under fuzz: its client, a session factory on its database, the seeded ids, and tallies."""

    client: TestClient
    sessions: sessionmaker[Session]
    seeded: Seeded
    backend: str
    tokens: dict[str, str]
    registry: Path
    examples: Counter[str] = field(default_factory=Counter)
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    #: The database's :func:`fingerprint` after the last request that was not a 4xx.
    snapshot: tuple[Any, ...] = ()

    def expect_unchanged(self, label: str, status_code: int) -> None:
        """After a 4xx: the database is as it was before the request (as :attr:`snapshot` holds)."""
        assert fingerprint(self.sessions) == self.snapshot, f"{label} answered {status_code} but changed the database"

    def take_snapshot(self) -> None:
        """Note the database's state: a request that may have written leaves a new one."""
        self.snapshot = fingerprint(self.sessions)

    def tally(self, label: str, status_code: int) -> None:
        """Count one request of operation ``label`` answered with ``status_code``."""
        self.examples[label] += 1
        self.statuses.setdefault(label, Counter())[status_code] += 1


@dataclass
class FuzzTargets:
    """The same app on each backend; requests are generated for the first and sent to all.

    A request names the first target's seeded jobs and tokens; :meth:`aliases` maps them to another
    target's (the seeded jobs are the same rows, under other ids; the tokens other secrets).
    """

    targets: list[FuzzTarget]

    @property
    def primary(self) -> FuzzTarget:
        """The target requests are generated for."""
        return self.targets[0]

    def aliases(self, target: FuzzTarget) -> dict[str, str]:
        """The primary's seeded job ids and token secrets, each with ``target``'s counterpart."""
        primary = self.primary
        pairs = dict(zip(primary.seeded.all_ids, target.seeded.all_ids, strict=True))
        pairs.update({primary.tokens[caller]: target.tokens[caller] for caller in primary.tokens})
        return {old: new for old, new in pairs.items() if old != new}


def _sqlite_url(request: pytest.FixtureRequest, data_dir: Path) -> str:
    path = data_dir / "halfcast.db"
    shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    return f"sqlite:///{path}"


def _postgres_url(request: pytest.FixtureRequest) -> str | None:
    """The session's migrated PostgreSQL database, emptied; None where PostgreSQL does not answer (not in CI)."""
    try:
        url: str = request.getfixturevalue("migrated_postgres_url")
    except pytest.skip.Exception as exc:  # fuzz SQLite alone rather than nothing
        log.warning("fuzzing SQLite only: %s", exc)
        return None
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(Base.metadata.tables)}"))
    engine.dispose()
    return url


def _start_target(stack: ExitStack, backend: str, database_url: str, data_dir: Path) -> FuzzTarget:
    """The app on a seeded database at ``database_url``, lifespan started until ``stack`` closes."""
    settings_ = Settings(data_dir=data_dir, database_url=database_url, broker_url=None, allow_faults=False)
    engine = make_engine(settings_.effective_database_url)
    stack.callback(engine.dispose)
    sessions = make_session_factory(engine)
    seeded = seed_jobs(sessions, settings_.runs_dir)
    tokens = make_tokens(sessions)
    (settings_.broker_dir / "in").mkdir(parents=True)  # what a worker creates: /readyz is then 200
    client = stack.enter_context(TestClient(create_app(settings_, FakeQueue()), raise_server_exceptions=False))
    target = FuzzTarget(client, sessions, seeded, backend, tokens, settings_.registry_dir)
    stack.callback(_report, target)
    return target


@pytest.fixture(scope="module")
def fuzz_targets(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTargets]:
    """The app on a seeded SQLite database and on a seeded PostgreSQL one, shared by the module's tests."""
    with ExitStack() as stack:
        sqlite_dir = tmp_path_factory.mktemp("fuzz-sqlite")
        targets = [_start_target(stack, "sqlite", _sqlite_url(request, sqlite_dir), sqlite_dir)]
        postgres_url = _postgres_url(request)
        if postgres_url is not None:
            targets.append(_start_target(stack, "postgres", postgres_url, tmp_path_factory.mktemp("fuzz-postgres")))
        yield FuzzTargets(targets)


def _report(target: FuzzTarget) -> None:
    """Log the examples run per operation and the status codes they got (``-o log_cli=true`` shows them)."""
    for label in sorted(target.examples):
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(target.statuses[label].items()))
        log.info("fuzz %s %-40s %4d examples (%s)", target.backend, label, target.examples[label], codes)


def caller_headers(target: FuzzTarget, caller: str) -> dict[str, str]:
    """Headers of a request by ``caller`` (``admin``, ``user`` or ``anonymous``)."""
    token = target.tokens.get(caller)
    return {"Authorization": f"Bearer {token}"} if token else {}


#: Keywords of a parameter schema that constrain nothing.
_ANNOTATIONS = frozenset({"title", "description"})


def _any_string(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` takes every string (``{"type": "string"}``, optionally or null, with annotations only)."""
    if set(schema) - _ANNOTATIONS == {"type"}:
        return bool(schema["type"] == "string")
    if set(schema) - _ANNOTATIONS == {"anyOf"}:
        kinds = [option.get("type") for option in schema["anyOf"]]
        return "string" in kinds and all(
            len(option) == 1 and option.get("type") in ("string", "null") for option in schema["anyOf"]
        )
    return False


def _has_invalid_input(spec: dict[str, Any], *, authorization_fixed: bool) -> bool:
    """Whether an operation (its OpenAPI ``spec``) can be sent an invalid request.

    Not without parameters and body. Nor, with ``Authorization`` fixed (never negated), where its only
    inputs are path and header parameters that take any string: HTTP sends those as strings, so nothing
    is invalid (schemathesis would try some 460 cases before giving up, 20-35 s on this machine).
    """
    parameters = spec.get("parameters", [])
    if not parameters and not spec.get("requestBody"):
        return False
    if not authorization_fixed or spec.get("requestBody"):
        return True
    return not all(param["in"] in ("path", "header") and _any_string(param["schema"]) for param in parameters)


def _fuzz_params() -> list[Any]:
    """``(label, mode, callers)`` for every operation of the app's schema (read without starting the app).

    Negative mode only where an invalid request exists (:func:`_has_invalid_input`).
    """
    paths = create_app(Settings(data_dir=Path("/nonexistent"), broker_url=None)).openapi()["paths"]
    params = []
    for path, methods in paths.items():
        for method, spec in methods.items():
            label = f"{method.upper()} {path}"
            for callers in CALLER_GROUPS:
                params.append(pytest.param(label, GenerationMode.POSITIVE, callers, id=f"{label}-positive-{callers}"))
                if _has_invalid_input(spec, authorization_fixed=callers == "token"):
                    params.append(
                        pytest.param(label, GenerationMode.NEGATIVE, callers, id=f"{label}-negative-{callers}")
                    )
    return params


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_targets: FuzzTargets) -> schemathesis.BaseSchema:
    """The app's OpenAPI schema as schemathesis loads it from ``/openapi.json``."""
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_targets.primary.client.app)


def _without_null_headers(case: schemathesis.Case) -> schemathesis.Case:
    """Drop headers generated as JSON ``null`` (an optional header's schema allows null; HTTP has no such value)."""
    for name in [name for name, value in (case.headers or {}).items() if value is None]:
        del case.headers[name]
    return case


def _strategy(operation: Any, mode: GenerationMode, seeded: Seeded, headers: dict[str, str]) -> st.SearchStrategy:
    """Cases of ``operation`` with ``headers`` fixed (never negated); with a ``{job_id}``, half name a seeded job.

    Streaming operations get only terminal seeded jobs, whose streams end after the snapshot.
    """
    fixed = headers or None
    generated = operation.as_strategy(mode, headers=fixed)
    if "{job_id}" in operation.path:
        ids = seeded.terminal_ids if operation.path in STREAMING_PATHS else seeded.all_ids
        known = st.sampled_from(ids).flatmap(
            lambda job_id: operation.as_strategy(mode, headers=fixed, path_parameters={"job_id": job_id})
        )
        generated = st.one_of(known, generated)
    return generated.map(_without_null_headers)


def _check_response(target: FuzzTarget, label: str, caller: str, response: Any) -> None:
    """The Halfcast-specific checks: no 5xx; no token, no access; a 4xx is JSON naming the problem and writes nothing.

    A HEAD answer has no body to check (the GET of the same path checks the JSON). The database is compared
    with the target's snapshot (taken after the last request that could write): one query per request.
    """
    status_code = response.status_code
    assert status_code < 500, f"{label} answered {status_code}: {response.text[:2000]}"
    if caller == "anonymous" and label.split(" ", 1)[1] not in PUBLIC_PATHS:
        assert status_code == 401, f"{label} without a token answered {status_code}, not 401"
        assert response.headers.get("www-authenticate") == "Bearer", "401 without WWW-Authenticate: Bearer"
    if 400 <= status_code < 500 and not label.startswith("HEAD "):
        check_error_body(status_code, response.headers.get("content-type", ""), response.json())
    if 400 <= status_code < 500:
        target.expect_unchanged(label, status_code)
    else:
        target.take_snapshot()


def _request_kwargs(case: schemathesis.Case) -> dict[str, Any]:
    """Schemathesis' request for ``case`` as httpx arguments (method, url, headers, params, cookies, body)."""
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    out = {key: kwargs[key] for key in ("method", "url", "headers", "params", "cookies") if kwargs.get(key)}
    if "json" in kwargs:
        out["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        out["content"] = kwargs["data"]
    if "headers" in out:
        out["headers"] = {name: _header_bytes(value) for name, value in out["headers"].items()}
    return out


def _header_bytes(value: Any) -> Any:
    """A generated header value as the bytes a client sends: UTF-8 where it is not ASCII (``Bearer \\x80``).

    httpx sends only ASCII ``str`` values; the server must answer any bytes a client can send.
    """
    return value.encode() if isinstance(value, str) and not value.isascii() else value


def _aliased(kwargs: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """``kwargs`` with the seeded ids in its URL and the secrets in its headers replaced by their ``aliases``."""
    if not aliases:
        return kwargs

    def swap(value: str) -> str:
        for old, new in aliases.items():
            value = value.replace(old, new)
        return value

    out = {**kwargs, "url": swap(kwargs["url"])}
    if "headers" in kwargs:
        out["headers"] = {
            name: swap(value) if isinstance(value, str) else value for name, value in kwargs["headers"].items()
        }
    return out


def _send(targets: FuzzTargets, target: FuzzTarget, kwargs: dict[str, Any]) -> Any:
    """Send a request generated for the primary target to ``target``, through its TestClient."""
    return target.client.request(**_aliased(kwargs, targets.aliases(target)))


def _as_caller(kwargs: dict[str, Any], generated_by: str, caller: str, primary: FuzzTarget) -> dict[str, Any]:
    """The request ``kwargs`` generated with ``generated_by``'s token, sent with ``caller``'s instead."""
    if caller == generated_by:
        return kwargs
    headers = {**kwargs.get("headers", {}), **caller_headers(primary, caller)}
    return {**kwargs, "headers": headers}


@pytest.mark.parametrize(("label", "mode", "callers"), _fuzz_params())
def test_fuzz_operation(
    label: str, mode: GenerationMode, callers: str, fuzz_targets: FuzzTargets, fuzz_schema: schemathesis.BaseSchema
) -> None:
    """Every generated request gets a non-5xx, schema-conformant answer on each backend; a 4xx is JSON and writes nothing.

    Each request is sent by every caller of the group ``callers`` (:data:`CALLER_GROUPS`), to every backend.
    """
    method, path = label.split(" ", 1)
    operation = fuzz_schema[path][method]
    primary = fuzz_targets.primary
    generated_by, *_ = CALLER_GROUPS[callers]
    for target in fuzz_targets.targets:
        target.take_snapshot()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=_strategy(operation, mode, primary.seeded, caller_headers(primary, generated_by)))
    def run(case: schemathesis.Case) -> None:
        generated = _request_kwargs(case)
        for caller in CALLER_GROUPS[callers]:
            kwargs = _as_caller(generated, generated_by, caller, primary)
            for target in fuzz_targets.targets:
                response = _send(fuzz_targets, target, kwargs)
                target.tally(f"{label} ({caller})", response.status_code)
                _check_response(target, label, caller, response)
                case.validate_response(response, excluded_checks=list(EXCLUDED_CHECKS))

    try:
        run()
    except Unsatisfiable:
        pytest.fail(f"{label} ({callers}): no invalid request can be generated; _has_invalid_input must say why")


def _json_body_operations() -> list[str]:
    """``METHOD path`` of every operation whose request body is JSON (read without starting the app)."""
    paths = create_app(Settings(data_dir=Path("/nonexistent"), broker_url=None)).openapi()["paths"]
    return [
        f"{method.upper()} {path}"
        for path, methods in paths.items()
        for method, spec in methods.items()
        if "application/json" in spec.get("requestBody", {}).get("content", {})
    ]


def _raw_kwargs(case: schemathesis.Case, text: str) -> dict[str, Any]:
    """The request of ``case`` with ``text`` as its body, verbatim, as ``application/json``."""
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    headers = {**(kwargs.get("headers") or {}), "content-type": "application/json"}
    return {
        "method": kwargs["method"],
        "url": kwargs["url"],
        "headers": headers,
        "params": kwargs.get("params"),
        "content": text.encode(),
    }


def _check_nonfinite_answer(response: Any, caller: str, path: tuple[Any, ...]) -> None:
    """A 4xx JSON answer: 401 without a token, else a 422 whose every item is a non-finite number, one at ``path``."""
    assert 400 <= response.status_code < 500, f"answered {response.status_code}: {response.text[:2000]}"
    check_error_body(response.status_code, response.headers.get("content-type", ""), response.json())
    if caller == "anonymous":
        assert response.status_code == 401
        return
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert all(item["type"] == "json_invalid" and "non-finite" in item["msg"] for item in detail), detail
    assert ["body", *path] in [item["loc"] for item in detail], detail


@pytest.mark.parametrize("caller", ["user", "anonymous"])
@pytest.mark.parametrize("label", _json_body_operations())
def test_nonfinite_numbers_in_generated_bodies_are_4xx(
    label: str, caller: str, fuzz_targets: FuzzTargets, fuzz_schema: schemathesis.BaseSchema
) -> None:
    """A generated valid body with NaN, Infinity, -Infinity, 1e309 or -1e309 at one of its numbers (else anywhere)."""
    method, path = label.split(" ", 1)
    operation = fuzz_schema[path][method]
    headers = caller_headers(fuzz_targets.primary, caller)
    before = [fingerprint(target.sessions) for target in fuzz_targets.targets]

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(GenerationMode.POSITIVE, headers=headers or None), data=st.data())
    def run(case: schemathesis.Case, data: st.DataObject) -> None:
        where = data.draw(st.sampled_from(numeric_paths(case.body) or node_paths(case.body)), label="position")
        literal = data.draw(st.sampled_from(NONFINITE_LITERALS), label="literal")
        kwargs = _raw_kwargs(_without_null_headers(case), with_literal(case.body, where, literal))
        for target in fuzz_targets.targets:
            response = _send(fuzz_targets, target, kwargs)
            target.tally(f"{label} non-finite ({caller})", response.status_code)
            _check_nonfinite_answer(response, caller, where)

    run()
    after = [fingerprint(target.sessions) for target in fuzz_targets.targets]
    assert after == before, "a body with a non-finite number changed the database"


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_nonfinite_numbers_in_example_specs_are_422_at_their_field(fuzz_targets: FuzzTargets, example: Path) -> None:
    """Each of the five literals at every number of a valid example spec: exactly one 422 item, at that number."""
    spec = json.loads(example.read_text())
    positions = numeric_paths(spec)
    assert positions, f"{example.name} has no numbers"
    for target in fuzz_targets.targets:
        headers = {**caller_headers(target, "user"), "content-type": "application/json"}
        before = fingerprint(target.sessions)
        for where in positions:
            for literal in NONFINITE_LITERALS:
                response = target.client.post("/jobs", content=with_literal(spec, where, literal), headers=headers)
                answer = f"{target.backend}: {literal} at {where}: {response.status_code} {response.text[:500]}"
                assert response.status_code == 422, answer
                assert [(d["loc"], d["input"]) for d in response.json()["detail"]] == [(["body", *where], literal)]
        assert fingerprint(target.sessions) == before, f"{target.backend}: a non-finite spec changed the database"


def test_fuzzed_database_is_consistent(fuzz_targets: FuzzTargets) -> None:
    """After the fuzz run each database holds nothing half-written.

    It shares the module-scoped databases with :func:`test_fuzz_operation` and runs after
    it (pytest keeps the file's order); run alone it checks only the seeded rows.
    """
    problems = [
        f"{target.backend}: {problem}"
        for target in fuzz_targets.targets
        for problem in database_problems(target.sessions, target.registry)
    ]
    assert not problems, "\n".join(problems)
