"""The loss-scale bounds a float32 scale can honour exactly (torch-free, for the spec and the scaler).

The dynamic loss scale is a float32 tensor, so it can only take float32 values. A
``min_scale`` or ``max_scale`` that float32 cannot represent (``2**24 + 3``, ``1.0000001``)
would be rounded to the *nearest* float32 by a clamp, which may lie outside the bound
(``2**24 + 3`` rounds up to ``2**24 + 4``). Rounding each bound *inward* instead, to
the smallest float32 not below ``min_scale`` and the largest not above ``max_scale``,
keeps every scale inside the bounds the spec gave.
"""

from __future__ import annotations

import struct

#: Largest finite float32.
FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


def _float32_bits(value: float) -> int:
    """The IEEE bits of ``value`` rounded to the nearest float32 (``value`` finite, 0 < value <= FLOAT32_MAX)."""
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    return bits


def _from_bits(bits: int) -> float:
    value: float = struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


def float32_at_least(value: float) -> float:
    """The smallest float32 that is ``>= value`` (``value`` positive and at most :data:`FLOAT32_MAX`)."""
    bits = _float32_bits(value)
    return _from_bits(bits + 1) if _from_bits(bits) < value else _from_bits(bits)


def float32_at_most(value: float) -> float:
    """The largest float32 that is ``<= value`` (``value`` positive and at most :data:`FLOAT32_MAX`)."""
    bits = _float32_bits(value)
    return _from_bits(bits - 1) if _from_bits(bits) > value else _from_bits(bits)


def float32_bounds(min_scale: float, max_scale: float) -> tuple[float, float]:
    """``(min, max)`` rounded inward to float32: every float32 in them lies in ``[min_scale, max_scale]``.

    Args:
        min_scale, max_scale: finite, ``0 < min_scale <= max_scale <= FLOAT32_MAX``.

    Raises:
        ValueError: no float32 lies in ``[min_scale, max_scale]`` (the bounds are closer
            together than float32's resolution there and bracket no float32).
    """
    low, high = float32_at_least(min_scale), float32_at_most(max_scale)
    if low > high:
        raise ValueError(
            f"no float32 loss scale lies in [min_scale, max_scale] = [{min_scale!r}, {max_scale!r}]; "
            f"the nearest are {high!r} and {low!r}"
        )
    return low, high
