"""The dtype ``export/model`` is written in: the spec's ``export.dtype``, else the base's stored dtype.

The stored dtype is read from the base's ``*.safetensors`` headers (no tensor is loaded): the
widest floating-point dtype among its tensors, so that every weight the job did not train
round-trips bit for bit (float32 holds every bfloat16 and float16 value; bfloat16 and float16
hold each other's values only partly, so a base mixing them is exported in float32). A base
initialised from ``hf_config`` (no files) is float32, as is one stored in float64 (training
reads it in float32).
"""

from __future__ import annotations

from pathlib import Path

import torch

from halfcast.contracts.spec import JobSpec

#: ``export.dtype`` values.
EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: safetensors' floating dtype names; float64 is capped to float32 (training reads the base in float32).
_STORED = {"F64": torch.float32, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def export_dtype(spec: JobSpec, base_dir: Path | None) -> torch.dtype:
    """``spec.export.dtype`` when given, else :func:`stored_dtype` of ``base_dir``."""
    chosen = spec.export.dtype if spec.export is not None else None
    return EXPORT_DTYPES[chosen] if chosen is not None else stored_dtype(base_dir)


def stored_dtype(base_dir: Path | None) -> torch.dtype:
    """The widest floating dtype of the tensors in ``base_dir``'s ``*.safetensors`` (float32 without files)."""
    from safetensors import safe_open

    found: set[torch.dtype] = set()
    for file in sorted(base_dir.glob("*.safetensors")) if base_dir is not None else []:
        with safe_open(str(file), framework="pt") as handle:
            kinds = {handle.get_slice(name).get_dtype() for name in handle.keys()}  # noqa: SIM118 (no __iter__)
        found |= {_STORED[kind] for kind in kinds if kind in _STORED}
    return found.pop() if len(found) == 1 else torch.float32
