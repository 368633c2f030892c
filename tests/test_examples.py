"""The examples and the README agree with the job spec (trainer/spec.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trainer.spec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXAMPLES = sorted((ROOT / "examples").iterdir())


def test_there_are_examples() -> None:
    assert [p for p in EXAMPLES if p.suffix == ".json"], "examples/ has no JSON job spec"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_a_valid_job_spec(path: Path) -> None:
    if path.suffix == ".json":
        spec = JobSpec.model_validate_json(path.read_text())
    elif path.suffix in (".yaml", ".yml"):
        spec = JobSpec.model_validate(yaml.safe_load(path.read_text()))
    else:
        pytest.fail(f"{path.name}: examples/ holds only .json or .yaml job specs")
    assert spec.faults is None, "fault injection is test-only; examples must run on any server"


def test_readme_examples_exist() -> None:
    named = set(re.findall(r"examples/[\w.-]+\.(?:json|ya?ml)", README))
    assert named, "README.md names no example"
    missing = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing, f"README.md names missing examples: {missing}"


def test_readme_documents_every_spec_field() -> None:
    schema = JobSpec.model_json_schema()
    fields = {name for model in [schema, *schema["$defs"].values()] for name in model.get("properties", {})}
    missing = sorted(name for name in fields if f"`{name}`" not in README)
    assert not missing, f"README.md does not document spec fields: {missing}"
