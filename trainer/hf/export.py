"""What a finished ``hf`` job leaves for inference, in Hugging Face formats (no Halfcast code needed).

Rank 0 writes, before the ``end`` record:

* ``<run_dir>/export/adapter/`` (adapter jobs): PEFT's ``save_pretrained`` of the trained
  adapter (``adapter_config.json`` + ``adapter_model.safetensors``; a classification head too);
* ``<run_dir>/export/model/``: the full model, ``save_pretrained(safe_serialization=True)``
  (``config.json``, ``model.safetensors`` or shards) plus the job's tokenizer files, in the
  export dtype (:mod:`trainer.hf.export_dtype`: the spec's ``export.dtype``, else the base's
  stored dtype). An adapter job's is merged (``merge_and_unload``) in float32 into the base as
  read from disk (never the compute-dtype copy it trained against), then cast once.
  Byte-level jobs (``text`` data, or ``hf_config`` without a tokenizer) have no tokenizer files:
  token ids are the UTF-8 bytes.

Each directory is written under a temporary sibling name and renamed into place, so a reader
never sees half an export.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import nn

from halfcast.contracts.records import ExportCheck
from halfcast.contracts.rundir import ExportKind, RunDir
from trainer.data.base import Batch
from trainer.hf.export_check import check_merged, logits_of
from trainer.hf.export_identity import METADATA_FILE
from trainer.hf.generation import apply_generation_config
from trainer.hf.wrapper import HFModule

log = logging.getLogger(__name__)


class _Pretrained(Protocol):
    """What an export calls on a Hugging Face model (``PreTrainedModel``) or a PEFT one (``PeftModel``)."""

    config: Any

    def save_pretrained(self, save_directory: str, **kwargs: Any) -> Any: ...

    def merge_and_unload(self) -> nn.Module: ...


def _pretrained(model: nn.Module) -> _Pretrained:
    """``model`` typed as the Hugging Face model it is: ``nn.Module.__getattr__`` types every other
    attribute as a tensor or a module."""
    return cast(_Pretrained, model)


def write_exports(
    model: HFModule,
    tokenizer: Any | None,
    run_dir: Path,
    dtype: torch.dtype = torch.float32,
    finish: Callable[[Path], None] | None = None,
    check_rows: Batch | None = None,
) -> ExportCheck | None:
    """Write ``export/adapter`` (adapter jobs) and ``export/model`` (in ``dtype``); return the export check.

    ``model`` (float32, on the CPU: :func:`trainer.hf.build.rebuild_hf_model`, with the base as
    stored) is consumed: the adapter is merged into it in float32, in place, after the adapter
    export; the merged model is then cast to ``dtype``. ``finish`` runs on each directory once
    written (:func:`trainer.hf.export_identity.make_portable`). With ``check_rows`` (held-out rows)
    the merged model is checked against ``model`` first (:mod:`trainer.hf.export_check`): over the
    tolerance nothing is published and ``export_failed`` is raised. Both directories are written
    first and published together.
    """
    run = RunDir(run_dir)
    done = finish or (lambda _: None)
    reference = logits_of(model, check_rows) if check_rows is not None else None
    staged: list[tuple[Path, Path]] = []
    try:
        if model.adapter:
            staged.append(_stage(run.export_of(ExportKind.ADAPTER)))
            _pretrained(model.model).save_pretrained(str(staged[-1][1]))
            done(staged[-1][1])
        staged.append(_stage(run.export_of(ExportKind.MODEL)))
        merged = _save_full(model, tokenizer, staged[-1][1], dtype)
        done(staged[-1][1])
        check = None
        if check_rows is not None and reference is not None:
            check = check_merged(merged, model.causal, check_rows, reference)
            _record_check(staged[-1][1], check)
        for final, tmp in staged:
            _commit(final, tmp)
    except BaseException:
        for _, tmp in staged:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exports written: %s", ", ".join(str(final) for final, _ in staged))
    return check


def _record_check(export: Path, check: ExportCheck) -> None:
    """Add ``check`` to the export's metadata file (created by ``finish``, or here)."""
    path = export / METADATA_FILE
    metadata = json.loads(path.read_text()) if path.is_file() else {}
    metadata["check"] = check.model_dump(mode="json")
    path.write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")


def merged_copy(model: HFModule) -> nn.Module:
    """A float32 CPU Hugging Face model with the trained weights: the adapter merged into a copy of the
    base (``merge_and_unload``), or a copy of a fully fine-tuned model; ``model`` is left as it is."""
    return _merged(copy.deepcopy(model.model).to(device="cpu", dtype=torch.float32), adapter=model.adapter)


def _merged(model: nn.Module, *, adapter: bool) -> nn.Module:
    return (_pretrained(model).merge_and_unload() if adapter else model).eval()


def _save_full(model: HFModule, tokenizer: Any | None, target: Path, dtype: torch.dtype) -> nn.Module:
    """Merge (float32), cast to ``dtype``, save into ``target``; return the merged model as written."""
    merged = _merged(model.model.to(device="cpu", dtype=torch.float32), adapter=model.adapter)
    full = _pretrained(merged.to(dtype))
    full.config.use_cache = True  # inference default; training ran without a cache
    apply_generation_config(full, tokenizer)
    full.save_pretrained(str(target), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(target))
    return cast(nn.Module, full)


def _stage(final: Path) -> tuple[Path, Path]:
    """``(final, tmp)``: an empty temporary sibling of ``final`` to write into."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return final, Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))


def _commit(final: Path, tmp: Path) -> None:
    """Rename ``tmp`` into place as ``final`` (replacing an old one)."""
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)
