"""Exports name their base portably (issue 25 item 4): no worker path in any text file, identity and fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

from halfcast.contracts.spec import JobSpec
from trainer.hf.export_identity import METADATA_FILE, BaseIdentity, base_identity, make_portable


def _export(tmp_path: Path, local: Path) -> Path:
    export = tmp_path / "adapter"
    export.mkdir()
    (export / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(local), "r": 4}))
    (export / "README.md").write_text(f"---\nbase_model: {local}\n---\nTrained on {local}/weights.\n")
    (export / "adapter_model.safetensors").write_bytes(str(local).encode())  # binary files are left alone
    return export


def test_a_registered_base_is_named_by_its_model_id(tmp_path: Path) -> None:
    local = tmp_path / "worker" / "registry" / "models" / "m-123"
    export = _export(tmp_path, local)
    identity = BaseIdentity(model_id="m-123", fingerprint="ab" * 32)
    make_portable(export, identity, [local])
    assert json.loads((export / "adapter_config.json").read_text())["base_model_name_or_path"] == "m-123"
    readme = (export / "README.md").read_text()
    assert str(local) not in readme and "base_model: m-123" in readme and "m-123/weights" in readme
    assert json.loads((export / METADATA_FILE).read_text()) == {"base": {"model_id": "m-123", "fingerprint": "ab" * 32}}


def test_a_base_built_from_hf_config_has_no_name_but_its_architecture() -> None:
    spec = JobSpec.model_validate(
        {
            "model": {"name": "hf", "config": {"hf_config": {"model_type": "llama", "hidden_size": 16}}},
            "dataset": {"name": "text"},
        }
    )
    identity = base_identity(spec, None)
    assert identity == BaseIdentity(model_type="llama") and identity.portable_name is None
