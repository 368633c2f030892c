"""Statuses and failure reasons are the enums of ``halfcast.contracts.status``: every reason the code reports is one of them.

The reasons are found in the source (``ast``) of ``trainer/``, ``worker/`` and ``server/``: the first
argument of ``TrainerError(...)`` (and ``DivergenceError(...)``), the reason of ``Outcome(status, reason, ...)``,
every ``reason=``
and ``error_reason=`` keyword, and what is assigned to a name ``reason`` or to a constant whose name
holds ``REASON`` or ``CAUSES`` (strings, ``FailureReason.X``, either side of a conditional, the
items of a tuple, set or dict). Every one must be a ``FailureReason`` member, never a string; and no
string literal of those packages (``halfcast.contracts.status`` aside) may spell a reason, wherever it is passed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from halfcast.contracts.status import TERMINAL_STATUSES, AttemptStatus, FailureReason, JobStatus
from trainer.errors import REASONS
from worker.lifecycle.reasons import FAILURE_REASONS, RETRY_POLICY

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "worker", "server", "halfcast/core", "halfcast/cli", "halfcast/files")
REASON_KEYWORDS = frozenset({"reason", "error_reason"})
#: The typed errors whose first argument is a reason (``DivergenceError``: the guard's, where the code has it).
REASON_ERRORS = frozenset({"TrainerError", "DivergenceError"})


def _values(node: ast.expr) -> list[ast.expr]:
    """The nodes ``node`` may evaluate to, as far as a reason goes: constants and ``FailureReason`` members."""
    if isinstance(node, ast.IfExp):
        return _values(node.body) + _values(node.orelse)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for item in node.elts for value in _values(item)]
    if isinstance(node, ast.Dict):
        return [value for item in node.values for value in _values(item)]
    if isinstance(node, ast.Attribute) and node.attr == "value":
        return _values(node.value)
    if isinstance(node, ast.Call):  # frozenset({...}), MappingProxyType({...})
        return [value for arg in node.args for value in _values(arg)]
    is_member = (
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "FailureReason"
    )
    return [node] if is_member or (isinstance(node, ast.Constant) and isinstance(node.value, str)) else []


def _assigned(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    """The reasons an assignment gives a name ``reason`` or a ``*REASON*``/``*CAUSES*`` constant."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    found: list[ast.expr] = []
    for target in targets:
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            pairs = zip(target.elts, node.value.elts, strict=True)
            found += [value for name, item in pairs if _is_reason_name(name) for value in _values(item)]
        elif _is_causes(target) and isinstance(node.value, ast.Tuple):  # ((reason, pattern, explanation), ...)
            found += [
                value for cause in node.value.elts if isinstance(cause, ast.Tuple) for value in _values(cause.elts[0])
            ]
        elif _is_reason_name(target) and node.value is not None:
            found += _values(node.value)
    return found


def _is_reason_name(target: ast.expr) -> bool:
    return isinstance(target, ast.Name) and (target.id == "reason" or "REASON" in target.id)


def _is_causes(target: ast.expr) -> bool:
    return isinstance(target, ast.Name) and "CAUSES" in target.id


def reported_reasons(source: str) -> list[tuple[int, str]]:
    """``(line, reason)`` of every reason ``source`` reports; a ``FailureReason`` member as ``FailureReason.X``."""
    found: list[ast.expr] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in REASON_ERRORS and node.args:
                found += _values(node.args[0])
            if name == "Outcome" and len(node.args) > 1:
                found += _values(node.args[1])
            found += [
                value for keyword in node.keywords if keyword.arg in REASON_KEYWORDS for value in _values(keyword.value)
            ]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            found += _assigned(node)
    return [(item.lineno, _reason(item)) for item in found]


def _reason(node: ast.expr) -> str:
    """A reason node (a constant or a ``FailureReason`` member, as :func:`_values` finds them) as text."""
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, str), ast.dump(node)
        return node.value
    assert isinstance(node, ast.Attribute), ast.dump(node)
    return f"FailureReason.{node.attr}"


def _is_known(reason: str) -> bool:
    member = reason.removeprefix("FailureReason.")
    return member in FailureReason.__members__ if reason.startswith("FailureReason.") else reason in set(FailureReason)


def spelled_reasons(source: str) -> list[tuple[int, str]]:
    """``(line, value)`` of every string literal in ``source`` that is exactly a failure reason's value."""
    values = set(FailureReason)
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values
    ]


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _every_reported_reason() -> list[tuple[str, str]]:
    return [
        (f"{path.relative_to(ROOT)}:{line}", reason)
        for path in _sources()
        for line, reason in reported_reasons(path.read_text(encoding="utf-8"))
    ]


@pytest.mark.parametrize(
    ("source", "reasons"),
    [('raise TrainerError("data_unavailable", "m")', ["data_unavailable"]),
     ('return Outcome("failed", "worker_lost", "m")', ["worker_lost"]),
     ('return Outcome(JobStatus.FAILED, FailureReason.OOM, "m")', ["FailureReason.OOM"]),
     ('conn.execute(update(Job).values(error_reason="enqueue_failed"))', ["enqueue_failed"]),
     ('reason, message = "precision_unsupported", str(exc)', ["precision_unsupported"]),
     ('reason = "model_unavailable" if found else "spec_invalid"', ["model_unavailable", "spec_invalid"]),
     ('_REASONS = {"model": "model_unavailable"}', ["model_unavailable"]),
     ('ENQUEUE_REASON = FailureReason.ENQUEUE_FAILED.value', ["FailureReason.ENQUEUE_FAILED"]),
     ('LOG_CAUSES = (("oom", re.compile("CUDA out of memory"), "ran out of memory"),)', ["oom"]),
     ('message = "data_unavailable"', [])],
)  # fmt: skip  # a case table, laid out by hand
def test_the_scan_finds_reported_reasons(source: str, reasons: list[str]) -> None:
    assert [reason for _, reason in reported_reasons(source)] == reasons


def test_every_reason_the_code_reports_is_a_failure_reason_member() -> None:
    reported = _every_reported_reason()
    unknown = [f"{where}: {reason!r}" for where, reason in reported if not _is_known(reason)]
    assert unknown == [], "not a halfcast.contracts.status.FailureReason:\n" + "\n".join(unknown)
    strings = [f"{where}: {reason!r}" for where, reason in reported if not reason.startswith("FailureReason.")]
    assert strings == [], "a reason spelled as a string (use its FailureReason member):\n" + "\n".join(strings)
    named = {reason.removeprefix("FailureReason.").lower() for _, reason in reported}
    assert set(REASONS) <= named and {"worker_lost", "worker_error", "enqueue_failed", "oom"} <= named  # the scan sees


@pytest.mark.parametrize(
    ("source", "spelled"),
    [('registry_dir("data_unavailable")', [(1, "data_unavailable")]),
     ('registry_dir(FailureReason.DATA_UNAVAILABLE)', []),
     ('message = "oom while loading"', [])],
)  # fmt: skip  # a case table: source and its findings a row
def test_the_spelling_scan_finds_reason_strings(source: str, spelled: list[tuple[int, str]]) -> None:
    assert spelled_reasons(source) == spelled


def test_no_module_spells_a_reason_as_a_string() -> None:
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path in _sources()
        for line, value in spelled_reasons(path.read_text(encoding="utf-8"))
    ]
    assert spelled == [], "a failure reason spelled as a string (use its FailureReason member):\n" + "\n".join(spelled)


def test_the_worker_and_the_trainer_use_the_one_list() -> None:
    assert set(FailureReason) == FAILURE_REASONS and set(RETRY_POLICY) == set(FailureReason)
    assert {reason for reason, retried in RETRY_POLICY.items() if retried} == {"worker_lost", "worker_shutdown"}
    assert REASONS <= FAILURE_REASONS


def test_the_enums_keep_the_stored_strings() -> None:
    assert [status.value for status in JobStatus] == [
        "queued",
        "starting",
        "running",
        "cancelling",
        "succeeded",
        "failed",
        "cancelled",
        "gathering",
    ]
    assert (
        {status for status in JobStatus if status.terminal} == TERMINAL_STATUSES == {"succeeded", "failed", "cancelled"}
    )
    assert [status.value for status in AttemptStatus] == ["succeeded", "failed", "cancelled", "requeued"]
    assert FailureReason("worker_lost") == "worker_lost" and f"{FailureReason.OOM}" == "oom"
