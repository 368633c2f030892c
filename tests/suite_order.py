"""The suite's order: longest module first, each module's tests together (``tests/conftest.py`` applies it).

A module's length is what a measured run recorded in :data:`MODULE_DURATIONS` (written by
``tests/module_durations.py``); a module missing there counts by its tests' markers
(:data:`UNMEASURED_S`). The sort is stable, so modules of equal length keep their collection
order and every module its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, TypeVar

#: Seconds per module (file path) of a measured run.
MODULE_DURATIONS = Path(__file__).with_name("module_durations.json")
#: Seconds assumed for a module missing from that file, by the markers of its tests (else 0).
UNMEASURED_S = {"e2e": 60.0, "slow": 20.0}


class Mark(Protocol):
    @property
    def name(self) -> str: ...


class Item(Protocol):
    """What the order reads of a collected test: its node id and its markers."""

    @property
    def nodeid(self) -> str: ...

    def iter_markers(self) -> Iterable[Mark]: ...


#: Any kind of collected test (pytest's items, a test's fakes): the list is sorted in place, so it keeps its type.
ItemT = TypeVar("ItemT", bound=Item)


def order_longest_first(items: list[ItemT]) -> None:
    """Sort ``items`` (a list, in place) longest module first."""
    measured: dict[str, float] = json.loads(MODULE_DURATIONS.read_text())
    weight: dict[str, float] = {}
    for item in items:
        module = module_of(item)
        guess = max((UNMEASURED_S.get(mark.name, 0.0) for mark in item.iter_markers()), default=0.0)
        weight[module] = measured.get(module, max(weight.get(module, 0.0), guess))
    items.sort(key=lambda item: -weight[module_of(item)])


def module_of(item: Item) -> str:
    """The test file of ``item`` (its node id up to the first ``::``)."""
    return item.nodeid.split("::", 1)[0]
