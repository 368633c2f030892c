"""What a model directory must be before Hugging Face may read it: no remote code, no pickle weights.

Torch-free: the API applies the same rules to an uploaded model (``POST /models``) through
:func:`remote_code_problem` and :func:`weights_problem`.

``from_pretrained`` with ``trust_remote_code=False`` already refuses remote code, and
``use_safetensors=True`` refuses pickle weights; these checks run first so that a refused
directory fails with a clear ``model_unavailable`` message naming the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath

from halfcast.contracts.status import FailureReason
from trainer.errors import TrainerError

#: Weight files that ``torch.load`` would unpickle (arbitrary code); never read.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl"})
CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
#: Config keys that make Hugging Face import code shipped with the model.
REMOTE_CODE_KEYS = frozenset({"auto_map"})


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"cannot read {path.name} in {path.parent}: {exc}") from exc
    if not isinstance(data, dict):
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"{path} is not a JSON object")
    return data


def remote_code_problem(data: Mapping[str, object], name: str) -> str | None:
    """Why the parsed config file ``name`` asks for remote code (a key of :data:`REMOTE_CODE_KEYS`), or ``None``."""
    found = sorted(REMOTE_CODE_KEYS & data.keys())
    if not found:
        return None
    return f"needs remote code ('{found[0]}' in {name}); Halfcast never runs trust_remote_code"


def weights_problem(file_names: Iterable[str]) -> str | None:
    """Why a model directory holding ``file_names`` (its top level) has no usable weights, or ``None``:
    it needs ``*.safetensors`` (pickle weights alone are never loaded)."""
    names = sorted(file_names)
    if any(name.endswith(".safetensors") for name in names):
        return None
    pickles = [name for name in names if PurePath(name).suffix in PICKLE_SUFFIXES]
    if pickles:
        return f"holds only pickle weights ({', '.join(pickles[:4])}); convert them to safetensors"
    return "holds no *.safetensors weights"


def _refuse_remote_code(path: Path) -> None:
    problem = remote_code_problem(_read_json(path), path.name)
    if problem is not None:
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"{path.parent} {problem}")


def check_model_dir(directory: Path) -> None:
    """Refuse (``model_unavailable``) a model directory without ``config.json``, with ``auto_map``
    in it or its tokenizer config (remote code), or without ``*.safetensors`` weights (pickle only, or none)."""
    config = directory / CONFIG_FILE
    if not config.is_file():
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"{directory} has no {CONFIG_FILE}")
    _refuse_remote_code(config)
    check_tokenizer_dir(directory, required=False)
    problem = weights_problem(p.name for p in directory.iterdir() if p.is_file())
    if problem is not None:
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"{directory} {problem}")


def check_tokenizer_dir(directory: Path, *, required: bool = True) -> None:
    """Refuse a tokenizer directory whose ``tokenizer_config.json`` asks for remote code (``auto_map``);
    with ``required``, also one without a tokenizer config."""
    config = directory / TOKENIZER_CONFIG_FILE
    if config.is_file():
        _refuse_remote_code(config)
    elif required:
        raise TrainerError(FailureReason.MODEL_UNAVAILABLE, f"{directory} has no {TOKENIZER_CONFIG_FILE}")
