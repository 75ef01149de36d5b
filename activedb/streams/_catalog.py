"""What definitions are checked against: the declared streams (:class:`StreamSchema`) and the store's
tables (:class:`StoreCatalog`, resolving names as SQL folds unquoted ones, or through the engine's
``aliases``).  Thread-safety: a ``StoreCatalog`` is used under the engine's definition mutex only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, TypeAlias, Union

import sqlalchemy as sa

from activedb.errors import UnknownTable, finite_number

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.streams._events import StreamEvent
from activedb.streams.algebra import Position
from activedb.streams.errors import DefinitionError, UnknownAttribute, UnknownName, UnknownQueryTable, at


#: ``StreamEngine(aliases=…)``: a table name as definitions write it -> the real table, or ``(real table,
#: {column as written: real column})``.
TableAliases: TypeAlias = Mapping[str, Union[str, tuple[str, Mapping[str, str]]]]


def fold(name: str, candidates: Iterable[str]) -> str | None:
    """``name`` among ``candidates`` as SQL resolves an unquoted name: itself, else the one candidate
    equal to it ignoring case (None: none or several)."""
    candidates = list(candidates)
    if name in candidates:
        return name
    folded = [candidate for candidate in candidates if candidate.casefold() == name.casefold()]
    return folded[0] if len(folded) == 1 else None


@dataclass(frozen=True)
class StreamSchema:
    """A declared input stream.

    ``types``: the event types (None: any type; an empty collection, which would admit none, is refused);
    ``attributes``: the attributes every event has (``type_attributes`` adds per-type ones; a type's attributes name each once, and no two
    differing only in case); ``priorities``: per type, the
    order of events with equal timestamps (a finite number, higher first; unlisted last); ``tie_key``:
    a function ``event -> sortable`` ordering equal-timestamp events of equal priority
    (e.g. by worker id).  Events still equal after that are ordered by their content, so
    that the order never depends on arrival (see the README)."""

    name: str
    types: tuple[str, ...] | None
    attributes: tuple[str, ...]
    type_attributes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    priorities: Mapping[str, float] = field(default_factory=dict)
    tie_key: Callable[[StreamEvent], object] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DefinitionError(f"a stream's name is a non-empty text, got {self.name!r}")
        if self.tie_key is not None and not callable(self.tie_key):
            raise DefinitionError(f"stream {self.name}: tie_key is a function event -> sortable (or None), got "
                                  f"{self.tie_key!r}")
        names: object     # (as given: any value a caller passed is checked)
        for parameter, names in (("types", self.types), ("attributes", self.attributes)):
            if isinstance(names, str):       # (tuple() would read it letter by letter)
                raise DefinitionError(f"stream {self.name}: {parameter} is a collection of names, got the text "
                                      f"{names!r}: write {parameter}=[{names!r}]")
            if names is None and parameter == "types":
                continue                     # (any type)
            listed = tuple(names) if isinstance(names, Iterable) else None
            if listed is None or not all(isinstance(name, str) for name in listed):
                raise DefinitionError(f"stream {self.name}: {parameter} is a collection of names (texts), got "
                                      f"{names!r}")
            if parameter == "types" and not listed:     # (None is any type; an empty collection, none)
                raise DefinitionError(f"stream {self.name}: types={names!r} admits no event type, so every event fed to "
                                      f"it would be a dead letter; list the event types it admits, or leave types=None "
                                      f"for any type")
            object.__setattr__(self, parameter, listed)
        per_type: object = self.type_attributes or {}
        declared: dict[str, tuple[str, ...]] = {}
        valid = isinstance(per_type, Mapping)
        for event_type, names in per_type.items() if isinstance(per_type, Mapping) else ():
            named = tuple(names) if isinstance(names, Iterable) and not isinstance(names, str) else None
            if not isinstance(event_type, str) or named is None or not all(isinstance(name, str) for name in named):
                valid = False
                break
            declared[event_type] = named
        if not valid:
            shown = {key: ([value] if isinstance(value, str) else value) for key, value in per_type.items()} \
                if isinstance(per_type, Mapping) else per_type
            raise DefinitionError(f"stream {self.name}: type_attributes maps event type names (texts) to collections "
                                  f"of attribute names (texts), got {per_type!r}; e.g. type_attributes={shown!r}")
        object.__setattr__(self, "type_attributes", declared)
        if self.priorities is not None and (not isinstance(self.priorities, Mapping)
                                            or not all(isinstance(name, str) for name in self.priorities)):
            raise DefinitionError(f"stream {self.name}: priorities maps event type names (texts) to numbers, got "
                                  f"{self.priorities!r}")
        object.__setattr__(self, "priorities", dict(self.priorities or {}))
        # (admission negates a priority: -priority.  NaN orders nothing; -inf would rank a type with the unlisted
        # ones and inf above every other, which a query's or rule's priority may not either)
        for event_type, priority in self.priorities.items():
            if priority is not None and (isinstance(priority, bool) or not isinstance(priority, (int, float))
                                         or not finite_number(priority)):
                raise DefinitionError(f"stream {self.name}: the priority of {event_type!r} is a number (higher first) "
                                      f"or None (unlisted: last), got {priority!r}")
        folded: dict[str, str] = {}
        for event_type in self.types or ():
            if event_type.casefold() in folded:
                raise DefinitionError(f"stream {self.name}: event type {event_type!r} is declared twice")
            folded[event_type.casefold()] = event_type
        object.__setattr__(self, "_types", folded)
        for event_type in self.priorities:
            if self.types is not None and event_type.casefold() not in folded:
                raise UnknownName(f"stream {self.name}: priority for undeclared event type {event_type!r}")
        if self.types is not None:           # (attributes_of looks a type up by its declared spelling)
            spelled: dict[str, tuple[str, ...]] = {}
            for event_type, names in self.type_attributes.items():
                if event_type.casefold() not in folded:
                    raise UnknownName(f"stream {self.name}: attributes for undeclared event type {event_type!r} "
                                      f"(declared: {', '.join(self.types) or 'none'}); correct the type's name in "
                                      f"type_attributes, or declare it in types=[…]")
                spelled[folded[event_type.casefold()]] = spelled.get(folded[event_type.casefold()], ()) + names
            object.__setattr__(self, "type_attributes", spelled)
        for names in (self.attributes, *(self.attributes + extra for extra in self.type_attributes.values())):
            folded_names = [name.casefold() for name in names]     # (the text finds an attribute as ``fold`` does)
            if len(set(folded_names)) == len(names):
                continue
            index = next(index for index, name in enumerate(folded_names) if name in folded_names[:index])
            name, earlier = names[index], names[folded_names.index(folded_names[index])]
            if earlier == name:
                raise DefinitionError(f"stream {self.name}: attribute {name!r} is declared twice (in attributes, or "
                                      f"type_attributes, or both); give each attribute once")
            raise DefinitionError(f"stream {self.name}: attributes {earlier!r} and {name!r} differ only in case (in "
                                  f"attributes, or type_attributes, or both); a query names an attribute ignoring case "
                                  f"(as SQL an unquoted name), so a spelling other than these two would name neither: "
                                  f"give them names that differ otherwise")

    def check_new(self, declared: Iterable[str]) -> None:
        """Refuse (``DefinitionError``) to declare this stream beside the streams named ``declared``: one of that
        name, or of a name equal to it ignoring case — a query's ``ON`` names a stream as SQL names an unquoted name
        (``fold``), so the two could not be told apart there."""
        for name in declared:
            if name == self.name:
                raise DefinitionError(f"stream {self.name!r} is already declared")
            if name.casefold() == self.name.casefold():
                raise DefinitionError(f"stream {self.name!r} differs from the declared stream {name!r} only in case; "
                                      f"a query's ON names a stream ignoring case (as query names are told apart), "
                                      f"so ON {self.name} could not name it: give it another name")

    def resolve_type(self, name: str) -> str | None:
        """The declared spelling of event type ``name`` (case-insensitive), None if unknown."""
        if self.types is None:
            return name
        resolved: str | None = self._types.get(name.casefold())  # type: ignore[attr-defined]  # (__post_init__)
        return resolved

    def attributes_of(self, event_type: str) -> tuple[str, ...]:
        return tuple(self.attributes) + tuple(self.type_attributes.get(event_type, ()))

    def resolve_attribute(self, event_type: str, name: str, position: Position | None) -> str:
        known = self.attributes_of(event_type)
        resolved = fold(name, known)
        if resolved is not None:
            return resolved
        raise UnknownAttribute(
            f"event type {event_type} of stream {self.name} has no attribute {name!r} "
            f"(it has {', '.join(known) or 'none'}); declare it with engine.create_stream(…, attributes=…)",
            **at(position))

    def priority(self, event_type: str) -> float | None:
        known = self.__dict__.setdefault("_priority_of", {})      # per type, found once (admission asks per event)
        if event_type not in known:
            known[event_type] = next((value for declared, value in self.priorities.items()
                                      if declared.casefold() == event_type.casefold()), None)
        priority: float | None = known[event_type]
        return priority


@dataclass(frozen=True)
class TableSchema:
    """A store table as definitions see it: the logical name written, the real table."""

    written: str
    name: str
    key_columns: tuple[str, ...]
    columns: tuple[str, ...]
    required: frozenset[str]
    column_aliases: Mapping[str, str]

    def column(self, name: str, position: Position | None) -> str:
        mapped = self.column_aliases.get(name)
        if mapped is None:
            for logical, real in self.column_aliases.items():
                if logical.casefold() == name.casefold():
                    mapped = real
        resolved = mapped if mapped is not None else fold(name, self.columns)
        if resolved is not None:
            return resolved
        raise UnknownAttribute(f"table {self.written} ({self.name}) has no column {name!r} "
                               f"(columns: {', '.join(self.columns)})", **at(position))


class StoreCatalog:
    """Resolves table names of definitions against the database (see the module docstring)."""

    def __init__(self, db: DatabaseHandle, aliases: TableAliases | None = None):
        self.db = db
        self._aliases: dict[str, tuple[str, dict[str, str]]] = {}
        for logical, target in (aliases or {}).items():
            real, columns = (target, {}) if isinstance(target, str) else target
            self._aliases[logical.casefold()] = (real, dict(columns))
        self._names: list[str] | None = None
        self._schemas: dict[str, TableSchema] = {}

    def table(self, name: str, position: Position | None = None) -> TableSchema:
        cached = self._schemas.get(name)
        if cached is not None:
            return cached
        real, column_aliases = self._aliases.get(name.casefold(), (name, {}))
        actual = self._resolve(real, refresh=False) or self._resolve(real, refresh=True)
        if actual is None:
            raise UnknownQueryTable(
                f"no table {name!r} in the store ({self.db.describe()}); store tables come from Alembic "
                f"migrations (db.upgrade_app), or map the name with StreamEngine(…, aliases={{{name!r}: 'table'}})",
                **at(position))
        try:
            table = self.db.table(actual)
        except UnknownTable as error:   # dropped between listing and reflection
            raise UnknownQueryTable(str(error), **at(position)) from None
        key_columns = tuple(column.name for column in table.primary_key.columns)
        if not key_columns:
            raise DefinitionError(f"table {actual!r} has no primary key; the store addresses rows by key",
                                  **at(position))
        required = frozenset(
            column.name for column in table.columns
            if not column.nullable and column.server_default is None and column.identity is None
            and column.default is None and column.name not in key_columns)
        schema = TableSchema(written=name, name=actual, key_columns=key_columns,
                             columns=tuple(column.name for column in table.columns), required=required,
                             column_aliases=column_aliases)
        for logical, column in column_aliases.items():
            if column not in schema.columns:
                raise UnknownAttribute(f"alias {name}.{logical} maps to {column!r}, which table {actual} does not "
                                       f"have (columns: {', '.join(schema.columns)})")
        self._schemas[name] = schema
        return schema

    def _resolve(self, name: str, *, refresh: bool) -> str | None:
        if self._names is None or refresh:
            self._names = sa.inspect(self.db.engine).get_table_names()
        return fold(name, self._names)
