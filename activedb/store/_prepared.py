"""Statements prepared on the server for query strings bound on the client: :func:`execute` sends ``PREPARE name
AS …`` in the string of a statement's first use on a connection and ``EXECUTE name(literals)`` afterwards; the
registry of a connection's prepared names lives in its DBAPI connection's ``info``, is made suspect by a rollback
(:func:`watch`) or a new connection and then checked against the server.  Why, and when the registry may be wrong
(SQLSTATE 26000, 0A000): the store's ``README.md``, "Prepared statements".

Thread-safety: none needed; a connection is used by one thread at a time, and so is its registry.
"""

from __future__ import annotations

import itertools
import re

import sqlalchemy as sa
import psycopg
from psycopg import ClientCursor
from psycopg.rows import TupleRow

from activedb.errors import FEATURE_NOT_SUPPORTED, INVALID_SQL_STATEMENT_NAME

#: Statements kept prepared per connection; the oldest is deallocated when a new one would exceed it.
KEPT = 64
_INFO_KEY = "activedb.prepared"
_NAMES = itertools.count(1)
_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)
#: invalid_sql_statement_name (the statement is gone); feature_not_supported (its result type changed)
GONE, STALE = INVALID_SQL_STATEMENT_NAME, FEATURE_NOT_SUPPORTED


class _Registry:
    """The statements prepared on one connection: ``names`` statement (driver SQL) → name, oldest first;
    ``suspect``: a rollback may have deallocated them; ``drop``: names to deallocate with the next string."""

    __slots__ = ("names", "suspect", "drop")

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.suspect = False
        self.drop: list[str] = []


def watch(connection: sa.Connection) -> None:
    """Keep ``connection``'s registry right across rollbacks: call once when it is checked out of the pool
    for use with :func:`execute` (what it prepared in an earlier checkout is checked before its next use)."""
    registry = connection.info.get(_INFO_KEY)
    if registry is not None:
        registry.suspect = True
    sa.event.listen(connection, "rollback", rolled_back)
    sa.event.listen(connection, "rollback_savepoint", _rolled_back_to_savepoint)


def rolled_back(connection: sa.Connection) -> None:
    """``connection`` was (or is about to be) rolled back: its registry is checked before its next use.  (An
    invalidated one is discarded, its session and registry with it.)"""
    if connection.invalidated:
        return
    registry = connection.info.get(_INFO_KEY)
    if registry is not None:
        registry.suspect = True


def _rolled_back_to_savepoint(connection: sa.Connection, name: str, context: object) -> None:
    rolled_back(connection)


def server_sql(statement: str) -> str:
    """``statement`` (driver SQL with ``%s`` parameters) with ``$1``, ``$2``, … for its parameters, as ``PREPARE``
    takes it; ``%%`` stays (the whole string still goes through the driver's placeholders)."""
    numbers = itertools.count(1)

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%%"
        if match.group(1) == "s":
            return f"${next(numbers)}"
        raise ValueError(f"prepared statements take %s parameters only, got %{match.group(1)} in {statement!r}")

    return _PLACEHOLDER.sub(replace, statement)


def execute(connection: sa.Connection, statement: str, parameters: tuple[object, ...], *,
            before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> ClientCursor[TupleRow]:
    """Send ``before``'s statements, ``statement`` (driver SQL, ``%s`` parameters) with ``parameters`` bound on the
    client, and ``after``'s, as one query string on ``connection``'s driver; ``statement`` runs prepared on the
    server (prepared now if it was not).  Returns the driver's cursor at ``statement``'s result.  Without the
    driver's own prepared statements (``prepare_threshold=None``, e.g. behind a pooler in transaction mode)
    nothing is prepared.  Raises the driver's errors."""
    driver: psycopg.Connection[TupleRow] = connection.connection.driver_connection  # type: ignore[assignment]
    if driver.prepare_threshold is None:
        cursor = ClientCursor(driver)
        cursor.execute("; ".join((*before, statement, *after)), parameters)
        for _ in before:
            cursor.nextset()
        return cursor
    info = connection.info
    registry = info.get(_INFO_KEY)
    if registry is None:
        registry = info[_INFO_KEY] = _Registry()
    if registry.suspect:
        _check(driver, registry)
    prefix = [f"DEALLOCATE {name}" for name in registry.drop]
    name = registry.names.get(statement)
    new = name is None
    if new:
        name = f"activedb_{next(_NAMES)}"
        while registry.names and len(registry.names) >= KEPT:
            prefix.append(f"DEALLOCATE {registry.names.pop(next(iter(registry.names)))}")
        prefix.append(f"PREPARE {name} AS {server_sql(statement)}")
    call = f"EXECUTE {name}({', '.join(['%s'] * len(parameters))})" if parameters else f"EXECUTE {name}"
    cursor = ClientCursor(driver)
    try:
        cursor.execute("; ".join((*prefix, *before, call, *after)), parameters)
    except driver.Error as error:
        if prefix:
            registry.suspect = True          # which of the string's statements ran is unknown: ask the server
        else:
            sqlstate = getattr(error, "sqlstate", None)
            if sqlstate == GONE:
                registry.names.pop(statement, None)
                registry.suspect = True
            elif sqlstate == STALE:
                registry.drop.append(registry.names.pop(statement))
        raise
    registry.drop = []
    if new:
        registry.names[statement] = name  # type: ignore[assignment]  # (made above when new)
    for _ in range(len(prefix) + len(before)):
        cursor.nextset()
    return cursor


def _check(driver: psycopg.Connection[TupleRow], registry: _Registry) -> None:
    """Keep the names the server still has; deallocate with the next string those it has that are not kept."""
    kept = {row[0] for row in driver.execute(
        "SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'activedb_')").fetchall()}
    registry.names = {statement: name for statement, name in registry.names.items() if name in kept}
    registry.drop = sorted(kept - set(registry.names.values()))
    registry.suspect = False


def prepared_names(connection: sa.Connection) -> dict[str, str]:
    """The statements :func:`execute` believes prepared on ``connection`` (statement → name): for tests and
    diagnostics."""
    registry = connection.info.get(_INFO_KEY)
    return dict(registry.names) if registry is not None else {}
