"""A ``*.safetensors`` file's header, checked without loading a tensor: the weights are what they claim.

The format: an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON, then the
tensor data. The header is an object of tensors by name, each ``{"dtype", "shape", "data_offsets":
[begin, end]}`` (offsets into the data), plus an optional ``"__metadata__"`` object of strings. A
file is accepted when the header parses, every tensor's byte span is its dtype's size times its
element count, the spans tile the data from 0 to its end without a gap or an overlap, and the
data ends where the file does: what the ``safetensors`` loader itself requires. A renamed pickle,
a truncated file or a header claiming more than the file holds is refused at upload (``422``)
instead of failing the job later. Only the header is read (at most :data:`MAX_HEADER_BYTES`);
the server needs neither torch nor numpy for it.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

#: Largest header read (the ``safetensors`` loader's own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000
#: Bits per element of each dtype the format names (``F8_*``, ``F4``, ``F6_*`` are sub-byte or byte types).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}
METADATA_KEY = "__metadata__"


class WeightsRejected(ValueError):
    """The file is not a well-formed safetensors file; the message says why."""


def _read_header(path: Path) -> tuple[dict[str, object], int]:
    """The parsed header and the number of data bytes after it."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise WeightsRejected("is shorter than a safetensors header (8 bytes)")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise WeightsRejected(f"declares a {length}-byte header, more than the file holds: not safetensors")
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise WeightsRejected("has a header that is not UTF-8 JSON: not safetensors") from None
    if not isinstance(header, dict):
        raise WeightsRejected("has a header that is not a JSON object: not safetensors")
    return header, size - 8 - length


def _tensor_span(name: str, entry: Any) -> tuple[int, int]:
    """``(begin, end)`` of tensor ``name``; :class:`WeightsRejected` unless its entry is well formed."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise WeightsRejected(f"tensor {name!r} is not {{dtype, shape, data_offsets}}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise WeightsRejected(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise WeightsRejected(f"tensor {name!r} has a shape that is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise WeightsRejected(f"tensor {name!r} has data_offsets that are not [begin, end]")
    begin, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if end < begin or bits % 8 or end - begin != bits // 8:
        raise WeightsRejected(f"tensor {name!r}: {dtype}{shape} does not fill data_offsets {offsets}")
    return begin, end


def _check_metadata(metadata: Any) -> None:
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise WeightsRejected(f"has a {METADATA_KEY} that is not an object of strings")


def check_safetensors(path: Path) -> int:
    """Check ``path``'s header against its size; the number of tensors it holds.

    Raises:
        WeightsRejected: not a well-formed safetensors file (see the module's rules).
    """
    header, data_bytes = _read_header(path)
    if METADATA_KEY in header:
        _check_metadata(header.pop(METADATA_KEY))
    position = 0
    for begin, end in sorted(_tensor_span(name, entry) for name, entry in header.items()):
        if begin != position:
            raise WeightsRejected(f"has tensor data that overlaps or leaves a gap at byte {position}")
        position = end
    if position != data_bytes:
        raise WeightsRejected(f"holds {data_bytes} data bytes but its tensors span {position}")
    return len(header)
