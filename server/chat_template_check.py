"""Submission check: a ``chat`` dataset needs a tokenizer with a chat template (else 422 at the dataset's format).

An encoder such as BERT or MiniLM has no chat template; given chat rows, its job used to be accepted and
fail at run time (``spec_invalid: format 'chat' needs a tokenizer with a chat template``). Here the
tokenizer directory the job would read is looked at before it is stored: a ``path``/``tokenizer_path``
under a model root this host sees (:mod:`server.input_roots` gives the roots the workers report). A
registered model (``model_id``) is not looked at here, before its owner is checked: reading it would tell
a caller about a model they may not see. A tokenizer has a chat template
when its ``tokenizer_config.json`` holds a non-empty ``chat_template`` or the directory has
``chat_template.jinja`` / ``chat_template.json`` (how transformers saves one). A directory this host does
not see is not judged: the trainer checks again at run time.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from halfcast.contracts.spec import JobSpec
from server.http.errors import ErrorItem

log = logging.getLogger(__name__)

#: Largest ``tokenizer_config.json`` read (a chat template is text; a few are large).
MAX_TOKENIZER_CONFIG_BYTES = 4 << 20
#: Files transformers saves a chat template in, besides ``tokenizer_config.json``.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def chat_template_errors(spec: JobSpec, model_roots: list[str]) -> list[ErrorItem]:
    """A 422 item at ``dataset.config.format`` when ``spec`` trains chat rows on a tokenizer without a template."""
    dataset: Any = spec.dataset.config
    if spec.model.name != "hf" or spec.dataset.name != "jsonl" or dataset.format != "chat":
        return []
    directory = _tokenizer_dir(spec, model_roots)
    if directory is None or has_chat_template(directory):
        return []
    config: Any = spec.model.config
    name = config.tokenizer_path or config.path
    msg = (
        f"format 'chat' needs a tokenizer with a chat template, and {name!r} has none "
        "(an encoder such as BERT has none): use format 'text', 'instruction' or 'classification', or a chat model"
    )
    return [{"type": "value_error", "loc": ("body", "dataset", "config", "format"), "msg": msg, "input": "chat"}]


def has_chat_template(directory: Path) -> bool:
    """Whether the tokenizer saved in ``directory`` has a chat template (see the module docstring); ``True``
    when it cannot tell (no or an unreadable ``tokenizer_config.json``): only a sure "none" refuses."""
    if any((directory / name).is_file() for name in TEMPLATE_FILES):
        return True
    config = directory / "tokenizer_config.json"
    try:
        if not config.is_file() or config.stat().st_size > MAX_TOKENIZER_CONFIG_BYTES:
            return True  # no tokenizer config (another failure, the trainer's), or too large to read: not judged
        template = json.loads(config.read_bytes()).get("chat_template")
    except (OSError, ValueError, AttributeError) as exc:
        log.info("chat template check: %s unreadable (%s): not judged", config, exc)
        return True
    return bool(template)


def _tokenizer_dir(spec: JobSpec, model_roots: list[str]) -> Path | None:
    config: Any = spec.model.config
    relative = config.tokenizer_path or config.path
    if relative is not None:
        found = [Path(root) / relative for root in model_roots if (Path(root) / relative).is_dir()]
        return found[0] if found else None
    return None  # a registered model: judged by the trainer (its owner is checked later, in the transaction)
