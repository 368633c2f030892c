"""Records as the API serves them from the database: typed, yet serialized as exactly the object stored.

The worker stores each step and evaluation record (and each precision switch) as the JSON object
of the fields its trainer wrote (:meth:`halfcast.contracts.records.RecordBase.body`); the API has always
served that object as it is: no ``type``, no field the trainer did not write, the keys in their
stored order. :class:`StoredStep`, :class:`StoredEval` and :class:`StoredSwitch` are the record
models with that serialization (:class:`AsStored`), so the job resource and its pages are typed
(``latest.loss``, ``eval.step``) while their JSON stays byte for byte what it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from halfcast.contracts.records import EvalRecord, PrecisionSwitch, StepRecord


class AsStored(BaseModel):
    """A model that serializes as the object it was read from: the keys it was given, in their order.

    Built from keywords or a mapping, it remembers the keys; a dump keeps only those, in that
    order (a field's alias, such as ``from``, is its key). Mix it in before the record model.
    """

    model_config = ConfigDict(serialize_by_alias=True)

    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_keys(cls, data: Any, handler: ModelWrapValidatorHandler[AsStored]) -> AsStored:
        model = handler(data)
        if isinstance(data, Mapping):
            model._keys = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]  # unannotated: the schema stays the model's
        dumped: dict[str, object] = handler(self)
        if list(dumped) == list(self._keys):  # the common case: every key given, in the fields' order
            return dumped
        names = _names_by_alias(type(self))
        out: dict[str, object] = {}
        for key in self._keys:
            found = key if key in dumped else names.get(key)
            if found is not None and found in dumped:
                out[found] = dumped[found]
        return out


@cache
def _names_by_alias(model: type[BaseModel]) -> dict[str, str]:
    """``{alias: field name}`` of ``model``'s aliased fields (``from`` -> ``from_``)."""
    return {field.alias: name for name, field in model.model_fields.items() if field.alias}


class StoredStep(AsStored, StepRecord):
    """A stored step record (the resource's ``latest``, a point of ``GET /jobs/{id}/metrics``, an SSE ``step``)."""


class StoredEval(AsStored, EvalRecord):
    """A stored evaluation record (the resource's ``eval``, an item of ``GET /jobs/{id}/evals``, an SSE ``eval``)."""


class StoredSwitch(AsStored, PrecisionSwitch):
    """A stored precision switch (an item of the resource's ``precision_switches``, an SSE ``precision_switch``)."""
