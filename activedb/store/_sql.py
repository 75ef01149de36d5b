"""The store's SQL: reading committed rows by key, applying a merged write set in batched statements,
and :func:`jsonable`, the one conversion of arbitrary values into storable JSON.

Every function takes the connection it runs on; none opens one, commits or retries.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import enum
import json
import json.encoder
import math
import operator
from itertools import chain, repeat
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Literal, Mapping, Sequence, TypeAlias, TypeVar, Unpack, cast, overload

import psycopg
import psycopg.adapt
import psycopg.types.json
from psycopg.rows import TupleRow
import sqlalchemy as sa

from activedb.errors import NOT_NULL_VIOLATION, UNIQUE_VIOLATION, DuplicateKey, Failure, InvalidValue, classify
from activedb.store import _prepared as prepared
from activedb.store._choices import IsolationLevel
from activedb.store._nesting import JSONABLE_DEPTH
from activedb.store._schema import TableInfo
from activedb.store._statements import in_one_statement, statement_spans
from activedb.store._writeset import Entry, EntryKind, Key


def is_connection_failure(error: BaseException) -> bool:
    """True if ``error`` means the connection to PostgreSQL broke or could not be opened, not that a
    statement was refused (:func:`activedb.errors.classify` decides)."""
    return classify(error) is Failure.CONNECTION_LOST


def driver_error(statement: str, parameters: Sequence[object] | Mapping[str, object] | None, error: psycopg.Error,
                 driver: psycopg.Connection[TupleRow]) -> sa.exc.StatementError:
    """SQLAlchemy's exception for ``error``, which the psycopg connection ``driver`` raised on ``statement`` in one
    of activedb's own driver calls (outside SQLAlchemy's execution), as SQLAlchemy raises one for a statement it ran:
    a ``DBAPIError`` whose ``connection_invalidated`` says whether ``driver`` is lost (closed or broken), which
    :func:`activedb.errors.classify` reads to tell a lost connection from the client's refusal of the statement."""
    lost = driver.closed or driver.broken or driver.pgconn.status != psycopg.pq.ConnStatus.OK
    return sa.exc.DBAPIError.instance(statement, parameters, error, psycopg.Error, connection_invalidated=lost)


def storable_text(value: str) -> str:
    """``value`` with what PostgreSQL cannot store spelled out: NUL as ``\\u0000`` and lone surrogates as
    ``\\udXXX`` escapes (text, so nothing of the original is lost from view)."""
    if "\x00" in value:
        value = value.replace("\x00", "\\u0000")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


#: A JSON value as ``json.dumps`` and PostgreSQL's ``jsonb`` take it (what :func:`jsonable` returns).
Json: TypeAlias = "None | bool | int | float | str | list[Json] | dict[str, Json]"

_Key = TypeVar("_Key")


@overload
def jsonable(value: Mapping[_Key, object], *, tagged: bool = False) -> dict[str, Json]: ...


@overload
def jsonable(value: object, *, tagged: bool = False) -> Json: ...


def jsonable(value: object, *, tagged: bool = False) -> Json:
    """``value`` converted to something ``json.dumps`` **and PostgreSQL ``jsonb``** accept.

    datetimes, dates and times become ISO-8601 strings; ``Decimal`` and non-finite floats become
    strings; bytes become base64 strings; mappings and sequences are converted recursively (keys become
    strings) down to :data:`JSONABLE_DEPTH` levels — a value nested deeper becomes a text naming its type and the
    bound; text PostgreSQL cannot store is made storable (:func:`storable_text`); anything else
    becomes its ``repr``.  ``tagged`` (a dead letter's readable form): bytes and non-finite floats are tagged as
    :func:`~activedb.store.exact_json` tags them, ``{"$bytes": base64}`` and ``{"$float": "nan"}``, so they are not
    mistaken for text, and a mapping's key that starts with ``$`` gets one more (:func:`tagged_key`), so no mapping
    of the value's reads as a tag: :func:`from_jsonable` reads the form back.  Used for dead letters, logs and
    annotations.
    """
    return _jsonable(value, tagged, JSONABLE_DEPTH)


def tagged_key(key: str) -> str:
    """``key``, a mapping's key, as :func:`jsonable` with ``tagged`` shows it: one that starts with ``$`` with one ``$``
    more (``$bytes`` → ``$$bytes``), so that only a tag is a one-key object whose key starts with a single ``$``."""
    return f"${key}" if key.startswith("$") else key


def _jsonable(value: object, tagged: bool, depth: int) -> Json:
    """:func:`jsonable` of ``value``, converting at most ``depth`` more levels of nesting."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": str(value)} if tagged else str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = base64.b64encode(bytes(value)).decode("ascii")
        return {"$bytes": text} if tagged else text
    nested = isinstance(value, (Mapping, list, tuple, set, frozenset))
    if nested and depth <= 0:
        return f"<{type(value).__name__} nested deeper than {JSONABLE_DEPTH} levels: not shown>"
    if isinstance(value, Mapping):
        if tagged:
            return {tagged_key(storable_text(str(key))): _jsonable(item, tagged, depth - 1)
                    for key, item in value.items()}
        return {storable_text(str(key)): _jsonable(item, tagged, depth - 1) for key, item in value.items()}
    if nested:
        return [_jsonable(item, tagged, depth - 1) for item in value]     # type: ignore[attr-defined]
    return storable_text(repr(value))


#: Keys per statement when reading rows by key (PostgreSQL's limit is 65,535 bind parameters).
FETCH_CHUNK = 20_000


def fetch_rows(connection: sa.Connection, info: TableInfo, keys: Iterable[Key], *,
               lock: Literal["share", "update"] | None = None,
               nowait: bool = False, lock_timeout: str | None = None) -> dict[Key, dict[str, object]]:
    """Committed images of ``keys`` (missing keys absent from the result); ``lock`` ``"share"`` or
    ``"update"`` locks them (``nowait``: PostgreSQL refuses with SQLSTATE 55P03 instead of waiting for a row
    another transaction has locked; ``lock_timeout``: after waiting that long, as ``lock_row``, and so does every
    later lock wait of the transaction).  The keys go in statements of at most :data:`ROWS_PER_STATEMENT` keys and
    :data:`~activedb.store.STATEMENT_BYTES` of them (a one-column key's as one array each; others in an ``IN`` list
    of at most :data:`FETCH_CHUNK` parameters), one after another in ``connection``'s transaction."""
    keys = list(keys)
    if not keys:
        return {}
    names = info.key_columns
    if len(names) == 1 and _uniform(bound := [key[0] for key in keys]):
        sql = info.select_by_key_array(connection.dialect, lock, nowait, lock_timeout)
        if sql is not None:
            # One array parameter a statement (integers and floats as one array literal: ``array_literal``), at most
            # ROWS_PER_STATEMENT keys and STATEMENT_BYTES of them each, one statement after another in the
            # caller's transaction.
            spans = _spans(info, tuple(names), [bound], ROWS_PER_STATEMENT)
            if spans is None:
                return _fetch_by_array(connection, info, sql, array_literal(bound, True) or bound)
            in_spans: dict[Key, dict[str, object]] = {}
            for start, stop in spans:
                part = bound[start:stop]
                in_spans.update(_fetch_by_array(connection, info, sql, array_literal(part, True) or part))
            return in_spans
    statement = info.select_by_keys()
    if lock_timeout is not None:
        statement = statement.where(sa.func.set_config("lock_timeout", lock_timeout, True).is_not(None))
    if lock == "share":
        statement = statement.with_for_update(read=True, nowait=nowait)
    elif lock == "update":
        statement = statement.with_for_update(nowait=nowait)
    found: dict[Key, dict[str, object]] = {}
    bound_keys = [key if len(names) > 1 else key[0] for key in keys]
    # At most FETCH_CHUNK parameters a statement (PostgreSQL takes at most 65,535), within the flush's bounds too.
    most = min(FETCH_CHUNK // len(names), ROWS_PER_STATEMENT)
    for start, stop in _spans(info, tuple(names), list(zip(*keys)), most) or [(0, len(bound_keys))]:
        rows_by_key(connection.execute(statement, {"keys": bound_keys[start:stop]}), names, found)
    return found


def _fetch_by_array(connection: sa.Connection, info: TableInfo, sql: str, keys: object) -> dict[Key, dict[str, object]]:
    """``fetch_rows`` of a one-column key whose values travel in one array (``sql``: ``select_by_key_array``):
    sent as driver SQL (SQLAlchemy's execution, its events and its exceptions, no statement to compile), the rows
    read from the driver's cursor, each column through its type's result processor (as ``lock_row``'s image, which
    the flush compares with these) — SQLAlchemy's rows and their mappings cost more than the rest of the fetch."""
    result = connection.exec_driver_sql(sql, (keys,))
    try:
        cursor: psycopg.Cursor[TupleRow] = result.cursor  # type: ignore[assignment]  # (the dialect's: psycopg's)
        dialect = connection.dialect
        readers = info.cached(("fetch_rows:readers", dialect.name),
                              lambda: _result_processors(dialect, info, cursor.description))  # type: ignore[arg-type]  # (a SELECT)
        position = tuple(info.columns).index(info.key_columns[0])
        found: dict[Key, dict[str, object]] = {}
        rows = cursor.fetchall()      # (iterating the cursor checks its result once per row, in Python)
        if all(reader is None for _, reader in readers):
            columns = tuple(name for name, _ in readers)
            for row in rows:
                found[(row[position],)] = dict(zip(columns, row))
        else:
            for row in rows:
                image = {name: value if reader is None else reader(value) for (name, reader), value in zip(readers, row)}
                found[(image[info.key_columns[0]],)] = image
        return found
    finally:
        result.close()


def rows_by_key(result: sa.CursorResult[Unpack[tuple[object, ...]]], key_columns: list[str], found: dict[Key, dict[str, object]] | None = None
                ) -> dict[Key, dict[str, object]]:
    """The rows of ``result`` as ``{key: {column: value}}`` (added to ``found`` if given, and returned): made
    from the plain rows with the column names taken once — a ``RowMapping`` per row and its ``dict()`` cost
    about as much again as the rest of the fetch, PostgreSQL's work included."""
    if found is None:
        found = {}
    columns = tuple(result.keys())
    positions = [columns.index(name) for name in key_columns]
    if len(positions) == 1:
        position = positions[0]
        found.update(((row[position],), dict(zip(columns, row))) for row in result.all())
    else:
        found.update((tuple(row[index] for index in positions), dict(zip(columns, row))) for row in result.all())
    return found


def lock_row(connection: sa.Connection, info: TableInfo, key: Key, *, lock_timeout: str,
             begin: IsolationLevel | None = None) -> dict[str, object] | None:
    """The committed image of row ``key`` locked ``FOR UPDATE`` in ``connection``'s transaction (None: no row),
    the lock wait bounded by ``lock_timeout`` (``set_config('lock_timeout', …, true)`` is evaluated by the scan,
    before the row is locked: no round trip of its own).  ``begin`` (an isolation level; the connection in
    autocommit, no transaction open): open the transaction in the same round trip — ``BEGIN …; SELECT …`` as
    one query, its parameters bound by the driver on the client (a query of several statements cannot take
    server-side parameters), the ``SELECT`` prepared on the server (``EXECUTE``, :mod:`._prepared`); the
    transaction stays open (a ``BEGIN`` outlives its query string).

    The statement goes to the driver directly (it is on the path of every read for update, where SQLAlchemy's
    execution costs more than the driver's); the image is the one ``fetch_rows`` returns — each column's
    value through its type's result processor, as SQLAlchemy applies it.  Errors reach the caller as
    SQLAlchemy's exceptions, as from ``connection.execute``."""
    dialect = connection.dialect
    if begin is not None:
        begin = IsolationLevel.parse(begin, "lock_row(begin=...)")
        if begin is IsolationLevel.AUTOCOMMIT:
            raise ValueError("lock_row(begin=...): a lock lives in a transaction; give a level that opens one")
    statement = info.cached(("lock_row", lock_timeout), lambda: _lock_row_statement(dialect, info, lock_timeout))
    processors = info.driver_processors(dialect)
    parameters = tuple(value if processors.get(name) is None else processors[name](value)  # type: ignore[misc]
                       for name, value in zip(info.key_columns, key))
    driver: psycopg.Connection[TupleRow] = connection.connection.driver_connection  # type: ignore[assignment]
    try:
        if begin is None:
            cursor = driver.execute(statement, parameters)
        else:
            cursor = _begin_and_lock(connection, driver, statement, parameters, f"BEGIN ISOLATION LEVEL {begin}")
        row = cursor.fetchone()
    except driver.Error as error:
        raise driver_error(statement, parameters, error, driver) from None
    if row is None:
        return None
    # The statement's columns are the table's, in its order: their result processors are the same for every
    # row (a migration that changes a column's type makes a new TableInfo, and so a new cache).
    readers = info.cached(("lock_row:readers", dialect.name),
                          lambda: _result_processors(dialect, info, cursor.description))  # type: ignore[arg-type]  # (a SELECT)
    return {name: value if reader is None else reader(value) for (name, reader), value in zip(readers, row)}


def _begin_and_lock(connection: sa.Connection, driver: psycopg.Connection[TupleRow], statement: str,
                    parameters: tuple[object, ...], begin: str) -> psycopg.ClientCursor[TupleRow]:
    """``BEGIN …; EXECUTE`` the prepared ``statement`` as one query (``_prepared.execute``); the cursor at the row.
    A prepared statement the server no longer has (deallocated behind the registry's back) or whose result
    type changed fails the string once: the transaction it opened is rolled back and the string sent again,
    the statement prepared anew."""
    try:
        return prepared.execute(connection, statement, parameters, before=(begin,))
    except driver.Error as error:
        if getattr(error, "sqlstate", None) not in (prepared.GONE, prepared.STALE):
            raise
        driver.rollback()               # (the driver may deallocate every prepared statement as it rolls back)
        prepared.rolled_back(connection)
    return prepared.execute(connection, statement, parameters, before=(begin,))


def _lock_row_statement(dialect: sa.Dialect, info: TableInfo, lock_timeout: str) -> str:
    preparer = dialect.identifier_preparer
    # (The preparer's identifiers come with ``%`` doubled already: the dialect's paramstyle is ``pyformat``.)
    table = preparer.format_table(info.table)
    columns = ", ".join(preparer.quote(name) for name in info.columns)
    match = " AND ".join(f"{preparer.quote(name)} = {info.parameter(name)}" for name in info.key_columns)
    timeout = lock_timeout.replace("'", "''").replace("%", "%%")
    return (f"SELECT {columns} FROM {table} WHERE {match} "
            f"AND set_config('lock_timeout', '{timeout}', true) IS NOT NULL FOR UPDATE")


def _result_processors(dialect: sa.Dialect, info: TableInfo, description: Sequence[psycopg.Column]
                       ) -> tuple[tuple[str, Callable[[object], object] | None], ...]:
    """Per selected column (in ``info.columns`` order), its name and SQLAlchemy's result processor of its type
    for the driver's type code, or None."""
    return tuple((name, column.type.dialect_impl(dialect).result_processor(dialect, described.type_code))
                 for (name, column), described in zip(info.columns.items(), description))


def apply_write_set(connection: sa.Connection, infos: Mapping[str, TableInfo],
                    writes: Mapping[tuple[str, Key], Entry], *, along: tuple[str, tuple[object, ...]] | None = None,
                    commit: bool = False, leading: Sequence[tuple[str, tuple[object, ...] | dict[str, object]]] = ()) -> int:
    """Apply a merged write set with one batched statement per (table, kind, columns) — more, one after another in
    the same transaction, for a group past :data:`ROWS_PER_STATEMENT` rows or
    :data:`~activedb.store.STATEMENT_BYTES` of values (``_statements_of``).

    A PATCH that names every required column is an ``INSERT ... ON CONFLICT DO UPDATE``.
    One that does not (an update of some columns of an existing row) is an ``UPDATE``
    when the row exists (one ``SELECT ... FOR UPDATE`` per table finds out) and otherwise
    an INSERT that PostgreSQL rejects with a clear message naming the missing columns.

    The statements go to the driver as plain SQL (:func:`_statement`): a group of rows is one statement over
    ``unnest`` of one array per column, or, when a column cannot travel as an array, the driver's
    ``executemany`` (pipelined).  Values are adapted exactly as SQLAlchemy adapts them (its bind processor
    of each column type, where it has one), and errors reach the caller as SQLAlchemy's exceptions.

    ``along`` (driver SQL with ``%s`` parameters, and its parameters) is one more data-modifying statement
    for the same transaction, e.g. the caller's log row: it rides in the last statement as a ``WITH``
    clause (no round trip of its own) when that statement is sent once, else it is sent after it.

    ``commit=True``: the transaction ends with a ``COMMIT`` sent in the same round trip as the last statement —
    the caller must have nothing left to write, and its own commit afterwards finds nothing open (the driver
    sends none).  On a connection in autocommit at the driver, inside a transaction it opened itself (e.g. with
    :func:`lock_row`'s ``begin``), the last statement, ``along`` and the ``COMMIT`` are one query string when
    that statement carries ``along`` and is sent once; otherwise, and in a transaction the driver opened, a
    driver pipeline.  An error of either, the COMMIT's included, is SQLAlchemy's exception as ever and nothing is
    committed.

    ``leading``: more statements of the caller's (driver SQL and parameters) whose results it does not read, sent
    in the round trip of the last statement, before it (a driver pipeline; on the autocommit connections of the
    one-string path, one round trip each before the string).  PostgreSQL runs nothing after a failing one; its error
    is SQLAlchemy's, and an error that is not the last statement's own is not taken for it (``DuplicateKey`` is
    raised only for a unique violation of that statement's table).
    """
    deletes: dict[str, list[tuple[object, ...]]] = {}
    # Rows as (key, values) pairs grouped by table and the columns they name (besides the key).
    upserts: dict[tuple[str, frozenset[str]], list[tuple[Key, Mapping[str, object]]]] = {}
    inserts: dict[tuple[str, frozenset[str]], list[tuple[Key, Mapping[str, object]]]] = {}
    partial: dict[str, list[tuple[Key, Mapping[str, object]]]] = {}
    absent: dict[str, list[Key]] = {}
    # The group of each (table, kind, columns in the entry's order), found once per such shape: rows of one
    # shape are most of a write set, and the shape's tuple costs less than its column set per row.
    shapes: dict[tuple[str, bool, tuple[str, ...]], list[tuple[Key, Mapping[str, object]]]] = {}
    ABSENT, DELETE, REPLACE, PATCH = EntryKind.ABSENT, EntryKind.DELETE, EntryKind.REPLACE, EntryKind.PATCH  # (once)
    for (table_name, key), entry in writes.items():
        kind = entry.kind
        if kind is ABSENT:
            absent.setdefault(table_name, []).append(key)
            continue
        if kind is DELETE or kind is REPLACE:
            deletes.setdefault(table_name, []).append(key)
            if kind is DELETE:
                continue
        values = entry.values
        patch = kind is PATCH
        shape = (table_name, patch, tuple(values))
        group = shapes.get(shape)
        if group is None:
            if not patch:
                group = inserts.setdefault((table_name, frozenset(values)), [])
            # The required columns are never key columns: the key is always there.
            elif infos[table_name].required <= values.keys() and not infos[table_name].always_generated:
                group = upserts.setdefault((table_name, frozenset(values)), [])
            else:
                group = partial.setdefault(table_name, [])
            shapes[shape] = group
        group.append((key, values))
    for table_name, keys in absent.items():
        # Rows the tree inserted and deleted again: nothing to write, but they must still be absent — a
        # row another process committed since would make the tree's insert a duplicate in any serial order.
        found = fetch_rows(connection, infos[table_name], keys)
        if found:
            raise DuplicateKey(
                f"insert into {table_name!r}: the row {next(iter(found))!r}, which this transaction inserted and "
                f"deleted again, was inserted by another transaction since; nothing was written — re-run the "
                f"transaction", table=table_name)
    plan: list[_Planned] = []
    for table_name, keys in deletes.items():
        info = infos[table_name]
        plan.extend(_statements_of(connection, info, "delete", tuple(info.key_columns),
                                   [list(values) for values in zip(*keys)]))
    if partial:     # the deletes go first (as ever), before the rows to update are locked
        _run(connection, plan, None)
        plan = []
    updates: dict[tuple[str, frozenset[str]], list[tuple[Key, Mapping[str, object]]]] = {}
    for table_name, items in partial.items():
        info = infos[table_name]
        existing = fetch_rows(connection, info, [key for key, _ in items], lock="update")
        for key, values in items:
            if key in existing:
                if values:      # (a write of no columns to an existing row changes nothing)
                    updates.setdefault((table_name, frozenset(values)), []).append((key, values))
            elif info.always_generated:
                info.refuse_new_row_by_key(key)
            else:
                missing = sorted(info.required - values.keys())
                raise InvalidValue(
                    f"write to {table_name!r} creates the new row {key!r} without the NOT NULL column(s) "
                    f"{', '.join(missing)}; give them in write() (nothing was written)"
                )
    for statement_kind, groups in (("update", updates), ("upsert", upserts), ("insert", inserts)):
        for (table_name, columns), pairs in groups.items():
            info = infos[table_name]
            plan.extend(_statements_of(connection, info, statement_kind, *_as_columns(info, columns, pairs)))
    _run(connection, plan, along, commit=commit, leading=leading)
    return len(writes)


def _run(connection: sa.Connection, plan: list[_Planned],
         along: tuple[str, tuple[object, ...]] | None, *, commit: bool = False,
         leading: Sequence[tuple[str, tuple[object, ...] | dict[str, object]]] = ()) -> None:
    """Send the statements of ``plan`` in order, then ``along`` (folded into the last one if it can be);
    ``commit``: then COMMIT, in the same round trip as the last of them; ``leading`` in that round trip too, before
    the last statement (``apply_write_set``)."""
    if not plan:
        with _then_commit(connection, commit, pipeline=bool(leading)):
            _send_leading(connection, leading)
            if along is not None:
                connection.exec_driver_sql(*along)
        return
    # On a connection in autocommit at the driver (the transaction opened by its user's BEGIN, whose statements
    # are prepared on the server: ``_prepared``), the last statement folded with ``along`` and COMMIT is one query
    # string bound on the client, so no binary parameters there.  Elsewhere (a transaction the driver opened) the
    # COMMIT rides in a pipeline with it (``_then_commit``): a pooled connection's registry would first be checked.
    in_string = commit and along is not None and connection.connection.driver_connection.autocommit  # type: ignore[union-attr]
    for number, (info, kind, order, columns) in enumerate(plan, 1):
        final = number == len(plan)
        last = along if final else None
        try:
            binary = not (in_string and final)
            statement, parameters = _statement(connection, info, kind, order, columns, binary)
            folded = last is not None and isinstance(parameters, tuple)
            if folded:
                statement, parameters = (f"WITH activedb_along AS ({last[0]}) {statement}",  # type: ignore[index]
                                         (*last[1], *parameters))  # type: ignore[index]  # (folded: both there)
            if in_string and final and folded:
                _send_leading(connection, leading)        # (held connections: one round trip each)
                _execute_then_commit(connection, statement, parameters)  # type: ignore[arg-type]  # (folded: a tuple)
                continue
            with _then_commit(connection, commit and final, pipeline=final and bool(leading)):
                if final:
                    _send_leading(connection, leading)
                connection.exec_driver_sql(statement, parameters)
                if last is not None and not folded:
                    connection.exec_driver_sql(*last)
        except sa.exc.IntegrityError as error:
            if kind == "insert" and _error_table(error) in (None, info.table.name):
                _raise_insert_error(info.name, error, info.table.primary_key)
            raise


def _send_leading(connection: sa.Connection, leading: Sequence[tuple[str, tuple[object, ...] | dict[str, object]]]) -> None:
    for statement, parameters in leading:
        connection.exec_driver_sql(statement, parameters)


def _error_table(error: sa.exc.DBAPIError) -> str | None:
    """The table PostgreSQL names in ``error`` (its diagnostics), if any."""
    diagnostics = getattr(error.orig, "diag", None)
    return getattr(diagnostics, "table_name", None)


def _execute_then_commit(connection: sa.Connection, statement: str, parameters: tuple[object, ...]) -> None:
    """``statement`` and ``COMMIT`` as one query string, its parameters bound by the driver on the client and the
    statement prepared on the server (the way :func:`lock_row` sends ``BEGIN``): one round trip and one driver
    call, where a pipeline of the two costs two cursors and SQLAlchemy's execution around the first.
    PostgreSQL runs nothing after a failing statement of the string, so an error commits nothing; it reaches
    the caller as SQLAlchemy's exception."""
    driver: psycopg.Connection[TupleRow] = connection.connection.driver_connection  # type: ignore[assignment]
    try:
        prepared.execute(connection, statement, parameters, after=("COMMIT",))
    except driver.Error as error:
        raise driver_error(f"{statement}; COMMIT", parameters, error, driver) from None


@contextlib.contextmanager
def _then_commit(connection: sa.Connection, commit: bool, *, pipeline: bool = False) -> Iterator[None]:
    """If ``commit``: the statements sent in the block, then ``COMMIT``, in one driver pipeline (one round
    trip); else, with ``pipeline``, the statements in one pipeline without it; the driver's errors (raised when the
    pipeline syncs) become SQLAlchemy's."""
    if not (commit or pipeline):
        yield
        return
    driver: psycopg.Connection[TupleRow] = connection.connection.driver_connection  # type: ignore[assignment]
    try:
        with driver.pipeline():
            yield
            if commit:
                driver.execute("COMMIT")
    except driver.Error as error:
        raise driver_error("COMMIT" if commit else "the flush's last statements (one pipeline)", None, error,
                           driver) from None


def _raise_insert_error(table_name: str, error: sa.exc.IntegrityError, primary_key: sa.PrimaryKeyConstraint) -> None:
    """``DuplicateKey`` for a unique violation of the table's ``primary_key`` (another UNIQUE constraint's
    is left to the caller, as any constraint's), ``InvalidValue`` for a missing NOT NULL column."""
    constraint = getattr(getattr(error.orig, "diag", None), "constraint_name", None)
    if getattr(error.orig, "sqlstate", None) == UNIQUE_VIOLATION and constraint in (None, primary_key.name):
        raise DuplicateKey(
            f"insert into {table_name!r}: a row with the same primary key exists in the database "
            f"({str(error.orig).splitlines()[-1].strip()}); use write() to upsert a row whose key you give — a key "
            f"insert() drew from the table's sequence means the sequence is behind the table's keys (rows inserted "
            f"with keys of their own): set it past them, e.g. SELECT setval(pg_get_serial_sequence('<table>', "
            f"'<key column>'), max(<key column>)) FROM <table>", table=table_name
        ) from None
    if getattr(error.orig, "sqlstate", None) == NOT_NULL_VIOLATION:
        raise InvalidValue(
            f"insert into {table_name!r}: {str(error.orig).splitlines()[0]}; give every NOT NULL column "
            f"(nothing was written)"
        ) from None


#: Rows from which a group travels as one ``unnest`` statement rather than ``executemany``.
UNNEST_MIN = 2

#: The most rows of one table, kind and column set one statement of a flush writes; the most bytes of their values
#: together is :data:`~activedb.store.STATEMENT_BYTES` (as ``_statements_of`` estimates them): a group beyond either
#: bound goes out in more statements, one after another in the flush's transaction (``statement_spans``, the dead
#: letters' split).  The same bounds hold the keys of one statement of :func:`fetch_rows` (a one-column key's array).
#: Large enough that a common flush is one statement; read at each flush and fetch (a test may lower it).
ROWS_PER_STATEMENT = 10_000

#: One statement of a flush's plan: the table, the kind of statement (``insert``, ``upsert``, ``update``,
#: ``delete``), its columns' order (the key columns first) and one list of values per column of it.
_Planned: TypeAlias = tuple[TableInfo, str, tuple[str, ...], list[list[object]]]


def _statements_of(connection: sa.Connection, info: TableInfo, kind: str, order: tuple[str, ...],
                   columns: list[list[object]]) -> list[_Planned]:
    """The statements of ``kind`` that write ``info``'s rows whose values ``columns`` lists (one list per column of
    ``order``), each column's values through its type's bind processor (``TableInfo.driver_processors``): one — what
    a flush sends for all but a group past a bound —, or as many as ``statement_spans`` splits them into, at most
    :data:`ROWS_PER_STATEMENT` rows and :data:`~activedb.store.STATEMENT_BYTES` of values each, in the rows' order
    (``_spans``).  A JSON column's values of a group are encoded here, once: the text the driver sends is what is
    measured, and the driver is handed that text (``_encode_json``); so is an array column's value the store can write
    as an array literal (``_array_texts``), which the driver sends as it is."""
    processors = info.driver_processors(connection.dialect)
    given = columns
    columns = [values if (processor := processors.get(name)) is None else list(map(processor, values))
               for name, values in zip(order, given)]
    if len(given[0]) < 2:
        return [(info, kind, order, columns)]
    encoded: dict[int, int] = {}
    sized: dict[int, list[int]] = {}
    for index, size in info.cached(("statement_bytes", order), lambda: _row_bytes(info, order))[1]:
        if size is _Size.ENCODED and (encoded_bytes := _encode_json(connection, columns[index])) is not None:
            encoded[index] = encoded_bytes
        elif size is _Size.ARRAY:
            columns[index], sized[index] = _array_texts(columns[index])
    spans = _spans(info, order, given, ROWS_PER_STATEMENT, {index: columns[index] for index in encoded}, encoded,
                   sized)
    if spans is None:
        return [(info, kind, order, columns)]
    return [(info, kind, order, [values[start:stop] for values in columns]) for start, stop in spans]


def _spans(info: TableInfo, order: tuple[str, ...], columns: Sequence[Sequence[object]], most: int,
           encoded: Mapping[int, Sequence[object]] = MappingProxyType({}),
           encoded_bytes: Mapping[int, int] = MappingProxyType({}),
           sized: Mapping[int, Sequence[int]] = MappingProxyType({})) -> list[tuple[int, int]] | None:
    """The ``(start, stop)`` of the statements that carry the rows whose values ``columns`` lists (one list per
    column of ``order``), at most ``most`` rows and :data:`~activedb.store.STATEMENT_BYTES` of values each
    (``statement_spans``); None when they all go in one — what the common case learns from the total alone.  A
    value's bytes are estimated (``_Size``): a column of a fixed-size type costs its bound a row, a text's or bytes'
    length and a number's digits are counted in C, an unknown column's values (a time given as text, an array of
    another element type) encoded as JSON by the C encoder (``_values_bytes``); a JSON column ``encoded`` lists (its
    values as the driver takes them: its encoded text's wrappers, ``_encode_json``) counts its text's length,
    ``encoded_bytes`` its total; a column ``sized`` lists (an array column's, ``_array_texts``) counts the sizes listed,
    measured once.  A row's sizes are listed only for rows to split."""
    count = len(columns[0])
    if count < 2:
        return None
    fixed, measured = info.cached(("statement_bytes", order), lambda: _row_bytes(info, order))
    total = fixed * count
    for index, size in measured:
        values = columns[index]
        total += (encoded_bytes[index] if index in encoded_bytes else sum(sized[index]) if index in sized else
                  sum(map(len, filter(None, values))) if size is _Size.LENGTH else      # type: ignore[arg-type]
                  sum(map(len, map(str, values))) if size is _Size.DIGITS else _values_bytes(values))
    if in_one_statement(count, total, most):
        return None
    sizes = [fixed] * count
    for index, _ in measured:
        row_bytes: Iterable[int] = ([0 if value is None else len(value.obj)      # type: ignore[attr-defined]
                                     for value in encoded[index]] if index in encoded else
                                    sized[index] if index in sized else map(_value_bytes, columns[index]))
        sizes = [row + value for row, value in zip(sizes, row_bytes)]
    return statement_spans(sizes, most)


class _Size(enum.Enum):
    """How ``_statements_of`` estimates the bytes of a column's values."""

    LENGTH = "a text's or bytes' length (None: 0)"
    DIGITS = "the length of the number's text"
    MEASURED = "each value's bytes as _value_bytes estimates them"
    ENCODED = "a JSON value's text as the driver sends it, encoded once by _encode_json"
    ARRAY = "an array's literal as the driver sends it, made once by _array_texts (else as MEASURED)"


#: The bytes a value of a fixed-size type (a number but ``numeric``, a bool, a time, a uuid) is counted as: at most
#: about its text's length.
_FIXED_BYTES = 40


def _row_bytes(info: TableInfo, order: tuple[str, ...]) -> tuple[int, tuple[tuple[int, _Size], ...]]:
    """The bytes a row's columns ``order`` of ``info`` of a fixed-size type take together, and the index and
    ``_Size`` of each other column (``_statements_of``)."""
    fixed = 0
    measured: list[tuple[int, _Size]] = []
    for index, name in enumerate(order):
        column_type = info.columns[name].type
        if isinstance(column_type, (sa.String, sa.LargeBinary)):       # (text, varchar, an enum; bytea)
            measured.append((index, _Size.LENGTH))
        elif isinstance(column_type, (sa.Boolean, sa.Integer, sa.Float, sa.DateTime, sa.Date, sa.Uuid)):
            fixed += _FIXED_BYTES
        elif isinstance(column_type, sa.Numeric):
            measured.append((index, _Size.DIGITS))
        elif isinstance(column_type, sa.JSON):          # (json, jsonb)
            measured.append((index, _Size.ENCODED))
        elif isinstance(column_type, sa.ARRAY) and isinstance(column_type.item_type, _LITERAL_ITEMS):
            measured.append((index, _Size.ARRAY))
        else:       # (an array, a time or interval given as text, a type the store does not know)
            measured.append((index, _Size.MEASURED))
    return fixed, tuple(measured)


#: The element types of an array column whose values may travel as array literals (``_array_texts``): a literal
#: of integers, floats or quoted texts is read by the element type's own input function, as the driver's text would be.
_LITERAL_ITEMS = (sa.Integer, sa.Float, sa.String)


def _array_texts(values: list[object]) -> tuple[list[object], list[int]]:
    """The values of an array column of a group of rows (``_LITERAL_ITEMS``), each list the store can write as one
    array literal (``_array_text``) replaced by that text — a parameter of unknown type, which PostgreSQL reads as the
    column's type, as it reads the driver's own array text —, and each value's size: the literal's length, the
    bytes ``_value_bytes`` estimates for a value left to the driver (an array of other elements, nested lists), 0 for
    None.  Each value is encoded once: the text measured is the text sent."""
    texts = list(map(_array_text, values))
    sent = [value if text is None else text for value, text in zip(values, texts)]
    return sent, [_value_bytes(value) for value in sent]


def _array_text(value: object) -> str | None:
    """``value`` as one array literal if it is a list of exact ints, of exact floats, or of exact texts without NUL,
    any of them with None elements (``NULL``), or empty; else None (left to the driver).  ``array_literal``'s
    text where it makes one; the elements of the others quoted and escaped as it quotes them."""
    if value.__class__ is not list:
        return None
    literal = array_literal(value, False)
    if literal is not None or not value:
        return literal if value else "{}"
    kinds = set(map(type, value))
    if None not in value or not (kinds <= _INT_OR_NONE or kinds <= _STR_OR_NONE):
        return None
    if kinds <= _INT_OR_NONE:
        return "{" + ",".join(["NULL" if item is None else str(item) for item in value]) + "}"
    present: list[str] = [item for item in value if item is not None]
    if "\x00".join(present).count("\x00") != len(present) - 1:
        return None
    return "{" + ",".join(["NULL" if item is None else
                           '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
                           for item in value]) + "}"


def _value_bytes(value: object) -> int:
    """About the bytes ``value`` takes as a statement's parameter: a text's or bytes' length, else the length of its
    JSON text (lists and dicts, numbers; anything else as its ``str``)."""
    if value is None:
        return 0
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return len(value)
    try:
        return sum(map(len, _json_parts(value, 0)))
    except (TypeError, ValueError):
        return len(str(value))


def _values_bytes(values: Sequence[object]) -> int:
    """The sum of ``_value_bytes`` over ``values`` (about: a text counts its quotes too), without a Python call per
    value — the C encoder's over all of them — unless one is no JSON value (a key that is no text: each measured)."""
    try:
        return sum(map(len, chain.from_iterable(map(_json_parts, values, repeat(0)))))
    except (TypeError, ValueError):
        return sum(map(_value_bytes, values))


#: A value's compact JSON text in parts (``_json_parts(value, 0)``): the C encoder where the interpreter has it; a value
#: of another type than JSON's as its ``str``.  Values reach a flush checked: none holds itself.
_C_ENCODER: Callable[..., Callable[[object, int], Iterable[str]]] | None = getattr(json.encoder, "c_make_encoder", None)
_json_parts: Callable[[object, int], Iterable[str]] = (
    _C_ENCODER(None, str, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    if _C_ENCODER is not None else
    lambda value, _: json.JSONEncoder(check_circular=False, separators=(",", ":"), default=str).iterencode(value))


def _encode_json(connection: sa.Connection, values: list[object]) -> int | None:
    """Encode the values of a JSON column of a flush, as its type's bind processor gave them (psycopg's ``Json`` or
    ``Jsonb`` wrapper of a value, None for SQL NULL), once, in place: each wrapper then holds its value's text, as the
    driver's own encoder makes it (``json.dumps`` unless the engine's ``json_serializer`` or psycopg's
    ``set_json_dumps`` chose another), and hands it over as it is (its ``dumps``: ``str``, or ``bytes`` for an
    encoder that makes bytes) — the driver sends it without encoding the value again.  Returns the texts' length
    together; None, the values left as they were for the driver to encode, when they are not such wrappers or
    the encoder refuses one (the driver's error, as before)."""
    present = list(filter(None, values))     # (a wrapper is true)
    kinds = set(map(type, present))
    if not present or len(kinds) != 1 or not kinds <= _DRIVER_JSON:
        return None
    wrappers = cast("list[psycopg.types.json.Json | psycopg.types.json.Jsonb]", present)
    driver: psycopg.Connection[TupleRow] = connection.connection.driver_connection  # type: ignore[assignment]
    dumps = getattr(driver.adapters.get_dumper(kinds.pop(), psycopg.adapt.PyFormat.AUTO), "_dumps", None)
    if dumps is None:
        return None
    try:
        texts = (_encoded_json(list(map(_OBJECT, wrappers))) if dumps is json.dumps
                 else list(map(dumps, map(_OBJECT, wrappers))))
    except (TypeError, ValueError):
        return None
    verbatim = _VERBATIM.get(frozenset(map(type, texts)))
    if verbatim is None:
        return None
    for wrapper, text in zip(wrappers, texts):
        wrapper.obj = text
        wrapper.dumps = verbatim
    return sum(map(len, texts))


def _encoded_json(values: Sequence[object]) -> list[str]:
    """``json.dumps`` of each of ``values``, as ``_encode_json`` makes them (its C encoder, no Python call a value)."""
    return list(map("".join, map(_dumps_parts, values, repeat(0))))


_DRIVER_JSON = frozenset({psycopg.types.json.Json, psycopg.types.json.Jsonb})
_OBJECT = operator.attrgetter("obj")
#: The identity a wrapper's ``dumps`` is made, by the type of the encoded texts (``_encode_json``).
_VERBATIM: dict[frozenset[type], psycopg.types.json.JsonDumpsFunction] = {
    frozenset({str}): str, frozenset({bytes}): bytes}
#: ``json.dumps``'s text of a value in parts (``_dumps_parts(value, 0)``): its C encoder with its settings.
_dumps_parts: Callable[[object, int], Iterable[str]] = (
    _C_ENCODER(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False,
               True)
    if _C_ENCODER is not None else lambda value, _: (json.dumps(value),))


def _as_columns(info: TableInfo, columns: frozenset[str], pairs: list[tuple[Key, Mapping[str, object]]]
                ) -> tuple[tuple[str, ...], list[list[object]]]:
    """The column order of ``pairs`` (key, values over ``columns``) — key columns first, then the other
    columns in table order — and their values as one list per column in it (the key's values for the key
    columns).  Lists per column, not a tuple per row: what the ``unnest`` statement sends, without a container
    per row that outlives the flush's other allocations (each one more for the cyclic collector to visit)."""
    keys = info.key_columns
    rest = tuple(name for name in info.columns if name in columns and name not in keys)
    order = (*keys, *rest)
    if len(keys) == 1:
        values_of: list[list[object]] = [[key[0] for key, _ in pairs]]
    else:
        values_of = [list(values) for values in zip(*(key for key, _ in pairs))]
    values_of.extend([values[name] for _, values in pairs] for name in rest)
    return order, values_of


def _statement(connection: sa.Connection, info: TableInfo, kind: str, order: tuple[str, ...],
               columns: list[list[object]], binary: bool = True
               ) -> tuple[str, tuple[object, ...] | list[tuple[object, ...]]]:
    """One ``kind`` statement (``insert``, ``upsert``, ``update``, ``delete``) of ``info``'s table for the rows whose
    values ``columns`` lists (one list per column of ``order``, the key columns first; each value as the driver takes
    it, through its type's bind processor: ``_statements_of``), as driver SQL and its parameters: a tuple when it is
    sent once, a list of tuples for the driver's ``executemany``.  ``binary``: JSON arrays may travel in the
    driver's binary format (:data:`BINARY_ARRAYS`)."""
    if len(columns[0]) >= UNNEST_MIN:
        casts = info.array_types(connection.dialect, order)
        if casts is not None and all(_uniform(values) for values in columns):
            # A column of exact integers or floats (and, bound on the client, of strings) travels as one array
            # literal (``array_literal``), the others as lists.
            arrays = tuple(array_literal(values, binary) or values for values in columns)
            literal = tuple(array.__class__ is str for array in arrays)
            statement = info.cached(("driver", kind, order, True, binary, literal), lambda: _driver_statement(
                connection.dialect, info, kind, order, casts, binary, literal))
            return statement, arrays
    statement = info.cached(("driver", kind, order, False),
                            lambda: _driver_statement(connection.dialect, info, kind, order, None))
    rows = list(zip(*columns))
    if kind == "update":        # SET values first, then the key
        width = len(info.key_columns)
        rows = [row[width:] + row[:width] for row in rows]
    return statement, rows if len(rows) > 1 else rows[0]


def array_literal(values: Sequence[object], binary: bool) -> str | None:
    """``values`` as one PostgreSQL array literal (text, read through the parameter's cast: ``%s::bigint[]``,
    ``CAST(:keys AS integer[])``) if all are exact ``int`` (``{1,-2,3}``), or exact ``float`` or None (each
    ``repr``: what the driver writes), or, unless ``binary``, exact ``str`` without NUL (each quoted, ``\\`` and
    ``"`` escaped, over the joined column); else None (the driver's path: ``bool``, a subclass of ``int``,
    included).  The driver's own array dumper costs a Python call and a test per element (a regular expression per
    text element), where this is one ``join`` in C; the literal stores what the list would have stored: decimal
    digits and ``repr`` are exact, and the values have passed the column's checks (``TableInfo.check_value``), so
    no element is refused that the list would have taken."""
    kinds = set(map(type, values))
    if kinds == _INT_ONLY:
        return "{" + ",".join(map(str, values)) + "}"
    if float in kinds and kinds <= _FLOAT_OR_NONE:     # (no float's repr holds "None")
        return "{" + ",".join(map(repr, values)).replace("None", "NULL") + "}"
    if binary or kinds != _STR_ONLY:
        return None
    joined = "\x00".join(values)    # type: ignore[arg-type]  # (exact str)
    if joined.count("\x00") != len(values) - 1:
        return None
    return '{"' + joined.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", '","') + '"}'


_INT_ONLY, _FLOAT_OR_NONE, _STR_ONLY = {int}, {float, type(None)}, {str}
_INT_OR_NONE, _STR_OR_NONE = {int, type(None)}, {str, type(None)}


def _uniform(values: Sequence[object]) -> bool:
    """True if the driver can send ``values`` as one array: one Python type (and, for datetimes and times,
    all naive or all aware — they are different PostgreSQL types); ``None`` goes with anything."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if len(kinds) > 1:
        return False
    if kinds and next(iter(kinds)) in (datetime.datetime, datetime.time):
        return len({value.tzinfo is None for value in values if value is not None}) <= 1  # type: ignore[attr-defined]
    return True


#: Array element types sent in the driver's binary format (``%b``) when the statement is bound on the server:
#: the same dumper of each element, but no text array around it — whose every ``"`` and ``\\`` inside the JSON
#: the driver escapes one by one in Python, and every element of which it tests with a regular expression for
#: quoting.  Integers and strings too: a write set's key and counter columns.  Each element goes through the same dumper as
#: before; values are checked against the column's type and range before they reach a write set, so no bool,
#: float or out-of-range int travels in an integer array.
BINARY_ARRAYS = frozenset({"JSON", "JSONB", "BIGINT", "INTEGER", "SMALLINT", "TEXT", "VARCHAR"})


def _driver_statement(dialect: sa.Dialect, info: TableInfo, kind: str, order: tuple[str, ...],
                      casts: tuple[str, ...] | None, binary: bool = False, literal: tuple[bool, ...] = ()) -> str:
    """The SQL text of one batched statement for psycopg (``%s`` parameters): over ``unnest`` of one array
    per column (``casts`` the arrays' types; ``binary``: those in :data:`BINARY_ARRAYS` as ``%b``, except the
    columns ``literal`` marks, which come as one array literal in text: ``array_literal``) or, if ``casts`` is None,
    one row's parameters."""
    quote = dialect.identifier_preparer.quote
    # (The preparer's identifiers come with ``%`` doubled already: the dialect's paramstyle is ``pyformat``.)
    table = dialect.identifier_preparer.format_table(info.table)
    names = [quote(name) for name in order]
    width = len(info.key_columns)
    keys, values = names[:width], names[width:]
    # A key GENERATED ALWAYS AS IDENTITY: the keys inserted are the identity's own values, drawn from its sequence
    # (``TableInfo.always_generated``); a write never upserts such a table (``apply_write_set``).
    overriding = " OVERRIDING SYSTEM VALUE" if info.always_generated else ""
    if casts is not None:
        aliases = [f"c{index}" for index in range(len(order))]
        arrays = [f"%b::{cast}[]" if binary and cast in BINARY_ARRAYS and not text else f"%s::{cast}[]"
                  for cast, text in zip(casts, literal)]
        source = f"unnest({', '.join(arrays)}) AS v({', '.join(aliases)})"
        match = " AND ".join(f"{table}.{key} = v.{alias}" for key, alias in zip(keys, aliases))
        if kind == "delete":
            return f"DELETE FROM {table} USING {source} WHERE {match}"
        if kind == "update":
            assignments = ", ".join(f"{name} = v.{alias}" for name, alias in zip(values, aliases[width:]))
            return f"UPDATE {table} SET {assignments} FROM {source} WHERE {match}"
        head = f"INSERT INTO {table} ({', '.join(names)}){overriding} SELECT * FROM {source}"
    else:
        match = " AND ".join(f"{key} = {info.parameter(name)}" for key, name in zip(keys, order))
        if kind == "delete":
            return f"DELETE FROM {table} WHERE {match}"
        if kind == "update":
            return f"UPDATE {table} SET {', '.join(f'{name} = %s' for name in values)} WHERE {match}"
        head = f"INSERT INTO {table} ({', '.join(names)}){overriding} VALUES ({', '.join(['%s'] * len(names))})"
    if kind == "insert":
        return head
    if values:
        return (f"{head} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
                f"{', '.join(f'{name} = EXCLUDED.{name}' for name in values)}")
    return f"{head} ON CONFLICT ({', '.join(keys)}) DO NOTHING"


def detached_connection(engine: sa.Engine) -> "psycopg.Connection[TupleRow]":
    """A session of its own for session-level advisory locks (and ``LISTEN``): made by ``engine`` — its URL,
    ``connect_args`` and ``connect_timeout``, as every other connection — then detached from its pool (never given
    back: :func:`close_detached` ends it), with what the dialect's first queries left open rolled back, in autocommit."""
    pooled = engine.raw_connection()
    connection: "psycopg.Connection[TupleRow] | None" = pooled.driver_connection   # (read before the detach)
    pooled.detach()
    assert connection is not None
    try:
        connection.rollback()
        connection.autocommit = True
    except BaseException:
        with contextlib.suppress(Exception):
            connection.close()
        raise
    return connection


def close_detached(connection: "psycopg.Connection[TupleRow]") -> None:
    """End a :func:`detached_connection`'s session, its advisory locks released first — closing alone ends the
    backend, and so its locks, only some time after this returns.  A broken connection: nothing to release."""
    with contextlib.suppress(Exception):
        connection.execute("SELECT pg_advisory_unlock_all()")
    with contextlib.suppress(Exception):
        connection.close()
