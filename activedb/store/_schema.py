"""What the store knows about a reflected table (:class:`TableInfo`): keys, columns, value checks, cached
statements.  Every value is checked at the write, in the writing thread, so that a value PostgreSQL would
reject fails the write with :class:`~activedb.errors.InvalidValue` naming the column, not the commit.

Thread-safety: immutable after construction except its statement cache (a racing duplicate build is harmless).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import re
import struct
import uuid
from functools import partial
from typing import Any, Callable, Hashable, Iterable, Literal, Mapping, TypeVar, Unpack

import sqlalchemy as sa
from psycopg.types.numeric import Float4
from sqlalchemy.dialects import postgresql

from activedb.errors import InvalidKey, InvalidValue, NestedTooDeep, UnknownColumn
from activedb.store._choices import Checked
from activedb.store._nesting import EXACT_DEPTH, Deeper, too_deep, within
from activedb.store._writeset import Key

_Statement = TypeVar("_Statement")

# Integer column ranges PostgreSQL enforces (smallint, integer, bigint).
_INTEGER_RANGES = ((sa.SmallInteger, 2**15), (sa.BigInteger, 2**63), (sa.Integer, 2**31))
# What the quick tests of float columns take at once (the full check, ``_float_problem``, decides the rest): an int
# of a magnitude below these (a double holds every one below 2**1024, a real below 2**128), and for a real a float of
# its normal range or 0.
_DOUBLE_INT_BOUND = 2**1023
_REAL_INT_BOUND = 2**127
_REAL_MAX = 3.4028234663852886e38
_REAL_NORMAL_MIN = 1.1754943508222875e-38


class TableInfo:
    """What the store needs to know about a reflected table, computed once."""

    def __init__(self, table: sa.Table):
        self.table = table
        # Names as plain ``str`` (SQLAlchemy's are a ``str`` subclass, ``quoted_name``): a dict with other keys
        # than exact ``str`` loses the interpreter's fast lookup, and every row image, data event and write set
        # is keyed by these names.
        self.name = str(table.name)
        self.key_columns = [str(column.name) for column in table.primary_key.columns]
        if not self.key_columns:
            raise InvalidKey(f"table {table.name!r} has no primary key; activedb needs one to address rows")
        for column in table.primary_key.columns:
            if isinstance(column.type, (sa.ARRAY, sa.JSON)):        # (postgresql's ARRAY and JSONB among them)
                # Its values (lists, dicts) cannot key write sets, locks and row images, and an array comes back
                # as a list whatever was given: no read could find the row written.
                kind = (f"{str(column.type.item_type).lower()}[]" if isinstance(column.type, sa.ARRAY)
                        else "jsonb" if isinstance(column.type, postgresql.JSONB) else "json")
                raise InvalidKey(
                    f"table {table.name!r} has the primary key column {str(column.name)!r} "
                    f"({kind}): array, json and jsonb key columns are not supported; give the table a surrogate "
                    f"key (e.g. id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, with a UNIQUE "
                    f"constraint on {str(column.name)!r}) and address its rows by that")
        self.columns = {str(column.name): column for column in table.columns}
        # Columns an INSERT must name: NOT NULL, no default of any kind, not part of the key.
        self.required = frozenset(
            name for name, column in self.columns.items()
            if not column.nullable and column.server_default is None and column.identity is None
            and column.default is None and name not in self.key_columns
        )
        # The key columns ``GENERATED ALWAYS AS IDENTITY``: PostgreSQL refuses a value the application gives them
        # (SQLSTATE 428C9), so a new row takes the key activedb draws from the identity's own sequence
        # (``tx.insert`` without it), inserted ``OVERRIDING SYSTEM VALUE``; a key given for a new row is refused.
        self.always_generated = frozenset(
            name for name in self.key_columns
            if (identity := self.columns[name].identity) is not None and identity.always)
        # What a new row shows for columns it was not given, before PostgreSQL fills them:
        # the default if it is a constant, else None.
        self.blank_row = {name: _constant_default(column) for name, column in self.columns.items()}
        self._python_types = {name: _python_type(column) for name, column in self.columns.items()}
        self._checks = {name: _extra_check(column) for name, column in self.columns.items()}
        # Per column, a test that accepts the common valid values at once (None: none): what
        # ``check_value`` would accept, for exact built-in types only; anything else takes the full check.
        # Columns PostgreSQL fills itself and takes no value for (SQLSTATE 428C9): stored generated columns and, but for
        # a key's (``always_generated``), identities GENERATED ALWAYS.  No quick test: ``check_value`` refuses them.
        self._computed = frozenset(
            name for name, column in self.columns.items()
            if column.computed is not None or (column.identity is not None and column.identity.always
                                               and name not in self.key_columns))
        self._quick = {name: None if name in self._computed else _quick_check(column)
                       for name, column in self.columns.items()}
        # The columns whose test is ``_quick_text`` / ``_quick_number``: ``key`` and ``check_values`` run it inline.
        self._text = frozenset(name for name, quick in self._quick.items() if quick is _quick_text)
        self._numbers = frozenset(name for name, quick in self._quick.items()
                                  if quick is _quick_number or quick is _quick_double)
        # Per column, a test of a whole column of values at once, or None: ``check_column``'s way without a Python
        # call per value.
        self._quick_columns = {name: None if name in self._computed else _quick_column_check(column)
                               for name, column in self.columns.items()}
        # Per column, the conversion of an accepted value into the one PostgreSQL gives back, where the two can
        # differ in Python (a uuid given as text): a key must equal the key of the row read back, or a read misses
        # the row and two entries of one write set name it.
        self._converters = {name: converter for name, column in self.columns.items()
                            if (converter := _converter(column)) is not None}
        # Per non-key column whose values PostgreSQL rounds or truncates to what the column keeps (a ``real``, a
        # ``time(p)``, ``timestamp(p)``, ``interval(p)`` or ``interval hour``), that conversion: ``check_values``
        # applies it, so a row image shows what PostgreSQL will store.  Empty for most tables, which pay one test.
        self._rounded = {name: converter for name, converter in self._converters.items()
                         if name not in self.key_columns and getattr(converter, "func", converter) in _ROUNDING}
        #: Whether ``check_values`` converts some value of this table (``_rounded``): a row checked later, a column
        #: at a time (``check_column``, which converts nothing), must still be converted as it is made.
        self.rounds = bool(self._rounded)
        self._key_converters = (tuple(self._converters.get(name) for name in self.key_columns)
                                if any(name in self._converters for name in self.key_columns) else None)
        # Whether ``key`` converts a key column's value: only then can two keys that differ in Python name one row.
        self.converts_keys = self._key_converters is not None
        # (not for a key column with a converter: a value its quick test accepts may still need converting)
        self._quick_key = (self._quick[self.key_columns[0]]
                           if len(self.key_columns) == 1 and self._key_converters is None else None)
        if self._quick_key is _quick_double:
            self._quick_key = _quick_double_key     # (NaN: refused as a key, by the full path)
        self._key_columns_text = self._quick_key is _quick_text
        # The ``real`` columns: a parameter compared with one is sent as a ``real`` (``compared``, ``parameter``), and
        # the driver reads one in binary as the single-precision number widened (``0.10000000149011612``), in text
        # as printed (``0.1``, the store's image and what ``normalised`` makes of either).
        self.reals = frozenset(name for name, column in self.columns.items()
                               if isinstance(column.type, sa.Float) and _is_real(column.type))
        self._key_clause = (
            sa.tuple_(*[self.compared(name) for name in self.key_columns])
            if len(self.key_columns) > 1 else self.compared(self.key_columns[0])
        )
        # The columns whose values are lists or dicts (JSON, JSONB, ARRAY, HSTORE): a row handed to user code gets
        # copies of these too (``_writeset.copy_nested``); empty for most tables, which pay one test for it.
        self.nested = frozenset(name for name, column in self.columns.items()
                                if isinstance(column.type, (sa.JSON, sa.ARRAY, postgresql.HSTORE)))
        self._statements: dict[Hashable, Any] = {}

    def key(self, key: object, checked: Checked = Checked.WRITE) -> Key:
        """``key`` as the table names its row (a tuple of its key columns' values, each checked, converted as stored);
        ``checked``: what the key is for — ``Checked.READ`` from the read paths —, which every refusal's message ends
        with (``Checked.undone``)."""
        if key.__class__ is str and self._key_columns_text and key.isascii() and "\x00" not in key:
            return (key,)         # (``_quick_text`` inline)
        quick = self._quick_key
        if quick is not None and quick(key):
            return (key,)         # a one-column key whose value the full check would accept
        try:
            return self._checked_key(key)
        except (InvalidKey, InvalidValue, UnknownColumn) as refusal:
            _end(refusal, checked)
            raise

    def _checked_key(self, key: object) -> Key:
        """``key``'s full check and conversion (:meth:`key`), its refusal not yet ended."""
        if not isinstance(key, tuple):
            key = named if isinstance(named := self.named(key), tuple) else (key,)
        if len(key) != len(self.key_columns):
            columns = ", ".join(self.key_columns)
            raise InvalidKey(
                f"table {self.name!r} has primary key ({columns}); got {len(key)} value(s): {key!r}"
                + (f" — pass the key as a tuple ({columns})" if len(self.key_columns) > 1 else "")
            )
        for name, value in zip(self.key_columns, key):
            if value is None:
                raise InvalidKey(f"primary key column {self.name}.{name} cannot be None")
            self._check_value(name, value)
            if (isinstance(value, float) and value != value) or (
                    isinstance(value, decimal.Decimal) and value.is_nan()):     # (``!=`` of a signalling one raises)
                self._refuse_nan_key(name, value)
        converters = self._key_converters
        if converters is not None:
            key = tuple(value if convert is None else convert(value) for convert, value in zip(converters, key))
        for name, value in zip(self.key_columns, key):
            if isinstance(value, datetime.datetime):    # (subclasses too: a pandas Timestamp is one)
                self._check_key_datetime(name, value)
        return key

    def _refuse_nan_key(self, name: str, value: object) -> None:
        raise InvalidKey(f"key column {self.name}.{name} is NaN ({value!r}), which equals nothing, itself included: "
                         f"such a key names no row a read could find; give a number (or key the table by another "
                         f"column)")

    def named(self, key: object) -> object:
        """``key`` as given, but a list as the tuple of its values where the key has several columns: no single
        column's value could stand for such a key (a one-column key keeps a list as its value, which its check
        refuses: no key column is an array or JSON one, ``__init__``).  What every entry point that takes a key
        applies first (``key`` itself; a mapping by the keys given, as ``tx.read_many`` returns, or a lock or version
        keyed by them, as the stream views take)."""
        return tuple(key) if isinstance(key, list) and len(self.key_columns) > 1 else key

    def _check_key_datetime(self, name: str, value: datetime.datetime) -> None:
        """Refuse a datetime key PostgreSQL would give back as another Python value: a naive one of a
        ``timestamptz`` column comes back aware (read in the session's time zone), an aware one of a ``timestamp``
        column comes back naive — either way a read by the key given would not find its row."""
        column_type = self.columns[name].type
        if not isinstance(column_type, sa.DateTime):
            return
        aware = value.tzinfo is not None and value.tzinfo.utcoffset(value) is not None
        if column_type.timezone and not aware:
            raise InvalidKey(f"key column {self.name}.{name} is timestamp with time zone and the key {value!r} is a "
                             f"naive datetime, which PostgreSQL would read in the session's time zone and give back "
                             f"aware (a read by this key would not find its row): give an aware datetime, e.g. "
                             f"value.replace(tzinfo=datetime.timezone.utc)")
        if not column_type.timezone and aware:
            raise InvalidKey(f"key column {self.name}.{name} is timestamp without time zone and the key {value!r} is "
                             f"an aware datetime, which PostgreSQL would give back naive (a read by this key would not "
                             f"find its row): give a naive datetime")

    def normalised(self, name: str, value: object) -> object:
        """``value`` of column ``name`` (checked already) as PostgreSQL gives it back where Python would tell the two
        apart (a uuid given as text, a float of a numeric column, a datetime of a date column: ``_converter``): what
        a scan's equalities compare with the rows it reads."""
        convert = self._converters.get(name)
        return value if convert is None or value is None else convert(value)

    def normalised_row(self, image: Mapping[str, object], columns: Iterable[str]) -> dict[str, object]:
        """The values of ``columns`` in ``image`` (a row as a transaction wrote it: values as given) as
        :meth:`normalised` gives them — what a scan's equality, normalised itself, is compared with."""
        return {name: self.normalised(name, image.get(name)) for name in columns}

    def key_from_values(self, values: Mapping[str, object]) -> Key:
        missing = [name for name in self.key_columns if values.get(name) is None]
        if missing:
            raise InvalidKey(
                f"insert into {self.name!r} needs the primary key column(s) {', '.join(missing)}; "
                f"{Checked.WRITE.undone}")
        return tuple(values[name] for name in self.key_columns)

    def check_values(self, values: Mapping[str, object], *, copy: bool = True) -> dict[str, object]:
        """``values`` checked (``check_value`` for each): a copy, or ``values`` itself with ``copy=False`` (a
        dict of the caller's own, such as a call's keyword arguments, changed in place), a non-key value of a column
        that keeps less precision than given as PostgreSQL will store it (``_rounded``: ``0.1000000001`` of a
        ``real`` is ``0.1``, ``12:00:00.6`` of a ``time(0)`` is ``12:00:01``)."""
        quick, text, numbers = self._quick, self._text, self._numbers
        for name, value in values.items():
            kind = value.__class__          # (``_quick_text`` and ``_quick_number`` inline: no call per value)
            if kind is str:
                if name in text and value.isascii() and "\x00" not in value:  # type: ignore[attr-defined, operator]
                    continue
            elif kind is float and name in numbers:
                continue
            accepts = quick.get(name)
            if accepts is None or not accepts(value):
                self.check_value(name, value)
        checked: dict[str, object] = dict(values) if copy else values  # type: ignore[assignment]  # (the caller's)
        if self._rounded:
            for name, convert in self._rounded.items():
                value = checked.get(name)
                if value is not None:
                    checked[name] = convert(value)
        return checked

    def values_without_key(self, key: Key, values: dict[str, object]) -> dict[str, object]:
        """A patch's ``values`` (a dict of the caller's own: checked and changed in place) without the key
        columns, which must equal ``key`` (what ``tx.write(table, key, **values)`` stores)."""
        values = self.check_values(values, copy=False)
        for name, key_value in zip(self.key_columns, key):
            if name in values:
                if self.normalised(name, values.pop(name)) != key_value:      # (a float, an unrounded decimal)
                    raise InvalidKey(f"{self.name}.{name} is part of the key {key!r}; it cannot be changed by write(); "
                                     f"{Checked.WRITE.undone}")
        return values

    def check_column(self, name: str, values: Iterable[object]) -> None:
        """``check_value(name, value)`` for every one of ``values`` (one column of many rows), quicker: the whole
        column tested at once where its type allows (``_quick_column_check``), else a quick test per value; a value
        neither accepts takes ``check_value``, which says what is wrong."""
        values = list(values)
        whole = self._quick_columns.get(name)
        if whole is not None and whole(values):
            return
        accepts = self._quick.get(name)
        if accepts is not None and all(map(accepts, values)):
            return
        for value in values:
            self.check_value(name, value)

    def check_value(self, name: str, value: object, checked: Checked = Checked.WRITE) -> None:
        """Raise if PostgreSQL would refuse ``value`` for column ``name`` (``InvalidValue``, ``UnknownColumn``,
        ``NestedTooDeep``); ``checked`` says what the value is for, which every refusal's message ends with
        (``Checked.undone``)."""
        accepts = self._quick.get(name)
        if accepts is not None and accepts(value):
            return
        try:
            self._check_value(name, value)
        except (InvalidValue, UnknownColumn) as refusal:
            _end(refusal, checked)
            raise

    def _check_value(self, name: str, value: object) -> None:
        """:meth:`check_value` past its quick test, its refusal not yet ended."""
        column = self.columns.get(name)
        if column is None:
            raise UnknownColumn(
                f"table {self.name!r} has no column {name!r}; its columns are {', '.join(self.columns)} — if it was "
                f"added since this process read the table (a migration run elsewhere), call db.schema.refresh() and "
                f"retry")
        if name in self._computed:
            raise InvalidValue(f"column {self.name}.{name} is a generated column, which PostgreSQL computes and "
                               f"takes no value for; omit it (got {value!r})")
        if value is None:
            # None is SQL NULL, never the default: PostgreSQL refuses it for a NOT NULL column with a default too.
            # (A key column with a default — serial — may be None in ``tx.insert``: the key is then drawn.)
            if not column.nullable and (column.server_default is None or name not in self.key_columns):
                raise InvalidValue(f"column {self.name}.{name} is NOT NULL; got None" + (
                    "; omit the column to take its default" if column.server_default is not None else ""))
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
        check = self._checks[name]
        if check is not None:
            try:
                problem = check(value)
            except NestedTooDeep:
                # (a JSON or ARRAY value nested deeper than the check's bounded walk goes, EXACT_DEPTH: refused as its
                # copy would refuse it, naming the column)
                raise too_deep(value, EXACT_DEPTH, name) from None
            if problem is not None:
                raise InvalidValue(f"column {self.name}.{name} ({column.type}): {problem}")

    def equals(self, name: str, value: object) -> sa.ColumnElement[bool]:
        """The SQL condition "column ``name`` equals ``value``" (a scan's equality): a ``json`` column, which has no
        equality operator in PostgreSQL, is compared as ``jsonb`` — equal as Python's ``==`` finds the values read
        back (key order and spacing aside); a ``real`` one with ``value`` cast to ``real`` (``compared``)."""
        column = self.table.c[name]
        if isinstance(column.type, sa.JSON) and not isinstance(column.type, postgresql.JSONB):
            return sa.cast(column, postgresql.JSONB) == value
        return self.compared(name) == value

    def compared(self, name: str) -> sa.ColumnElement[object]:
        """Column ``name`` as a comparison with a bound parameter names it: a ``real`` column's parameters cast to
        ``real`` (``_RealParameter``).  The driver sends a ``float`` as ``double precision``, and PostgreSQL compares
        a ``real`` with a ``double precision`` by widening the ``real``: the stored ``0.1`` (``real``), widened, is
        ``0.10000000149011612``, which the ``0.1`` given (or read back) is not — an equality with it found no row."""
        column = self.table.c[name]
        return sa.type_coerce(column, _RealParameter()) if name in self.reals else column

    def parameter(self, name: str) -> str:
        """The driver SQL of a parameter (``%s``) compared with column ``name``: ``compared``'s cast, in text."""
        return "CAST(%s AS REAL)" if name in self.reals else "%s"

    def refuse_new_row_by_key(self, given: object) -> None:
        """Raise :class:`InvalidKey` if a write would create the row ``given`` of this table, named by a key its
        application chose, while the key is ``GENERATED ALWAYS AS IDENTITY`` (PostgreSQL takes no such key,
        SQLSTATE 428C9): the flush's check and the lowered batch's, one message."""
        if self.always_generated:
            raise InvalidKey(
                f"write to {self.name!r} creates the new row {given!r}, but {self.name}."
                f"{', '.join(sorted(self.always_generated))} is GENERATED ALWAYS AS IDENTITY: PostgreSQL takes no "
                f"key the application gives; insert the row with insert() without the key, which draws it "
                f"(nothing was written)"
            )

    def refuse_given_identity(self, values: Mapping[str, object], what: str, advice: str) -> None:
        """Raise :class:`InvalidKey` if the new row ``values`` (``what``: where it comes from) gives a value for a key
        column ``GENERATED ALWAYS AS IDENTITY``; ``advice`` (with ``{name}``, the column's quoted name) says what to
        do instead."""
        for name in self.always_generated:
            if values.get(name) is not None:
                raise InvalidKey(
                    f"{what}: {self.name}.{name} is GENERATED ALWAYS AS IDENTITY, and PostgreSQL takes no value the "
                    f"application gives it (got {values[name]!r}); {advice.format(name=repr(name))}"
                )

    def full_key_row(self, key: Key) -> dict[str, object]:
        return dict(zip(self.key_columns, key))

    # statements, cached per table

    def update(self, columns: frozenset[str]) -> sa.Update:
        return self.cached(("update", columns), lambda: self.table.update().where(
            sa.and_(*[self.compared(name) == sa.bindparam(f"k_{name}") for name in self.key_columns])
        ).values({name: sa.bindparam(f"v_{name}") for name in columns if name not in self.key_columns}))

    def cached(self, name: Hashable, build: Callable[[], _Statement]) -> _Statement:
        """A statement on this table built once by ``build()`` and kept under ``name``."""
        statement = self._statements.get(name)
        if statement is None:
            statement = self._statements[name] = build()
        return statement

    def driver_processors(self, dialect: sa.Dialect) -> dict[str, Callable[[object], object] | None]:
        """Per column, SQLAlchemy's bind processor of its type for ``dialect`` (e.g. JSON into the driver's
        JSON wrapper), or None: what a statement sent to the driver directly must apply to keep SQLAlchemy's
        adaptation."""
        return self.cached(("driver_processors", dialect.name), lambda: {
            name: column.type.dialect_impl(dialect).bind_processor(dialect) for name, column in self.columns.items()})

    def array_types(self, dialect: sa.Dialect, names: tuple[str, ...]) -> tuple[str, ...] | None:
        """The PostgreSQL types to cast arrays of ``names``' values to (no type modifiers: a cast would
        truncate where an assignment refuses), or None if a column cannot travel in an array (an array or
        a type the store does not know)."""
        types = self.cached(("array_types", dialect.name), lambda: {
            name: _array_element_type(column, dialect) for name, column in self.columns.items()})
        found = tuple(types[name] for name in names)
        return None if None in found else found  # type: ignore[return-value]  # (no None in it then)

    def select_by_keys(self) -> sa.Select[Unpack[tuple[object, ...]]]:
        return self.cached("select_by_keys", lambda: sa.select(self.table).where(
            self._key_clause.in_(sa.bindparam("keys", expanding=True))))

    def select_by_key_array(self, dialect: sa.Dialect, lock: Literal["share", "update"] | None = None,
                            nowait: bool = False, lock_timeout: str | None = None) -> str | None:
        """``select_by_keys`` for a one-column key as driver SQL, ``key = ANY(CAST(%s AS type[]))``: the keys in one
        array parameter (cast to the key's type without modifiers), every column in table order, locked ``FOR
        SHARE`` (``lock="share"``) or ``FOR UPDATE`` (``"update"``), ``NOWAIT`` with ``nowait``, the wait bounded
        for the rest of the transaction by ``lock_timeout`` (as ``lock_row``); None if the key cannot travel in an
        array (or SQLAlchemy would adapt its values)."""
        def build() -> str | None:
            name = self.key_columns[0]
            element = _array_element_type(self.columns[name], dialect) if len(self.key_columns) == 1 else None
            if element is None or self.columns[name].type.dialect_impl(dialect).bind_processor(dialect) is not None:
                return None
            preparer = dialect.identifier_preparer
            # (identifiers come with ``%`` doubled by the preparer already: the dialect's paramstyle is ``pyformat``)
            table = preparer.format_table(self.table)
            columns = ", ".join(preparer.quote(column) for column in self.columns)
            key = preparer.quote(name)
            locking = {None: "", "share": " FOR SHARE", "update": " FOR UPDATE"}[lock] + (" NOWAIT" if lock and nowait else "")
            timeout = (lock_timeout or "").replace("'", "''").replace("%", "%%")
            bound = f" AND set_config('lock_timeout', '{timeout}', true) IS NOT NULL" if lock_timeout else ""
            # (``element`` comes escaped for ``%s`` already)
            return f"SELECT {columns} FROM {table} WHERE {table}.{key} = ANY(CAST(%s AS {element}[])){bound}{locking}"
        return self.cached(("select_by_key_array", dialect.name, lock, nowait, lock_timeout), build)

    def delete(self) -> sa.Delete:
        return self.cached("delete", lambda: self.table.delete().where(
            sa.and_(*[self.compared(name) == sa.bindparam(f"k_{name}") for name in self.key_columns])))


def _end(refusal: InvalidKey | InvalidValue | UnknownColumn, checked: Checked) -> None:
    """End ``refusal``'s message the way ``checked`` says what was not done ("; nothing was read", "; nothing was
    written", "; the scan was not run"): the one place a key's or a value's refusal (:meth:`TableInfo.key`,
    :meth:`TableInfo.check_value`) gets it, whichever check refused."""
    refusal.args = (f"{refusal}; {checked.undone}", *refusal.args[1:])


def text_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store the string ``value`` in a text or jsonb value, or None."""
    if "\x00" in value:
        return f"the text contains a NUL character at position {value.index(chr(0))} (PostgreSQL text cannot hold it)"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return (f"the text contains a lone surrogate {value[error.start]!r} at position {error.start} "
                    f"(not valid UTF-8; PostgreSQL rejects it)")
    return None


def json_problem(value: object, path: str = "$") -> str | None:
    """Why PostgreSQL ``jsonb`` cannot store ``value``, or None (a depth-first check).  A value of plain
    built-in types is checked without naming paths (``_json_ok``); only a value it cannot clear is walked
    again with the path of each element, to say where the problem is.  A value whose lists, tuples and dicts nest
    deeper than ``EXACT_DEPTH`` levels (deeper than a column's value may: its copy refuses it) is refused,
    :class:`~activedb.errors.NestedTooDeep`."""
    if within(_json_ok, value, EXACT_DEPTH):
        return None
    return within(lambda item, levels: _json_problem(item, path, levels), value, EXACT_DEPTH)


def _json_ok(value: Any, levels: int) -> bool:  # (exact-type dispatch, which mypy does not narrow)
    """True if ``value`` is made of ``dict`` (with ``str`` keys), ``list``, ``tuple``, ``str``, ``int``,
    ``bool``, finite ``float`` and None, and none of its texts is one PostgreSQL rejects; False if not, or
    if it holds anything else (a subclass, a ``Mapping``: ``_json_problem`` decides those).  ``levels``: the levels of
    nesting it may have (:class:`Deeper` beyond them)."""
    kind = type(value)
    if kind is str:
        return "\x00" not in value and (value.isascii() or text_problem(value) is None)
    if kind is int or kind is bool or value is None:
        return True
    if kind is dict or kind is list or kind is tuple:
        if not levels:
            raise Deeper
        levels -= 1
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _json_ok(key, levels) or not _json_ok(item, levels):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:      # (the common scalars decided here: long lists of them, one call fewer each)
            element = type(item)
            if element is int or element is bool or item is None:
                continue
            if element is float:
                if item - item != 0.0:     # (inf and nan: not finite; math.isfinite costs a call)
                    return False
                continue
            if element is str:
                if "\x00" in item or not (item.isascii() or text_problem(item) is None):
                    return False
                continue
            if not _json_ok(item, levels):
                return False
        return True
    if kind is float:
        return math.isfinite(value)
    return False


def _json_problem(value: object, path: str, levels: int) -> str | None:
    """``json_problem`` naming the path of every element it looks at (the slow walk); ``levels`` as ``_json_ok``'s."""
    # the exact containers first: an ABC check (``Mapping``) costs far more
    if type(value) is dict:
        return _object_problem(value, path, levels)
    if type(value) is list:
        return _array_problem(value, path, levels)
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot represent"
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else f"{path}: {problem}"
    if isinstance(value, Mapping):
        return _object_problem(value, path, levels)
    if isinstance(value, (list, tuple)):
        return _array_problem(value, path, levels)
    return f"{path} is a {type(value).__name__} ({value!r:.60}), which is not a JSON value"


def _object_problem(value: Mapping[object, object], path: str, levels: int) -> str | None:
    if not levels:
        raise Deeper
    for key, item in value.items():
        if type(key) is not str and not isinstance(key, str):
            return f"{path} has the key {key!r} ({type(key).__name__}); JSON object keys are strings"
        problem = text_problem(key) or _json_problem(item, f"{path}.{key}", levels - 1)
        if problem is not None:
            return problem
    return None


def _array_problem(value: list[object] | tuple[object, ...], path: str, levels: int) -> str | None:
    if not levels:
        raise Deeper
    for index, item in enumerate(value):
        problem = _json_problem(item, f"{path}[{index}]", levels - 1)
        if problem is not None:
            return problem
    return None


def _extra_check(column: sa.Column[Any]) -> Callable[[Any], str | None] | None:
    """A check beyond the Python type for values of ``column``: returns a function
    ``value -> problem or None``, or None when the type check is enough."""
    column_type = column.type
    if isinstance(column_type, sa.ARRAY):
        element = sa.Column("element", column_type.item_type)
        return partial(_array_value_problem, _python_type(element), _extra_check(element),
                       str(column_type.item_type))
    if isinstance(column_type, sa.Enum) and column_type.enums:
        return partial(_enum_problem, tuple(column_type.enums))
    if isinstance(column_type, (sa.String, sa.Text, sa.Enum)):
        return text_problem
    if isinstance(column_type, sa.Integer):
        for integer_type, bound in _INTEGER_RANGES:
            if isinstance(column_type, integer_type):
                def out_of_range(value: int, bound: int = bound) -> str | None:
                    return (None if -bound <= value < bound else f"{value} is outside the column's range "
                            f"[{-bound}, {bound - 1}]")

                return out_of_range
    if isinstance(column_type, sa.Float):
        return partial(_float_problem, _is_real(column_type))
    if isinstance(column_type, (sa.JSON, postgresql.JSONB)):
        return json_problem
    if isinstance(column_type, sa.Uuid):
        return _uuid_problem
    if isinstance(column_type, sa.Date):
        return _date_problem
    if isinstance(column_type, sa.DateTime):
        return _datetime_problem
    return None


#: The most dimensions an array column's value may have: PostgreSQL's (``MAXDIM``), which refuses more (SQLSTATE
#: 54000) at the statement — a scan's, or the flush's, with everything else the tree wrote.
ARRAY_DIMENSIONS = 6


def _array_value_problem(accepted: tuple[type, ...] | None, check: Callable[[object], str | None] | None,
                         element_type: str, value: Iterable[object]) -> str | None:
    """Why an array column whose elements are ``element_type`` (Python types ``accepted``, further check ``check``,
    as ``TableInfo.check_value`` has them for such a column; None: left to PostgreSQL) cannot take ``value`` (a list
    or tuple), or None (``_elements_problem``): more dimensions than :data:`ARRAY_DIMENSIONS` is one.  A value whose
    sub-arrays nest deeper than ``EXACT_DEPTH`` levels (deeper than a column's value may: its copy refuses it) is
    refused, :class:`~activedb.errors.NestedTooDeep`."""
    return within(lambda array, levels: _elements_problem(accepted, check, element_type, array, "", levels), value,
                  EXACT_DEPTH)


def _elements_problem(accepted: tuple[type, ...] | None, check: Callable[[object], str | None] | None,
                      element_type: str, value: Iterable[object], path: str, levels: int) -> str | None:
    """``_array_value_problem``: the first element of ``value`` (the array, or its sub-array at ``path``) that is no
    value of the element type.  None is NULL; a list or tuple where the element type takes none is a further
    dimension, walked the same way; the array's shape first (``_shape_problem``), then its dimensions (at most
    :data:`ARRAY_DIMENSIONS`).  ``levels``: the levels of nesting ``value`` may have, itself one of them
    (:class:`Deeper` beyond them)."""
    if not levels:
        raise Deeper
    if not path and isinstance(value, (list, tuple)):     # (the whole value: a list or tuple, its type checked)
        shape = _shape_problem(accepted, value, "", levels)
        if isinstance(shape, str):
            return shape
        if len(shape) > ARRAY_DIMENSIONS:
            return (f"the array has {len(shape)} dimensions, more than the {ARRAY_DIMENSIONS} PostgreSQL takes; "
                    f"give it at most {ARRAY_DIMENSIONS} (flatten the inner ones), or store the value in a jsonb "
                    f"column")
    for index, item in enumerate(value):
        where = f"{path}[{index}]"
        if item is None:
            continue
        if isinstance(item, (list, tuple)) and (accepted is None or not isinstance(item, accepted)):
            problem = _elements_problem(accepted, check, element_type, item, where, levels - 1)
            if problem is not None:
                return problem
            continue
        if accepted is not None and (not isinstance(item, accepted) or (
                isinstance(item, bool) and bool not in accepted and object not in accepted)):
            return (f"element {where} is {item!r} ({type(item).__name__}), not a value of its element type "
                    f"{element_type}")
        problem = check(item) if check is not None else None
        if problem is not None:
            return f"element {where}: {problem}"
    return None


def _shape_problem(accepted: tuple[type, ...] | None, value: list[object] | tuple[object, ...],
                   path: str, levels: int) -> tuple[int, ...] | str:
    """The shape of the array ``value`` (its length per dimension), or why PostgreSQL would refuse it: a
    multidimensional array is rectangular — each level all sub-arrays (a list or tuple where the element type takes
    none, as ``_elements_problem`` has it) or all elements (None, NULL, among them), the sub-arrays of a level none
    empty and all of one shape. (The driver sends what PostgreSQL refuses as it is, and ``[[[1]], [2]]`` as an
    empty array.)  ``levels``: as ``_elements_problem``'s."""
    if not levels:
        raise Deeper

    def is_sub(item: object) -> bool:
        return isinstance(item, (list, tuple)) and (accepted is None or not isinstance(item, accepted))

    if not value:
        return (0,)
    first = is_sub(value[0])
    for index, item in enumerate(value):
        if is_sub(item) != first:
            what = "a sub-array" if first else "an element"
            return (f"{path}[{index}] is a sub-array where {path}[0] is {what}" if not first else
                    f"{path}[{index}] is an element ({item!r}) where {path}[0] is {what}") + (
                ": each level of a multidimensional array holds only sub-arrays of one shape or only elements "
                "(None among them)")
    if not first:
        return (len(value),)
    shape: tuple[int, ...] | None = None
    for index, item in enumerate(value):
        if not item:
            return (f"{path}[{index}] is an empty sub-array, which PostgreSQL does not take in a multidimensional "
                    f"array; write [] for an empty array")
        found = _shape_problem(accepted, item,  # type: ignore[arg-type]  # (a sub-array)
                               f"{path}[{index}]", levels - 1)
        if isinstance(found, str):
            return found
        if shape is None:
            shape = found
        elif found != shape:
            return (f"{path}[{index}] has {found[0]} element(s) where {path}[0] has {shape[0]}" if found[0] != shape[0]
                    else f"{path}[{index}] has the shape {list(found)} where {path}[0] has {list(shape)}") + (
                ": the sub-arrays of a multidimensional array must all have one shape")
    return (len(value), *shape)  # type: ignore[misc]  # (not empty: a shape was found)


def _is_real(column_type: sa.types.TypeEngine[object]) -> bool:
    """Whether a float column is ``real`` (float4; SQLAlchemy's ``Float(precision=p)`` with ``p <= 24`` is one)."""
    precision = getattr(column_type, "precision", None)
    return isinstance(column_type, sa.REAL) or (isinstance(precision, int) and precision <= 24)


def _float_problem(real: bool, value: object) -> str | None:
    """Why a ``double precision`` column (``real``: a ``real`` one) cannot take ``value`` (an int, float or Decimal),
    or None: PostgreSQL refuses a number beyond the type's range, and one so close to 0 that the type would hold 0;
    infinities and NaN it takes."""
    kind = "real" if real else "double precision"
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return None
    try:
        number = float(value)  # type: ignore[arg-type]  # (an int, float or Decimal: the type was checked)
    except OverflowError:               # an int beyond a double
        return f"{value!r} is outside the range of {kind}"
    if isinstance(value, decimal.Decimal) and value.is_finite() and (
            math.isinf(number) or (number == 0.0 and not value.is_zero())):
        return f"{value!r} is outside the range of {kind}"
    if real and math.isfinite(number):
        try:
            single = struct.unpack("<f", struct.pack("<f", number))[0]
        except OverflowError:           # (float4's rounding of it is no finite number)
            return f"{value!r} is outside the range of real"
        if single == 0.0 and number != 0.0:
            return f"{value!r} is outside the range of real (too close to 0: it would be stored as 0)"
    return None


def _enum_problem(labels: tuple[str, ...], value: object) -> str | None:
    """Why an enum of ``labels`` cannot take ``value`` (a ``str``), or None: PostgreSQL takes its labels only, as
    written."""
    return None if value in labels else f"{value!r} is not one of its labels ({', '.join(labels)})"


def not_a_time(value: datetime.datetime) -> bool:
    """Whether ``value`` is a datetime that is no time: pandas' ``NaT`` (what a DataFrame gives for an empty time
    cell), a ``datetime`` subclass's value not equal to itself, as NaN is not (an exact ``datetime`` always is a
    time).  Stored, it would be a timestamp PostgreSQL keeps past the year 10000, which the driver cannot read back;
    the one test of it (the store's checks of a timestamp or date column, ingestion's timestamps)."""
    return type(value) is not datetime.datetime and value != value


def _not_a_time_problem(value: datetime.datetime) -> str:
    return (f"{value!r} ({type(value).__name__}) is no time (a missing value, as pandas' NaT is), which PostgreSQL "
            f"would store as a timestamp the driver cannot read back: use None for a missing time")


def _datetime_problem(value: object) -> str | None:
    """Why a ``timestamp`` or ``timestamptz`` column cannot take ``value`` (a ``datetime``), or None: one that is
    no time (``not_a_time``)."""
    return _not_a_time_problem(value) if isinstance(value, datetime.datetime) and not_a_time(value) else None


def _date_problem(value: object) -> str | None:
    """Why a ``date`` column cannot take ``value`` (a ``date``, or a ``datetime`` of a day's midnight) as given, or
    None.  PostgreSQL would take the date of any datetime, silently dropping its time of day, and of an aware one
    the date in the session's time zone: a value that is not a day as written is refused, and so is one that is
    no time (``not_a_time``)."""
    if not isinstance(value, datetime.datetime):
        return None
    if not_a_time(value):
        return _not_a_time_problem(value)
    if value.utcoffset() is not None:
        return (f"{value!r} is an aware datetime, whose date PostgreSQL would take in the session's time zone: pass "
                f"a date (value.date() for the day as written)")
    if value.time() != datetime.time():
        return (f"{value!r} has a time of day, which a date cannot hold (PostgreSQL would drop it): pass a date "
                f"(value.date() if the day alone is meant)")
    return None


def _uuid_problem(value: object) -> str | None:
    """Why PostgreSQL cannot read ``value`` (a ``UUID`` or its text) as a uuid, or None."""
    if isinstance(value, str):
        try:
            uuid.UUID(value)
        except ValueError:
            return f"{value!r} is not a UUID"
    return None


def _converter(column: sa.Column[object]) -> Callable[[object], object] | None:
    """For a column whose values PostgreSQL gives back as another Python value than some it accepts: the conversion
    into the one it gives back (``TableInfo.key``, ``TableInfo.normalised``; each ``_as_…`` function says what it
    makes of a value), or None.  A uuid column reads as ``uuid.UUID`` (``as_uuid``, SQLAlchemy's default) or as its
    canonical text, a ``date`` column as ``date``, which never equals a ``datetime`` (a midnight one, the only one
    ``_date_problem`` lets through, is taken as its date)."""
    column_type = column.type
    if isinstance(column_type, sa.Uuid):
        return _as_uuid if column_type.as_uuid else _as_uuid_text
    if isinstance(column_type, sa.CHAR) and column_type.length is not None:
        return partial(_as_padded, length=column_type.length)
    precision = getattr(column_type, "precision", None)
    if isinstance(precision, int) and 0 <= precision < 6:
        if isinstance(column_type, sa.DateTime):
            return partial(_as_timestamp_of, scale=10 ** (6 - precision))
        if isinstance(column_type, sa.Time):
            return partial(_as_time_of, scale=10 ** (6 - precision))
        fields = getattr(column_type, "fields", None)       # (``interval day to second(p)``)
        if isinstance(column_type, postgresql.INTERVAL) and (fields is None or fields.upper().endswith("SECOND")):
            return partial(_as_interval_of, scale=10 ** (6 - precision))
    fields = getattr(column_type, "fields", None)
    if isinstance(column_type, postgresql.INTERVAL) and fields and not fields.upper().endswith("SECOND"):
        last = fields.upper().split()[-1]        # (``year to month``: month; ``hour``: hour)
        return partial(_as_interval_in, unit=_INTERVAL_UNITS.get(last))
    if isinstance(column_type, sa.Numeric) and not isinstance(column_type, sa.Float) and column_type.asdecimal:
        scale = column_type.scale
        return _as_decimal if scale is None else partial(_as_decimal, places=decimal.Decimal(1).scaleb(-scale))
    if isinstance(column_type, sa.Float) and _is_real(column_type):
        return _as_real
    if isinstance(column_type, sa.Date):
        return _as_date
    if isinstance(column_type, (sa.ARRAY, sa.JSON)):
        return _as_lists
    return None


def _as_lists(value: object) -> object:
    """``value`` (of an array or JSON column) with every tuple in it a list, as PostgreSQL gives it back; ``value``
    itself when it holds none."""
    if isinstance(value, (list, tuple)):
        items = [_as_lists(item) for item in value]
        return items if type(value) is not list or any(
            new is not old for new, old in zip(items, value)) else value
    if isinstance(value, dict):
        converted = {key: _as_lists(item) for key, item in value.items()}
        return converted if any(converted[key] is not item for key, item in value.items()) else value
    return value


def _as_decimal(value: object, places: decimal.Decimal | None = None) -> object:
    """A checked value of a numeric column as PostgreSQL gives it back: a ``float`` as the shortest decimal that
    reads back as that float (its ``repr``: ``0.1``, not the binary fraction ``0.1000000000000000055…``), the
    number a user typed; an ``int`` as its ``Decimal`` (equal already, but a batch sends its keys as one array, which
    the driver cannot make of ints and decimals mixed); a ``Decimal`` as it is.  Of a column with a scale
    (``numeric(10, 2)``: ``places`` is ``Decimal('0.01')``), rounded to it as PostgreSQL rounds what it stores, half
    away from zero (``1.005`` is ``Decimal('1.01')``): else the key given and the row's key read back differ, and two
    keys that round to one row would be two rows of a write set."""
    if isinstance(value, float):
        value = decimal.Decimal(float.__repr__(value))
    elif isinstance(value, int):
        return decimal.Decimal(value)
    if places is None or not isinstance(value, decimal.Decimal) or not value.is_finite() or (
            value.as_tuple().exponent >= places.as_tuple().exponent):  # type: ignore[operator]  # (finite: an int)
        return value
    # (enough digits for the result, which has at most one more than the value: quantize refuses to round beyond them)
    return value.quantize(places, decimal.ROUND_HALF_UP, decimal.Context(prec=len(value.as_tuple().digits) + 1))


def _as_real(value: object) -> object:
    """A checked value of a ``real`` column (an ``int``, ``float`` or ``Decimal`` within its range: ``_float_problem``)
    as PostgreSQL gives it back: the single-precision number nearest to it (PostgreSQL's conversion of a ``double
    precision`` into a ``real``), printed as PostgreSQL prints a ``real`` (``extra_float_digits`` at its default: the
    fewest decimal digits strictly nearer to it than to either neighbour, of those the nearest, ``_shortest_real``)
    and read by the driver as a ``float``: ``0.1`` stays ``0.1`` (not ``0.10000000149011612``, the ``real``
    widened), ``0.1000000001`` is ``0.1``, ``16777217`` is ``16777216.0``.  An infinity or NaN is its ``float`` (a
    ``Decimal`` NaN stays as it is: a signalling one has none; NaN is refused as a key, ``TableInfo.key``)."""
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return value
    number = float(value)  # type: ignore[arg-type]  # (an int, float or Decimal: the type was checked)
    if not math.isfinite(number) or number == 0.0:
        return number
    bits = struct.unpack("<I", struct.pack("<f", number))[0]   # (the nearest real; in range: checked)
    return _shortest_real(bits)


def _shortest_real(bits: int) -> float:
    """The single-precision number of ``bits`` (its IEEE 754 bits; finite, not 0) as the ``float`` of the decimal
    PostgreSQL prints it as: the fewest significant digits that lie strictly between the midpoints to its
    neighbours, and of those the nearest to it (of two as near, the one whose last digit is even)."""
    quick = _shortest_real_quick(bits)
    return quick if quick is not None else _shortest_real_exact(bits)


def _shortest_real_exact(bits: int) -> float:
    """``_shortest_real`` in exact decimal arithmetic (the definition; tens of microseconds)."""
    context = decimal.Context(prec=200)         # (exact: a real's value has fewer than 150 significant digits)

    def value(of: int) -> decimal.Decimal:
        return decimal.Decimal(struct.unpack("<f", struct.pack("<I", of))[0])

    exact = value(bits)
    # Its neighbours, one unit of the last place away: the one nearer 0 (0 itself for the smallest, whose bits
    # minus one would be another sign's) and the one farther, which beyond the largest real is its mirror image.
    nearer = value(bits - 1) if bits & 0x7FFFFFFF > 1 else decimal.Decimal(0)
    farther = value(bits + 1)
    if not farther.is_finite():
        farther = context.subtract(context.multiply(2, exact), nearer)
    low, high = sorted((context.divide(context.add(exact, nearer), 2), context.divide(context.add(exact, farther), 2)))
    for digits in range(1, 10):
        quantum = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
        candidates = [printed for rounding in (decimal.ROUND_FLOOR, decimal.ROUND_CEILING)
                      if low < (printed := exact.quantize(quantum, rounding, context)) < high]
        if candidates:
            # (a tie: the one whose last digit is even, as PostgreSQL's printing rounds an exact half)
            return float(min(candidates, key=lambda printed: (abs(context.subtract(printed, exact)),
                                                              printed.as_tuple().digits[-1] % 2)))
    return float(exact)


def _shortest_real_quick(bits: int) -> float | None:
    """``_shortest_real(bits)`` by Python's own correctly rounded printing, or None where it may differ (the exact
    path decides).  The nearest decimal of ``digits`` significant digits (``format``'s ``g``, an exact half to the
    even digit) is, of those of that length, the one ``_shortest_real`` picks when any lies strictly between the
    midpoints to the neighbours; so the fewest digits whose nearest decimal reads back as this real (the driver's
    ``float``, rounded to single precision) give the answer, and a length that does so makes every longer one do so
    (a binary search, a few formattings) — where the two midpoints are equally far, so not for a power of two (its
    lower neighbour is nearer), nor for a subnormal or the largest exponent, and not where a decimal tried has a
    ``float`` within one unit of its last place of a midpoint (a tie, or a double rounding, that ``strtof`` might
    decide otherwise)."""
    exponent = bits >> 23 & 0xFF
    if not bits & 0x7FFFFF or exponent <= 1 or exponent >= 254:
        return None
    real = _REAL_FROM_BITS(_UINT_BYTES(bits))[0]
    low, high, found = 1, 9, None
    while low <= high:
        digits = (low + high) // 2
        printed = float(format(real, _G_FORMATS[digits]))
        below = _DOUBLE_BITS(_DOUBLE_BYTES(printed))[0] & 0x1FFFFFFF     # (the bits a real drops)
        if abs(below - 0x10000000) <= 1:
            return None
        if _REAL_FROM_BITS(_REAL_BYTES(printed))[0] == real:
            found, high = printed, digits - 1
        else:
            low = digits + 1
    return found


_REAL_BYTES, _REAL_FROM_BITS = struct.Struct("<f").pack, struct.Struct("<f").unpack
_UINT_BYTES = struct.Struct("<I").pack
_DOUBLE_BYTES, _DOUBLE_BITS = struct.Struct("<d").pack, struct.Struct("<Q").unpack
_G_FORMATS = [f".{digits}g" for digits in range(10)]


class _RealParameter(sa.types.TypeDecorator[float]):
    """A ``real`` column's type as a comparison's parameter takes it (``TableInfo.compared``): sent as a ``real``
    (the driver's ``Float4``), as the column is stored — the driver sends a ``float`` as ``double precision``.  (Not
    a cast in the SQL: SQLAlchemy renders none for the elements of a key of several columns in an ``IN`` list.)"""

    impl = sa.REAL
    cache_ok = True

    def process_bind_param(self, value: object, dialect: sa.Dialect) -> object:
        return value if value is None or isinstance(value, decimal.Decimal) else Float4(value)  # type: ignore[arg-type]


def _as_padded(value: object, length: int) -> object:
    """A checked value of a ``char(length)`` column as PostgreSQL gives it back: padded with spaces to ``length``
    (its trailing spaces, which PostgreSQL ignores in comparisons and cuts to fit, as it stores it).  A longer one
    is left as it is (PostgreSQL refuses it)."""
    if not isinstance(value, str):
        return value
    text = value.rstrip(" ")
    return text.ljust(length) if len(text) <= length else value


#: PostgreSQL's epoch, from which it rounds a timestamp to its column's precision.
_PG_EPOCH = datetime.datetime(2000, 1, 1)
_PG_EPOCH_UTC = _PG_EPOCH.replace(tzinfo=datetime.timezone.utc)


def _as_timestamp_of(value: object, scale: int) -> object:
    """A checked value of a ``timestamp(p)`` column (``scale``: ``10 ** (6 - p)`` microseconds) as PostgreSQL
    gives it back: rounded to ``p`` fractional digits half away from PostgreSQL's epoch, 2000-01-01, as it rounds
    what it stores (an aware one in UTC, equal to it).  One already of that precision, or whose rounding leaves the
    years a datetime holds, is left as it is."""
    if not isinstance(value, datetime.datetime) or value.microsecond % scale == 0:
        return value
    epoch = _PG_EPOCH_UTC if value.utcoffset() is not None else _PG_EPOCH
    micros = (value - epoch) // datetime.timedelta(microseconds=1)
    half = scale // 2
    rounded = (micros + half) // scale * scale if micros >= 0 else -((half - micros) // scale * scale)
    try:        # (from the epoch, not the value: an aware one's wall clock may skip or repeat an hour)
        return epoch + datetime.timedelta(microseconds=rounded)
    except OverflowError:
        return value


def _round_half_up(micros: int, scale: int) -> int:
    """``micros`` (at least 0) rounded to a multiple of ``scale``, half up: how PostgreSQL rounds a time of day and
    an interval's time to their precision (``AdjustTimeForTypmod``, ``AdjustIntervalForTypmod``)."""
    return (micros + scale // 2) // scale * scale


def _as_time_of(value: object, scale: int) -> object:
    """A value of a ``time(p)`` or ``timetz(p)`` column (``scale``: ``10 ** (6 - p)`` microseconds) as PostgreSQL
    gives it back: rounded to ``p`` fractional digits, half up (its zone kept).  One already of that precision is
    left as it is, and so is one that would round to 24:00:00, which PostgreSQL stores and no ``time`` holds."""
    if not isinstance(value, datetime.time) or value.microsecond % scale == 0:
        return value
    micros = _round_half_up(((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond,
                            scale)
    if micros >= 86_400_000_000:
        return value
    seconds, microsecond = divmod(micros, 1_000_000)
    return value.replace(hour=seconds // 3600, minute=seconds // 60 % 60, second=seconds % 60, microsecond=microsecond)


def _as_interval_of(value: object, scale: int) -> object:
    """A value of an ``interval(p)`` column (``scale``: ``10 ** (6 - p)`` microseconds) as PostgreSQL gives it back:
    the driver sends a ``timedelta`` as its days and its time (from 0 to a day), and PostgreSQL rounds the time to
    ``p`` fractional digits, half away from zero (``-0.4`` seconds, -1 day and 23:59:59.6, is 0 of ``interval(0)``).
    One already of that precision, or whose rounding leaves the days a ``timedelta`` holds, is left as it is."""
    if not isinstance(value, datetime.timedelta) or value.microseconds % scale == 0:
        return value
    try:
        return datetime.timedelta(days=value.days,
                                  microseconds=_round_half_up(value.seconds * 1_000_000 + value.microseconds, scale))
    except OverflowError:       # (rounded past ``timedelta.max``)
        return value


#: The microseconds of an interval's last field, the one PostgreSQL truncates its time to (``AdjustIntervalForTypmod``);
#: a restriction ending in YEAR or MONTH keeps neither days nor time, all a ``timedelta`` holds (None).
_INTERVAL_UNITS = {"DAY": 86_400_000_000, "HOUR": 3_600_000_000, "MINUTE": 60_000_000}


def _as_interval_in(value: object, unit: int | None) -> object:
    """A value of an ``interval`` column restricted to fields coarser than seconds (``interval hour``, ``interval
    day to minute``, ``interval year to month``) as PostgreSQL gives it back: the driver sends a ``timedelta`` as its
    days and its time (from 0 to a day), and PostgreSQL truncates the time to a multiple of ``unit`` microseconds
    (its last field; a day: no time), the days kept — or, ending in YEAR or MONTH (``unit`` None), keeps only months,
    of which a ``timedelta`` has none: 0."""
    if not isinstance(value, datetime.timedelta):
        return value
    if unit is None:
        return datetime.timedelta(0)
    micros = value.seconds * 1_000_000 + value.microseconds
    if micros % unit == 0:
        return value
    return datetime.timedelta(days=value.days, microseconds=micros // unit * unit)


#: The conversions that round or truncate a value to what its column keeps: ``check_values`` applies them to non-key
#: values too (``TableInfo._rounded``); the others change only how a value is spelled (a uuid's text, a float of a
#: numeric column) and apply to keys.
_ROUNDING: frozenset[Callable[..., object]] = frozenset(
    {_as_real, _as_timestamp_of, _as_time_of, _as_interval_of, _as_interval_in})


def _as_date(value: object) -> object:
    """A checked value of a date column (``_date_problem``) as PostgreSQL gives it back: a ``date``."""
    return value.date() if isinstance(value, datetime.datetime) else value


def _as_uuid(value: object) -> uuid.UUID:
    """A checked uuid value (``_uuid_problem``: a ``UUID`` or its text) as a ``UUID``."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _as_uuid_text(value: object) -> str:
    return str(_as_uuid(value))


def _quick_check(column: sa.Column[Any]) -> Callable[[Any], bool] | None:
    """A test ``value -> bool`` that is true only for values ``TableInfo.check_value`` accepts (an ``int``
    in an integer column's range, a ``str`` without NUL that is ASCII in a text column, an ``int`` or
    ``float`` in a numeric column, and in a float column one well within its type's range: exact types, so ``bool``
    and subclasses take the full check), or None.
    False only means the full check, which says what is wrong."""
    column_type = column.type
    if isinstance(column_type, sa.Boolean):
        return None
    if isinstance(column_type, sa.Integer):
        for integer_type, bound in _INTEGER_RANGES:
            if isinstance(column_type, integer_type):
                low = -bound
                return lambda value: value.__class__ is int and low <= value < bound
        return None
    if isinstance(column_type, sa.Enum) and column_type.enums:
        labels = frozenset(column_type.enums)
        return lambda value: value.__class__ is str and value in labels
    if isinstance(column_type, (sa.String, sa.Text, sa.Enum)):
        return _quick_text
    if isinstance(column_type, sa.Float):
        return _quick_real if _is_real(column_type) else _quick_double
    if isinstance(column_type, sa.Numeric):
        return _quick_number
    return None


def _quick_text(value: object) -> bool:
    return value.__class__ is str and value.isascii() and "\x00" not in value


def _quick_number(value: object) -> bool:
    return value.__class__ is float or value.__class__ is int


def _quick_double(value: object) -> bool:
    return type(value) is float or (type(value) is int and -_DOUBLE_INT_BOUND < value < _DOUBLE_INT_BOUND)


def _quick_double_key(value: object) -> bool:
    """``_quick_double`` of a key's value: not NaN, which no key may be (``TableInfo.key`` says so)."""
    return _quick_double(value) and value == value


def _quick_real(value: object) -> bool:
    if type(value) is float:
        return _REAL_NORMAL_MIN <= abs(value) <= _REAL_MAX or value == 0.0
    return type(value) is int and -_REAL_INT_BOUND < value < _REAL_INT_BOUND


_FLOAT_KINDS = frozenset({float, int})


def _floats_or_ints(values: list[object]) -> bool:
    return set(map(type, values)) <= _FLOAT_KINDS


def _doubles(values: list[object]) -> bool:
    """Every value an exact ``float``, or an exact ``int`` ``_quick_double`` takes."""
    kinds = set(map(type, values))
    return kinds <= _FLOAT_KINDS and (int not in kinds or all(
        -_DOUBLE_INT_BOUND < value < _DOUBLE_INT_BOUND for value in values if value.__class__ is int))


def _plain_texts(values: list[object]) -> bool:
    """Every value a ``str`` (the exact type) and all of them ASCII without NUL: one test over their concatenation."""
    if set(map(type, values)) != {str}:
        return not values
    joined = "".join(values)  # type: ignore[arg-type]  # (every one a str: checked above)
    return joined.isascii() and "\x00" not in joined


def _quick_column_check(column: sa.Column[object]) -> Callable[[list[object]], bool] | None:
    """A test ``values -> bool`` of a whole column that is true only if ``_quick_check`` accepts every one of the
    values (float columns: exact ``float`` and ``int``; text columns: exact ``str``, ASCII, no NUL), with no Python
    call per value; or None (the other types: a test per value)."""
    column_type = column.type
    if isinstance(column_type, sa.Enum) and column_type.enums:
        return None             # (a test per value: ``_quick_check``'s of the labels)
    if isinstance(column_type, (sa.String, sa.Text, sa.Enum)):
        return _plain_texts
    if isinstance(column_type, sa.Float):
        return None if _is_real(column_type) else _doubles      # (a real's floats: a test per value)
    if isinstance(column_type, sa.Numeric):
        return _floats_or_ints
    return None


def _array_element_type(column: sa.Column[object], dialect: sa.Dialect) -> str | None:
    """``column``'s type as an array element cast, without modifiers (``VARCHAR(20)`` is ``VARCHAR``), or None."""
    if _python_type(column) is None or isinstance(column.type, (postgresql.ARRAY, sa.ARRAY)):
        return None
    if isinstance(column.type, (sa.CHAR, sa.NCHAR)):
        return "BPCHAR"         # CHAR without a length is char(1): a cast to it would cut every value
    try:
        compiled = column.type.compile(dialect=dialect)
    except sa.exc.CompileError:
        return None
    return re.sub(r"\(\s*\d+\s*(,\s*-?\d+\s*)?\)", "", compiled).replace("%", "%%")


#: A quoted constant as PostgreSQL prints a default, ``'it''s'::text`` (its text, and a cast to a type name, not an
#: expression: ``'a'::text || 'b'::text`` is none).
_QUOTED_DEFAULT = re.compile(r"""'((?:[^']|'')*)'(?:::[\w\s."\[\](),:]+)?""", re.DOTALL)


def _constant_default(column: sa.Column[object]) -> object:
    """The value of a constant server default (``0``, ``'x'::text``, ``true``, ``0.10`` of a numeric column: a
    ``Decimal``, ``'[]'::jsonb``, ``'2026-03-04'::date``, ``'{1,NULL}'::integer[]`` or ``ARRAY[1, 2]``) as PostgreSQL
    stores it and gives it back, else None."""
    text = getattr(getattr(column.server_default, "arg", None), "text", None)
    if text is None:
        return None
    text = text.strip()
    if isinstance(column.type, sa.ARRAY):
        return _array_default(column.type.item_type, text)
    quoted = _QUOTED_DEFAULT.fullmatch(text)
    if quoted is not None:
        return _constant_value(column, quoted.group(1).replace("''", "'"), quoted=True)
    return _constant_value(column, text.split("::", 1)[0].strip(), quoted=False)


def _constant_value(column: sa.Column[object], text: str, quoted: bool) -> object:
    """The value of ``column``'s type written ``text`` — a quoted literal's text (``quoted``) or, unquoted, a number
    or ``true`` / ``false`` — as PostgreSQL stores it and gives it back (rounded, padded: ``_converter``), else
    None.  A date, time or timestamp is taken in PostgreSQL's ISO output (a ``timestamptz`` default as printed in
    the session's time zone, an aware datetime equal to the stored one)."""
    column_type = column.type
    convert = _converter(column) or _unchanged
    if quoted and isinstance(column_type, (sa.String, sa.Text, sa.Enum)):
        return convert(text)
    lowered = text.lower()
    if isinstance(column_type, sa.Boolean):     # (an array's elements are t and f)
        return {"true": True, "false": False, "t": True, "f": False}.get(lowered)
    value: object
    try:
        if isinstance(column_type, sa.JSON):
            return json.loads(text) if quoted else None
        if isinstance(column_type, sa.Integer):
            return int(text)
        if isinstance(column_type, sa.Numeric) and not isinstance(column_type, sa.Float) and column_type.asdecimal:
            return convert(decimal.Decimal(text))
        if isinstance(column_type, (sa.Float, sa.Numeric)):
            return convert(float(text))
        if not quoted:
            return None
        if isinstance(column_type, (sa.DateTime, sa.Time)):
            value = (datetime.datetime if isinstance(column_type, sa.DateTime) else datetime.time).fromisoformat(text)
            # (a zone where the column keeps none, or none where it does: not PostgreSQL's output of that type)
            return convert(value) if (value.tzinfo is not None) == bool(column_type.timezone) else None
        if isinstance(column_type, sa.Date):
            return datetime.date.fromisoformat(text)
    except (ValueError, ArithmeticError):       # (decimal's InvalidOperation is an ArithmeticError)
        return None
    return None


def _unchanged(value: object) -> object:
    return value


#: ``ARRAY[1, -2, NULL]`` (a default's array of unquoted numbers, as PostgreSQL prints it), a cast after it.
_ARRAY_CONSTRUCTOR = re.compile(r"ARRAY\[([\w\s.,+-]*)\](?:::[\w\s.\[\]]+)?", re.IGNORECASE)


def _array_default(item_type: sa.types.TypeEngine[object], text: str) -> object:
    """The value of an array column's constant default ``text`` (``'{1,NULL,"a b"}'::integer[]``, nested for more
    dimensions, or ``ARRAY[1, 2]``) as the driver gives it back — nested lists of the element type's values (each
    as ``_constant_value`` takes it), NULL as None —, else None (so is an array of an element PostgreSQL's output
    of the type would not be)."""
    element = sa.Column("element", item_type)
    quoted = _QUOTED_DEFAULT.fullmatch(text)
    constructed = None if quoted is not None else _ARRAY_CONSTRUCTOR.fullmatch(text)
    if quoted is not None:
        parsed = _array_elements(quoted.group(1).replace("''", "'"))
    elif constructed is not None:
        items = [item.strip() for item in constructed.group(1).split(",")] if constructed.group(1).strip() else []
        parsed = [None if item.upper() == "NULL" else item for item in items]
    else:
        return None
    if parsed is None:
        return None

    def value_of(items: list[object]) -> list[object]:
        values: list[object] = []
        for item in items:
            if isinstance(item, list):
                values.append(value_of(item))
            elif item is None:
                values.append(None)
            elif (value := _constant_value(element, str(item), quoted=quoted is not None)) is None:
                raise ValueError(item)
            else:
                values.append(value)
        return values

    try:
        return value_of(parsed)
    except ValueError:
        return None


def _array_elements(text: str) -> list[object] | None:
    """PostgreSQL's text of an array (``{1,NULL,"a \\"b\\""}``, ``{{1,2},{3,4}}``) as nested lists of its elements'
    texts (NULL: None), or None if ``text`` is no such array (one with explicit bounds, ``[0:1]={1,2}``, included)."""
    position = 0

    def array() -> list[object]:
        nonlocal position
        if text[position] != "{":
            raise ValueError(text)
        position += 1
        items: list[object] = []
        if text[position] == "}":
            position += 1
            return items
        while True:
            if text[position] == "{":
                items.append(array())
            elif text[position] == '"':
                position += 1
                characters = []
                while text[position] != '"':
                    if text[position] == "\\":
                        position += 1
                    characters.append(text[position])
                    position += 1
                position += 1
                items.append("".join(characters))
            else:
                start = position
                while text[position] not in ",}":
                    if text[position] in '{"\\':
                        raise ValueError(text)
                    position += 1
                item = text[start:position].strip()
                items.append(None if item.upper() == "NULL" else item)
            if text[position] == "}":
                position += 1
                return items
            if text[position] != ",":
                raise ValueError(text)
            position += 1

    try:
        parsed = array()
    except (ValueError, IndexError):
        return None
    return parsed if position == len(text) else None


# Python types accepted for a column's type, the first match wins; a type not listed is left to PostgreSQL.
_PYTHON_TYPES = (
    (sa.Boolean, (bool,)),
    (sa.Integer, (int,)),
    ((sa.Float, sa.Numeric), (int, float, decimal.Decimal)),
    ((sa.String, sa.Text, sa.Enum), (str,)),
    (sa.DateTime, (datetime.datetime,)),
    (sa.Date, (datetime.date,)),
    # (a text PostgreSQL parses, '12:00' or '1 hour', as it always did; a reflected interval is the dialect's INTERVAL)
    (sa.Time, (datetime.time, str)),
    ((sa.Interval, postgresql.INTERVAL), (datetime.timedelta, str)),
    ((sa.JSON, postgresql.JSONB), (object,)),
    (sa.Uuid, (uuid.UUID, str)),
    (sa.LargeBinary, (bytes, bytearray, memoryview)),
    (postgresql.ARRAY, (list, tuple)),
)


def _python_type(column: sa.Column[object]) -> tuple[type, ...] | None:
    """Python types accepted for a column, or None for "let PostgreSQL decide"."""
    return next((accepted for kinds, accepted in _PYTHON_TYPES if isinstance(column.type, kinds)), None)
