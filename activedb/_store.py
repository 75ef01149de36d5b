"""The shared store: keys, value checks, private write sets and the batched flush.

A node's writes go to its private **write set**: a dict ``(table, key) ->
Entry``.  Entries compose (``Entry.then``) so that a child's commit can merge
its write set into its parent's and a top-level commit flushes one entry per
row.  Kinds:

* ``PATCH(values)`` — upsert: update the given columns, or insert the row.
* ``INSERT(values)`` — the row must not exist.
* ``DELETE`` — remove the row if present.
* ``REPLACE(values)`` — delete then insert: the row is exactly ``values``.

Composition (earlier ``a`` then later ``b``)::

    a \\ b        PATCH        INSERT        DELETE
    None         PATCH        INSERT        DELETE
    PATCH        PATCH(a|b)   DuplicateKey  DELETE
    INSERT       INSERT(a|b)  DuplicateKey  DELETE*
    REPLACE      REPLACE(a|b) DuplicateKey  DELETE
    DELETE       REPLACE(b)   REPLACE(b)    DELETE

(*) an INSERT followed by a DELETE still flushes a DELETE: harmless.

A read sees the node's own entry, then its ancestors' entries, then committed
data: :func:`resolve` applies a chain of entries to a base image.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from activedb.errors import DuplicateKey, InvalidKey, InvalidValue, UnknownColumn

Key = tuple  # primary-key values, in primary-key column order


class EntryKind(enum.Enum):
    PATCH = "patch"
    INSERT = "insert"
    DELETE = "delete"
    REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: EntryKind
    values: Mapping[str, Any] | None = None   # None only for DELETE

    def then(self, later: "Entry", describe: str) -> "Entry":
        """This entry followed by ``later`` on the same row (see the module table)."""
        if later.kind is EntryKind.DELETE:
            return later
        if self.kind is EntryKind.DELETE:
            return Entry(EntryKind.REPLACE, dict(later.values))
        if later.kind is EntryKind.INSERT:
            raise DuplicateKey(f"insert into {describe}: the row already exists (written earlier in this transaction)")
        if later.kind is EntryKind.REPLACE:
            return later
        return Entry(self.kind, {**self.values, **later.values})

    def apply(self, base: dict | None) -> dict | None:
        """The row image after this entry, given the image before it."""
        if self.kind is EntryKind.DELETE:
            return None
        if self.kind is EntryKind.PATCH and base is not None:
            return {**base, **self.values}
        return dict(self.values)


def resolve(chain: list[Entry], base: dict | None) -> dict | None:
    """Apply entries oldest-first (ancestors before descendants) to ``base``."""
    image = base
    for entry in chain:
        image = entry.apply(image)
    return image


# --- schema checks --------------------------------------------------------------------------

class TableInfo:
    """What the store needs to know about a reflected table, computed once."""

    def __init__(self, table: sa.Table):
        self.table = table
        self.name = table.name
        self.key_columns = [column.name for column in table.primary_key.columns]
        if not self.key_columns:
            raise InvalidKey(f"table {table.name!r} has no primary key; activedb needs one to address rows")
        self.columns = {column.name: column for column in table.columns}
        self._python_types = {name: _python_type(column) for name, column in self.columns.items()}
        self._key_clause = (
            sa.tuple_(*[table.c[name] for name in self.key_columns])
            if len(self.key_columns) > 1 else table.c[self.key_columns[0]]
        )
        self._statements: dict[Any, Any] = {}

    def key(self, key: Any) -> Key:
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) != len(self.key_columns):
            raise InvalidKey(
                f"table {self.name!r} has primary key ({', '.join(self.key_columns)}); "
                f"got {len(key)} value(s): {key!r}"
            )
        for name, value in zip(self.key_columns, key):
            if value is None:
                raise InvalidKey(f"primary key column {self.name}.{name} cannot be None")
            self.check_value(name, value)
        return key

    def key_from_values(self, values: Mapping[str, Any]) -> Key:
        missing = [name for name in self.key_columns if values.get(name) is None]
        if missing:
            raise InvalidKey(
                f"insert into {self.name!r} needs the primary key column(s) {', '.join(missing)}"
            )
        return tuple(values[name] for name in self.key_columns)

    def check_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        for name, value in values.items():
            self.check_value(name, value)
        return dict(values)

    def check_value(self, name: str, value: Any) -> None:
        column = self.columns.get(name)
        if column is None:
            raise UnknownColumn(
                f"table {self.name!r} has no column {name!r}; its columns are {', '.join(self.columns)}"
            )
        if value is None:
            if not column.nullable and column.server_default is None:
                raise InvalidValue(f"column {self.name}.{name} is NOT NULL; got None")
            return
        expected = self._python_types[name]
        if expected is None:
            return
        accepted = isinstance(value, expected)
        if isinstance(value, bool) and bool not in expected and object not in expected:
            accepted = False   # True is an int in Python, but not an INTEGER value
        if not accepted:
            raise InvalidValue(
                f"column {self.name}.{name} is {column.type}; got {value!r} ({type(value).__name__})"
            )

    def full_key_row(self, key: Key) -> dict[str, Any]:
        return dict(zip(self.key_columns, key))

    # statements, cached per table

    def select_by_keys(self, count: int):
        return sa.select(self.table).where(self._key_clause.in_(sa.bindparam("keys", expanding=True)))

    def upsert(self, columns: frozenset[str]):
        cached = self._statements.get(("upsert", columns))
        if cached is None:
            statement = postgresql.insert(self.table)
            update_columns = [name for name in columns if name not in self.key_columns]
            if update_columns:
                cached = statement.on_conflict_do_update(
                    index_elements=self.key_columns,
                    set_={name: statement.excluded[name] for name in update_columns},
                )
            else:
                cached = statement.on_conflict_do_nothing(index_elements=self.key_columns)
            self._statements[("upsert", columns)] = cached
        return cached

    def delete(self):
        cached = self._statements.get("delete")
        if cached is None:
            cached = self.table.delete().where(
                sa.and_(*[self.table.c[name] == sa.bindparam(f"k_{name}") for name in self.key_columns])
            )
            self._statements["delete"] = cached
        return cached


def _python_type(column: sa.Column):
    """Python types accepted for a column, or None for "let PostgreSQL decide"."""
    column_type = column.type
    if isinstance(column_type, sa.Boolean):
        return (bool,)
    if isinstance(column_type, sa.Integer):
        return (int,)
    if isinstance(column_type, (sa.Float, sa.Numeric)):
        return (int, float, decimal.Decimal)
    if isinstance(column_type, (sa.String, sa.Text, sa.Enum)):
        return (str,)
    if isinstance(column_type, sa.DateTime):
        return (datetime.datetime,)
    if isinstance(column_type, sa.Date):
        return (datetime.date,)
    if isinstance(column_type, sa.Interval):
        return (datetime.timedelta,)
    if isinstance(column_type, (sa.JSON, postgresql.JSONB)):
        return (object,)
    if isinstance(column_type, sa.Uuid):
        return (uuid.UUID, str)
    if isinstance(column_type, sa.LargeBinary):
        return (bytes, bytearray, memoryview)
    if isinstance(column_type, postgresql.ARRAY):
        return (list, tuple)
    return None


def jsonable(value: Any) -> Any:
    """A JSON-serialisable copy of a row image or value (for logs and dead letters)."""
    return json.loads(json.dumps(value, default=str))


# --- the flush ------------------------------------------------------------------------------

def fetch_rows(connection: sa.Connection, info: TableInfo, keys: Iterable[Key], *, lock: str | None = None
               ) -> dict[Key, dict]:
    """Committed images of ``keys`` (missing keys absent from the result)."""
    keys = list(keys)
    if not keys:
        return {}
    statement = info.select_by_keys(len(keys))
    if lock == "share":
        statement = statement.with_for_update(read=True)
    elif lock == "update":
        statement = statement.with_for_update()
    bound = [key if len(info.key_columns) > 1 else key[0] for key in keys]
    rows = connection.execute(statement, {"keys": bound}).mappings().all()
    return {tuple(row[name] for name in info.key_columns): dict(row) for row in rows}


def apply_write_set(connection: sa.Connection, infos: Mapping[str, TableInfo],
                    writes: Mapping[tuple[str, Key], Entry]) -> int:
    """Apply a merged write set with one batched statement per (table, kind, columns)."""
    deletes: dict[str, list[dict]] = {}
    upserts: dict[tuple[str, frozenset[str]], list[dict]] = {}
    inserts: dict[tuple[str, frozenset[str]], list[dict]] = {}
    for (table_name, key), entry in writes.items():
        info = infos[table_name]
        if entry.kind in (EntryKind.DELETE, EntryKind.REPLACE):
            deletes.setdefault(table_name, []).append({f"k_{n}": v for n, v in zip(info.key_columns, key)})
        if entry.kind is EntryKind.DELETE:
            continue
        row = {**info.full_key_row(key), **entry.values}
        group = (table_name, frozenset(row))
        if entry.kind is EntryKind.PATCH:
            upserts.setdefault(group, []).append(row)
        else:
            inserts.setdefault(group, []).append(row)
    for table_name, rows in deletes.items():
        connection.execute(infos[table_name].delete(), rows)
    for (table_name, columns), rows in upserts.items():
        connection.execute(infos[table_name].upsert(columns), rows)
    for (table_name, columns), rows in inserts.items():
        try:
            connection.execute(infos[table_name].table.insert(), rows)
        except sa.exc.IntegrityError as error:
            if getattr(error.orig, "sqlstate", None) == "23505":
                raise DuplicateKey(
                    f"insert into {table_name!r}: a row with the same primary key exists in the database "
                    f"({str(error.orig).splitlines()[-1].strip()}); use write() to upsert"
                ) from None
            raise
    return len(writes)
