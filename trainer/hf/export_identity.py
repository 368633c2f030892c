"""What an export says about its base: a name another machine can resolve, never a worker's path.

PEFT writes the directory it loaded the base from into ``adapter_config.json``
(``base_model_name_or_path``) and the adapter's model card: on a worker that is an absolute
path inside its model root or registry. :func:`make_portable` replaces it in every text file of
an export with the base's portable name (the ``path`` relative to a model root, or the registered
``model_id``; nothing for a base built from ``hf_config``) and writes :data:`METADATA_FILE`, the
base's identity and its content fingerprint (:func:`trainer.inputs.directory_fingerprint`, the
one a resume checks), so a user can tell the base they load is the one the job trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from halfcast.contracts.spec import JobSpec

#: The metadata file of each export directory.
METADATA_FILE = "halfcast_export.json"
#: Export files that are text and may name the base (PEFT's config and model card, tokenizer and model configs).
_TEXT_SUFFIXES = frozenset({".json", ".md", ".txt", ".jinja"})


class BaseIdentity(BaseModel):
    """The base model of a job, as any machine names it.

    ``path``: relative to a model root; ``model_id``: a registered model; ``model_type``: the
    ``hf_config`` architecture of a base initialised from the job's seed (nothing on disk);
    ``fingerprint``: SHA-256 of the base directory's files (``None`` for an ``hf_config`` base).
    """

    path: str | None = None
    model_id: str | None = None
    model_type: str | None = None
    fingerprint: str | None = None

    @property
    def portable_name(self) -> str | None:
        """What ``base_model_name_or_path`` says: the relative path or the registered id."""
        return self.path or self.model_id


def base_identity(spec: JobSpec, fingerprint: str | None) -> BaseIdentity:
    """The identity of ``spec``'s ``hf`` base (``fingerprint``: of its directory, when it has one)."""
    from trainer.hf.loading import hf_config

    config = hf_config(spec)
    model_type = None if config.hf_config is None else str(config.hf_config.get("model_type"))
    return BaseIdentity(path=config.path, model_id=config.model_id, model_type=model_type, fingerprint=fingerprint)


def make_portable(export: Path, identity: BaseIdentity, local_dirs: list[Path]) -> None:
    """Name the base portably in ``export``'s text files (``local_dirs``: where this machine read it) and
    write :data:`METADATA_FILE`."""
    adapter_config = export / "adapter_config.json"
    if adapter_config.is_file():
        config = json.loads(adapter_config.read_text())
        config["base_model_name_or_path"] = identity.portable_name
        adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    replacement = identity.portable_name or "<base built from hf_config>"
    for file in sorted(export.iterdir()):
        if file.suffix in _TEXT_SUFFIXES and file.is_file():
            _replace_paths(file, local_dirs, replacement)
    metadata = {"base": identity.model_dump(exclude_none=True)}
    (export / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")


def _replace_paths(file: Path, local_dirs: list[Path], replacement: str) -> None:
    text = file.read_text(encoding="utf-8", errors="surrogateescape")
    updated = text
    for directory in sorted({str(d) for d in local_dirs}, key=len, reverse=True):  # the longest first
        updated = updated.replace(json.dumps(directory)[1:-1], replacement).replace(directory, replacement)
    if updated != text:
        file.write_text(updated, encoding="utf-8", errors="surrogateescape")
