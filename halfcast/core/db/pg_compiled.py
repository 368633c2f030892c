"""SQLAlchemy statements compiled once to psycopg's SQL, for the reads that skip SQLAlchemy's execution.

SQLAlchemy stays the one place a statement is written (its columns, joins and types);
:func:`compile_for` turns one into the SQL text SQLAlchemy itself would send
(``%(name)s`` placeholders) plus the type processing it would apply: each bound
parameter's bind processor and each result column's result processor, for the
dialect of the engine. On psycopg most of these are ``None`` (the driver adapts
strings, numbers, timestamps and JSON itself), and only the non-``None`` ones run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Select

#: A type's conversion of one value (SQLAlchemy's bind and result processors).
Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class CompiledStatement:
    """A statement's SQL for the driver, its literal parameters, and the processors of its binds and columns."""

    sql: str
    #: Parameters the statement carries itself (literal values of the construct), by name.
    literals: Mapping[str, object]
    #: Bind processors by parameter name (those that are not ``None`` only).
    binds: Mapping[str, Processor]
    #: Result processors by column position (those that are not ``None`` only).
    results: Mapping[int, Processor]

    def params(self, values: Mapping[str, object] | None = None) -> dict[str, object]:
        """The driver's parameters: the literals, ``values`` over them, each through its bind processor."""
        params = {**self.literals, **(values or {})}
        for name, process in self.binds.items():
            if name in params:
                params[name] = process(params[name])
        return params

    def row(self, row: Sequence[Any]) -> Sequence[Any]:
        """``row`` as SQLAlchemy would return it: each column through its result processor (none: as it is)."""
        if not self.results:
            return row
        values = list(row)
        for index, process in self.results.items():
            values[index] = process(values[index])
        return values


def compile_for(statement: ClauseElement, dialect: Dialect) -> CompiledStatement:
    """``statement`` compiled for ``dialect`` (a psycopg engine's), with its processors."""
    compiled = statement.compile(dialect=dialect)
    if not isinstance(compiled, SQLCompiler):  # a DDL construct: nothing this module runs
        raise TypeError(f"not a SQL statement: {statement!r}")
    binds: dict[str, Processor] = {}
    literals: dict[str, object] = {}
    for bind, name in compiled.bind_names.items():  # each parameter under the name the SQL gives it
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            binds[name] = process
        if not bind.required:
            literals[name] = bind.effective_value
    results: dict[int, Processor] = {}
    if isinstance(statement, Select):
        for index, column in enumerate(statement.selected_columns):
            process = column.type.dialect_impl(dialect).result_processor(dialect, None)
            if process is not None:
                results[index] = process
    return CompiledStatement(compiled.string, literals, binds, results)
