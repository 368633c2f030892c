"""Issue 24 item 8: :func:`server.registry.safetensors_header.check_safetensors` accepts what the ``safetensors``
library writes and refuses what it cannot load (each refusal cross-checked against the library's own loader)."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from server.registry.safetensors_header import WeightsRejected, check_safetensors


def _raw(header: object, data: bytes, *, length: int | None = None) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}

BAD: dict[str, bytes] = {
    "pickle": pickle.dumps({"w": [1.0, 2.0]}),
    "empty": b"",
    "short-prefix": b"\x10\x00\x00",
    "header-beyond-file": _raw({"w": F32}, b"\0" * 8, length=1 << 40),
    "header-not-json": struct.pack("<Q", 4) + b"nope" + b"\0" * 8,
    "header-not-object": _raw([1, 2], b""),
    "truncated-data": _raw({"w": F32}, b"\0" * 7),
    "trailing-data": _raw({"w": F32}, b"\0" * 9),
    "unknown-dtype": _raw({"w": {**F32, "dtype": "F128"}}, b"\0" * 8),
    "shape-does-not-fill": _raw({"w": {**F32, "shape": [3]}}, b"\0" * 8),
    "negative-shape": _raw({"w": {**F32, "shape": [-2]}}, b"\0" * 8),
    "gap": _raw({"w": {**F32, "data_offsets": [4, 12]}}, b"\0" * 12),
    "overlap": _raw({"a": F32, "b": F32}, b"\0" * 8),
    "missing-key": _raw({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
    "metadata-not-strings": _raw({"__metadata__": {"n": 1}, "w": F32}, b"\0" * 8),
}


def _library_loads(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118  # safe_open has no __iter__
                handle.get_tensor(name)
    except (SafetensorError, ValueError, OSError):
        return False
    return True


def test_what_the_library_writes_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tensors = {"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16), "c": torch.zeros(0, dtype=torch.int8)}
    save_file(tensors, str(path), metadata={"format": "pt"})
    assert check_safetensors(path) == 3


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_file_the_library_cannot_load_is_refused(tmp_path: Path, case: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(BAD[case])
    with pytest.raises(WeightsRejected):
        check_safetensors(path)
    assert not _library_loads(path), case


def test_an_unknown_key_in_a_tensor_entry_is_tolerated_as_the_loader_does(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(_raw({"w": {**F32, "note": "x"}}, b"\0" * 8))
    assert _library_loads(path) and check_safetensors(path) == 1
