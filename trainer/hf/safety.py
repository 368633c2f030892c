"""What a model directory must be before Hugging Face may read it: no remote code, no pickle weights.

``from_pretrained`` with ``trust_remote_code=False`` already refuses remote code, and
``use_safetensors=True`` refuses pickle weights; these checks run first so that a refused
directory fails with a clear ``model_unavailable`` message naming the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.errors import TrainerError

#: Weight files that ``torch.load`` would unpickle (arbitrary code); never read.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl"})
CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainerError("model_unavailable", f"cannot read {path.name} in {path.parent}: {exc}") from exc
    if not isinstance(data, dict):
        raise TrainerError("model_unavailable", f"{path} is not a JSON object")
    return data


def _refuse_remote_code(path: Path) -> None:
    if "auto_map" in _read_json(path):
        msg = f"{path.parent} needs remote code ('auto_map' in {path.name}); Halfcast never runs trust_remote_code"
        raise TrainerError("model_unavailable", msg)


def check_model_dir(directory: Path) -> None:
    """Refuse (``model_unavailable``) a model directory without ``config.json``, with ``auto_map``
    in it or its tokenizer config (remote code), or without ``*.safetensors`` weights (pickle only, or none)."""
    config = directory / CONFIG_FILE
    if not config.is_file():
        raise TrainerError("model_unavailable", f"{directory} has no {CONFIG_FILE}")
    _refuse_remote_code(config)
    check_tokenizer_dir(directory, required=False)
    files = [p for p in directory.iterdir() if p.is_file()]
    if any(p.suffix == ".safetensors" for p in files):
        return
    pickles = sorted(p.name for p in files if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        msg = f"{directory} holds only pickle weights ({', '.join(pickles[:4])}); convert them to safetensors"
        raise TrainerError("model_unavailable", msg)
    raise TrainerError("model_unavailable", f"{directory} holds no *.safetensors weights")


def check_tokenizer_dir(directory: Path, *, required: bool = True) -> None:
    """Refuse a tokenizer directory whose ``tokenizer_config.json`` asks for remote code (``auto_map``);
    with ``required``, also one without a tokenizer config."""
    config = directory / TOKENIZER_CONFIG_FILE
    if config.is_file():
        _refuse_remote_code(config)
    elif required:
        raise TrainerError("model_unavailable", f"{directory} has no {TOKENIZER_CONFIG_FILE}")
