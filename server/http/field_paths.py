"""The field a 422 item names: its ``loc`` without the source and without pydantic's union tags.

Pydantic puts a segment into ``loc`` for every union it validates through: the tag of a
discriminated union (``["body", "model", "mlp", "config", "hiden_sizes"]`` for a bad
field of an ``mlp`` model's config) and the member's label in a plain union
(``["body", "adapter", "target_modules", "list[constrained-str]", 0]``). Those are not
keys of the submitted document, so a client that follows ``loc`` through its spec (the
dashboard marks the line of the field) or shows it as a path gets it wrong.

:func:`field_path` walks ``loc`` through the body model's core schema and drops exactly
the segments a union inserted: a tagged union's tag, a plain union's member label. Each
422 item gets the result as ``field`` (:func:`with_field`): ``["model", "config",
"hiden_sizes"]``. A segment the schema does not describe (an unknown field, a
validator's own location) ends the walk; it and the rest are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, TypeAdapter

Segment = str | int
#: Schema types that wrap one inner schema under ``"schema"`` and add no ``loc`` segment.
_WRAPPERS = frozenset(
    {
        "definitions",
        "model",
        "default",
        "nullable",
        "function-after",
        "function-before",
        "function-wrap",
        "dataclass",
        "json-or-python",
    }
)
#: Schema types of keyed records: ``fields`` maps a field name to a schema with its own ``"schema"``.
_RECORDS = frozenset({"model-fields", "typed-dict", "dataclass-args"})
#: Schema types of homogeneous sequences, indexed by ``int`` segments.
_SEQUENCES = frozenset({"list", "set", "frozenset", "generator"})


def field_path(schema: Mapping[str, Any], loc: Sequence[Segment]) -> tuple[Segment, ...]:
    """``loc`` (a location inside a value validated by the core ``schema``) without the union tags pydantic added."""
    definitions = {item["ref"]: item for item in _definitions(schema)}
    return tuple(_walk(schema, tuple(loc), definitions)[0])


def body_schema(annotation: Any) -> Mapping[str, Any] | None:
    """The core schema of a route's body type ``annotation``; ``None`` if pydantic cannot describe it."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.__pydantic_core_schema__
    try:
        return _adapter_schema(annotation)
    except Exception:  # noqa: BLE001  # an unhashable or unsupported type: no clean path, the loc stays
        return None


def with_field(item: Mapping[str, object], schema: Mapping[str, Any] | None) -> dict[str, object]:
    """The 422 ``item`` with ``field``: its ``loc`` without the source (``body``, ``query``...) nor union tags.

    Union tags are only known for the body, through its ``schema``; other sources have none. The item's other
    keys (``type``, ``msg``, ``input``, pydantic's ``ctx``...) are kept as they are.
    """
    found = item.get("loc")
    loc = list(found) if isinstance(found, list | tuple) else []
    source, inner = (loc[0], loc[1:]) if loc else (None, [])
    field = field_path(schema, inner) if source == "body" and schema is not None else tuple(inner)
    return {**item, "field": list(field)}


@lru_cache(maxsize=32)
def _adapter_schema(annotation: Any) -> Mapping[str, Any]:
    return TypeAdapter(annotation).core_schema


def _definitions(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The schemas a ``definitions`` schema names (``definition-ref`` targets), if it is one."""
    return list(schema.get("definitions", ())) if schema.get("type") == "definitions" else []


def _walk(schema: Mapping[str, Any], loc: tuple[Segment, ...], defs: Mapping[str, Any]) -> tuple[list[Segment], bool]:
    """``(path, exact)``: ``loc`` through ``schema`` with union tags dropped; ``exact`` if the schema described every segment."""
    if not loc:
        return [], True
    kind = schema.get("type")
    if kind == "definition-ref" and schema.get("schema_ref") in defs:
        return _walk(defs[schema["schema_ref"]], loc, defs)
    if kind in _WRAPPERS and isinstance(inner := schema.get("schema") or schema.get("json_schema"), Mapping):
        return _walk(inner, loc, defs)
    if kind == "tagged-union":
        return _tagged_union(schema, loc, defs)
    if kind == "union":
        return _union(schema, loc, defs)
    child = _child(schema, loc[0])
    if child is None:
        return list(loc), False
    rest, exact = _walk(child, loc[1:], defs)
    return [loc[0], *rest], exact


def _child(schema: Mapping[str, Any], segment: Segment) -> Mapping[str, Any] | None:
    """The schema of ``segment`` (a field name, an index, a key) inside a record, sequence or mapping schema."""
    kind = schema.get("type")
    if kind in _RECORDS and isinstance(segment, str):
        field = schema.get("fields", {}).get(segment)
        return field.get("schema") if isinstance(field, Mapping) else None
    if kind in _SEQUENCES and isinstance(segment, int):
        return schema.get("items_schema") or {"type": "any"}
    if kind == "tuple" and isinstance(segment, int):
        items = schema.get("items_schema") or []
        variadic = schema.get("variadic_item_index")
        index = min(segment, variadic) if variadic is not None else segment
        return items[index] if 0 <= index < len(items) else None
    if kind == "dict":
        return schema.get("values_schema") or {"type": "any"}
    return None


def _tagged_union(
    schema: Mapping[str, Any], loc: tuple[Segment, ...], defs: Mapping[str, Any]
) -> tuple[list[Segment], bool]:
    """Drop the tag (``mlp``) and go on in the member it names."""
    choice = schema.get("choices", {}).get(loc[0])
    if not isinstance(choice, Mapping):  # the error is at the union itself (union_tag_invalid): loc ends there
        return list(loc), False
    return _walk(choice, loc[1:], defs)


def _union(schema: Mapping[str, Any], loc: tuple[Segment, ...], defs: Mapping[str, Any]) -> tuple[list[Segment], bool]:
    """Drop the member label (``list[constrained-str]``) and go on in the member the rest of ``loc`` fits.

    A union with ``custom_error_type`` reports at the union itself, with no label.
    """
    if schema.get("custom_error_type"):
        return list(loc), False
    label, rest = loc[0], loc[1:]
    walks: list[tuple[list[Segment], bool]] = []
    for choice in schema.get("choices", ()):
        member, member_label = (choice[0], choice[1]) if isinstance(choice, (tuple, list)) else (choice, None)
        walk = _walk(member, rest, defs)
        if member_label == label:
            return walk
        walks.append(walk)
    return next((walk for walk in walks if walk[1]), walks[0] if walks else (list(rest), False))
