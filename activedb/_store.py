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
        # Columns an INSERT must name: NOT NULL, no default of any kind, not part of the key.
        self.required = frozenset(
            column.name for column in table.columns
            if not column.nullable and column.server_default is None and column.identity is None
            and column.default is None and column.name not in self.key_columns
        )
        # What a new row shows for columns it was not given, before PostgreSQL fills them:
        # the default if it is a constant, else None.
        self.blank_row = {column.name: _constant_default(column) for column in table.columns}
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

    def update(self, columns: frozenset[str]):
        cached = self._statements.get(("update", columns))
        if cached is None:
            cached = self.table.update().where(
                sa.and_(*[self.table.c[name] == sa.bindparam(f"k_{name}") for name in self.key_columns])
            ).values({name: sa.bindparam(f"v_{name}") for name in columns if name not in self.key_columns})
            self._statements[("update", columns)] = cached
        return cached

    # statements, cached per table

    def select_by_keys(self):
        cached = self._statements.get("select_by_keys")
        if cached is None:
            cached = sa.select(self.table).where(self._key_clause.in_(sa.bindparam("keys", expanding=True)))
            self._statements["select_by_keys"] = cached
        return cached

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


def _constant_default(column: sa.Column) -> Any:
    """The value of a constant server default (``0``, ``'x'::text``, ``true``), else None."""
    default = column.server_default
    text = getattr(getattr(default, "arg", None), "text", None) if default is not None else None
    if text is None:
        return None
    text = text.strip()
    if "::" in text:
        text = text.split("::", 1)[0].strip()
    if text.startswith("'") and text.endswith("'"):
        literal = text[1:-1].replace("''", "'")
        if isinstance(column.type, (sa.String, sa.Text, sa.Enum)):
            return literal
        text = literal
    lowered = text.lower()
    if isinstance(column.type, sa.Boolean) and lowered in ("true", "false"):
        return lowered == "true"
    try:
        if isinstance(column.type, sa.Integer):
            return int(text)
        if isinstance(column.type, (sa.Float, sa.Numeric)):
            return float(text)
    except ValueError:
        return None
    return None


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
    statement = info.select_by_keys()
    if lock == "share":
        statement = statement.with_for_update(read=True)
    elif lock == "update":
        statement = statement.with_for_update()
    bound = [key if len(info.key_columns) > 1 else key[0] for key in keys]
    rows = connection.execute(statement, {"keys": bound}).mappings().all()
    return {tuple(row[name] for name in info.key_columns): dict(row) for row in rows}


def apply_write_set(connection: sa.Connection, infos: Mapping[str, TableInfo],
                    writes: Mapping[tuple[str, Key], Entry]) -> int:
    """Apply a merged write set with one batched statement per (table, kind, columns).

    A PATCH that names every required column is an ``INSERT ... ON CONFLICT DO UPDATE``.
    One that does not (an update of some columns of an existing row) is an ``UPDATE``
    when the row exists (one ``SELECT ... FOR UPDATE`` per table finds out) and otherwise
    an INSERT that PostgreSQL rejects with a clear message naming the missing columns.
    """
    deletes: dict[str, list[dict]] = {}
    upserts: dict[tuple[str, frozenset[str]], list[dict]] = {}
    inserts: dict[tuple[str, frozenset[str]], list[dict]] = {}
    partial: dict[str, list[tuple[Key, dict]]] = {}
    for (table_name, key), entry in writes.items():
        info = infos[table_name]
        if entry.kind in (EntryKind.DELETE, EntryKind.REPLACE):
            deletes.setdefault(table_name, []).append({f"k_{n}": v for n, v in zip(info.key_columns, key)})
        if entry.kind is EntryKind.DELETE:
            continue
        row = {**info.full_key_row(key), **entry.values}
        if entry.kind is EntryKind.PATCH:
            if info.required <= row.keys():
                upserts.setdefault((table_name, frozenset(row)), []).append(row)
            else:
                partial.setdefault(table_name, []).append((key, row))
        else:
            inserts.setdefault((table_name, frozenset(row)), []).append(row)
    for table_name, rows in deletes.items():
        connection.execute(infos[table_name].delete(), rows)
    updates: dict[tuple[str, frozenset[str]], list[dict]] = {}
    for table_name, items in partial.items():
        info = infos[table_name]
        existing = fetch_rows(connection, info, [key for key, _ in items], lock="update")
        for key, row in items:
            if key in existing:
                columns = frozenset(row)
                updates.setdefault((table_name, columns), []).append(
                    {**{f"k_{n}": v for n, v in zip(info.key_columns, key)},
                     **{f"v_{n}": v for n, v in row.items() if n not in info.key_columns}})
            else:
                missing = sorted(info.required - row.keys())
                raise InvalidValue(
                    f"write to {table_name!r} creates the new row {key!r} without the NOT NULL column(s) "
                    f"{', '.join(missing)}; give them in write() (nothing was written)"
                )
    for (table_name, columns), rows in updates.items():
        connection.execute(infos[table_name].update(columns), rows)
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
            if getattr(error.orig, "sqlstate", None) == "23502":
                raise InvalidValue(
                    f"insert into {table_name!r}: {str(error.orig).splitlines()[0]}; give every NOT NULL column "
                    f"(nothing was written)"
                ) from None
            raise
    return len(writes)
